/**
 * /readyz through a real listening gateway: its database part is a write check (a read-only SQLite connection is
 * found out, though it reads fine), run at most once a second whatever the number of probes (by the store); its models part never
 * shows what a model service said (that goes to the log, once per change).
 */
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { describe, test } from "node:test";
import pino from "pino";
import type { SqliteStore } from "../../src/store/sqlite/sqlite-store.ts";
import type { WriteCheck } from "../../src/store/store.ts";
import { startGateway } from "../support/gateway-harness.ts";

function capture(): { lines: Array<Record<string, unknown>>; logger: pino.Logger } {
  const lines: Array<Record<string, unknown>> = [];
  return { lines, logger: pino({ level: "info" }, { write: (text: string) => void lines.push(JSON.parse(text)) }) };
}

async function readyz(url: string): Promise<{ status: number; text: string; checks: { database: string; models: string } }> {
  const res = await fetch(`${url}/readyz`);
  const text = await res.text();
  return { status: res.status, text, checks: (JSON.parse(text) as { checks: { database: string; models: string } }).checks };
}

describe("/readyz", () => {
  test("probes share one write check: many at once cost the database one check, and all get its answer", async () => {
    const gw = await startGateway();
    try {
      // The write check's transaction on the serving connection (nothing else writes during the probes).
      const db = (gw.store as SqliteStore).db;
      const exec = db.exec.bind(db);
      let checks = 0;
      db.exec = (sql: string) => {
        if (sql === "BEGIN IMMEDIATE") checks++;
        return exec(sql);
      };
      const answers = await Promise.all(Array.from({ length: 20 }, () => readyz(gw.url)));
      assert.deepEqual(new Set(answers.map((a) => `${a.status} ${a.checks.database}`)), new Set(["200 ok"]));
      assert.ok(checks >= 1 && checks <= 2, `${checks} write checks for 20 probes`);
    } finally {
      await gw.close();
    }
  });

  test("each state of the write check is named in fixed words, 503; the driver's words only in the log, once per change", async () => {
    const log = capture();
    const gw = await startGateway({ loggerInstance: log.logger });
    try {
      const store = gw.store as { checkWritable?: () => Promise<WriteCheck> };
      const states: Array<[WriteCheck["state"], string]> = [
        ["read_only", "database read-only"],
        ["disk_full", "database disk full"],
        ["cannot_write", "database cannot be written"],
        ["unavailable", "database unavailable"],
      ];
      for (const [state, words] of states) {
        store.checkWritable = async () => ({ state, reason: `driver says ${state} at /secret/path` });
        // The previous result is kept for up to a second: wait for this one.
        for (;;) {
          const r = await readyz(gw.url);
          if (r.checks.database !== words) {
            await new Promise((resolve) => setTimeout(resolve, 50));
            continue;
          }
          assert.equal(r.status, 503);
          assert.doesNotMatch(r.text, /driver says|secret/);
          break;
        }
      }
      const warned = log.lines.filter((l) => l.component === "readiness" && l.level === 40);
      assert.deepEqual(
        warned.map((w) => w.reason),
        states.map(([state]) => `driver says ${state} at /secret/path`),
        "one warning per change, with the driver's words",
      );
    } finally {
      await gw.close();
    }
  });

  test("a model service that fails its list: the gateway's fixed words, never the service's own", async () => {
    const upstream: Server = createServer((_req, res) => {
      res.writeHead(500, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: "pool exhausted: postgres://svc:hunter2@10.9.8.7/models" }));
    });
    await new Promise<void>((resolve) => upstream.listen(0, "127.0.0.1", resolve));
    const port = (upstream.address() as AddressInfo).port;
    const log = capture();
    const gw = await startGateway({ fake: false, env: { TDS_MODEL_SERVICE_URL: `http://127.0.0.1:${port}` }, loggerInstance: log.logger });
    try {
      for (let i = 0; i < 3; i++) {
        const r = await readyz(gw.url);
        assert.equal(r.status, 503);
        assert.equal(r.checks.database, "ok");
        assert.match(r.checks.models, /^The model service .*5xx/);
        assert.doesNotMatch(r.text, /hunter2|10\.9\.8\.7|pool exhausted/);
      }
      const warned = log.lines.filter((l) => l.component === "readiness" && l.level === 40);
      assert.equal(warned.length, 1, "logged once, not at every probe");
      assert.match(String(warned[0]!.reason), /pool exhausted/);
    } finally {
      await gw.close();
      await new Promise((resolve) => upstream.close(resolve));
    }
  });
});
