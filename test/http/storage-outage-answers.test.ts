/**
 * What a gateway whose database went away answers, through a real listening server: /readyz says "database
 * unavailable" (never the driver's message, which names the database) and logs the reason once per change, not at
 * every probe; /v1/models answers 503 storage_unavailable, not 500. On PostgreSQL the database is dropped under the
 * gateway; on SQLite the store is closed.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import pino from "pino";
import { ERROR_CATALOGUE } from "../../src/domain/errors.ts";
import { type Gateway, startGateway } from "../support/gateway-harness.ts";
import { createTestDatabase } from "../support/postgres-db.ts";

function capture(): { lines: Array<Record<string, unknown>>; logger: pino.Logger } {
  const lines: Array<Record<string, unknown>> = [];
  return { lines, logger: pino({ level: "info" }, { write: (text: string) => void lines.push(JSON.parse(text)) }) };
}

async function readiness(gw: Gateway): Promise<{ status: number; text: string; database: unknown }> {
  const res = await fetch(`${gw.url}/readyz`);
  const text = await res.text();
  return { status: res.status, text, database: (JSON.parse(text) as { checks: { database: unknown } }).checks.database };
}

const readinessWarnings = (lines: Array<Record<string, unknown>>) => lines.filter((l) => l.component === "readiness" && l.level === 40);

describe("a PostgreSQL database dropped under the gateway", () => {
  let gw: Gateway;
  let db: Awaited<ReturnType<typeof createTestDatabase>>;
  const log = capture();

  before(async () => {
    db = await createTestDatabase("tds_outage");
    gw = await startGateway({ env: { TDS_DATABASE_URL: db.url }, loggerInstance: log.logger });
  });
  after(async () => {
    await gw.app.close();
    await gw.store.close().catch(() => {});
    await gw.fake?.close();
    await db.drop();
  });

  it("/readyz says database unavailable without the driver's text, logging the reason once per change", async () => {
    const up = await readiness(gw);
    assert.equal(up.database, "ok");
    await db.drop();

    const probes = [];
    for (let i = 0; i < 3; i++) probes.push(await readiness(gw));
    for (const probe of probes) {
      assert.equal(probe.status, 503);
      assert.equal(probe.database, "database unavailable");
      assert.doesNotMatch(probe.text, new RegExp(`${db.name}|does not exist|terminating`));
    }
    const warned = readinessWarnings(log.lines);
    assert.ok(warned.length >= 1, "the reason is logged");
    assert.ok(
      warned.some((w) => String(w.reason).includes("does not exist")),
      `the driver's reason is in the log: ${JSON.stringify(warned)}`,
    );
    for (let i = 0; i < 5; i++) assert.equal((await readiness(gw)).database, "database unavailable");
    assert.equal(readinessWarnings(log.lines).length, warned.length, "probes of an unchanged failure log nothing more");
  });

  it("/v1/models answers 503 storage_unavailable, not 500", async () => {
    const res = await gw.get("/v1/models");
    assert.equal(res.status, 503);
    assert.deepEqual(await res.json(), { detail: ERROR_CATALOGUE.storage_unavailable.detail });
  });
});

describe("a SQLite store closed under the gateway", () => {
  let gw: Gateway;
  const log = capture();

  before(async () => {
    gw = await startGateway({ loggerInstance: log.logger });
  });
  after(async () => {
    await gw.close();
  });

  it("/v1/models answers 503 storage_unavailable and /readyz database unavailable; neither with the driver's words", async () => {
    assert.equal((await gw.get("/v1/models")).status, 200);
    await gw.store.close();
    const res = await gw.get("/v1/models");
    assert.equal(res.status, 503);
    assert.deepEqual(await res.json(), { detail: ERROR_CATALOGUE.storage_unavailable.detail });
    const probe = await readiness(gw);
    assert.equal(probe.status, 503);
    assert.equal(probe.database, "database unavailable");
    assert.doesNotMatch(probe.text, /connection is not open/);
    assert.equal(readinessWarnings(log.lines).length, 1);
    assert.match(String(readinessWarnings(log.lines)[0]!.reason), /The database connection is not open/);
  });
});
