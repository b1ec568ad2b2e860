/**
 * Organization names that could pass for another one are refused, through a real listening gateway's admin API on
 * SQLite and on PostgreSQL: invisible formatting characters (zero-width, bidirectional overrides) → 422 with the
 * field's error; a name equal to another regardless of case or width → 409 name_taken, also for simultaneous
 * creations; names are stored in NFC. A database that already holds names differing only in case still starts and
 * serves both (real server processes).
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import pg from "pg";
import { openStore } from "../../src/store/open-store.ts";
import type { SqliteStore } from "../../src/store/sqlite/sqlite-store.ts";
import { type Gateway, startGateway } from "../support/gateway-harness.ts";
import { startGatewayProcess } from "../support/gateway-process.ts";
import { createTestDatabase } from "../support/postgres-db.ts";

const ADMIN_TOKEN = "adm-names-6Wq1Zx8Lr3Tk9Nv2Bc5Hs7Pd";

interface Answer {
  status: number;
  json: { [key: string]: any };
}

async function admin(url: string, method: string, path: string, body?: unknown): Promise<Answer> {
  const res = await fetch(`${url}/admin/v1${path}`, {
    method,
    headers: { authorization: `Bearer ${ADMIN_TOKEN}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  return { status: res.status, json: (await res.json()) as Answer["json"] };
}

const create = (url: string, name: string) => admin(url, "POST", "/organizations", { name });

for (const dialect of ["sqlite", "postgres"] as const) {
  describe(`organization names on ${dialect}`, () => {
    let gw: Gateway;
    let drop: (() => Promise<void>) | null = null;

    before(async () => {
      const env: Record<string, string> = { TDS_ADMIN_TOKEN: ADMIN_TOKEN };
      if (dialect === "postgres") {
        const db = await createTestDatabase("tds_names");
        env.TDS_DATABASE_URL = db.url;
        drop = db.drop;
      }
      gw = await startGateway({ fake: false, env });
    });
    after(async () => {
      await gw.close();
      await drop?.();
    });

    it("refuses invisible formatting characters with 422 and the field's error", async () => {
      assert.equal((await create(gw.url, "default")).status, 201);
      for (const name of ["default\u200b", "\u202egnp.exe", "de\u200dfault", "a\u2066b\u2069", "\ufeffx\ufeffy", "x\u00ady"]) {
        const answer = await create(gw.url, name);
        assert.equal(answer.status, 422, JSON.stringify(name));
        assert.deepEqual(answer.json.errors, [
          { field: "name", message: "must not contain invisible formatting characters (zero-width or bidirectional controls)" },
        ]);
        assert.match(answer.json.detail, /^Invalid request body: name: must not contain invisible formatting characters/);
      }
      const control = await create(gw.url, "a\u0007b");
      assert.equal(control.status, 422);
      assert.deepEqual(control.json.errors, [{ field: "name", message: "must not contain control characters" }]);
    });

    it("refuses a name equal to another regardless of case or width with 409 name_taken", async () => {
      for (const name of ["DEFAULT", "Default", "ｄｅｆａｕｌｔ", " DEFAULT "]) {
        const answer = await create(gw.url, name);
        assert.equal(answer.status, 409, JSON.stringify(name));
        assert.deepEqual(answer.json.errors, [{ field: "name", message: "is already in use" }]);
        assert.equal(answer.json.detail, 'An organization named "default" already exists (names are unique regardless of case).');
      }
      const exact = await create(gw.url, "default");
      assert.equal(exact.status, 409);
      assert.equal(exact.json.detail, 'An organization named "default" already exists.');
    });

    it("stores names in NFC; a decomposed spelling is the same name", async () => {
      const decomposed = await create(gw.url, "E\u0301cole");
      assert.equal(decomposed.status, 201);
      assert.equal(decomposed.json.name, "\u00c9cole");
      assert.equal((await create(gw.url, "\u00e9cole")).status, 409);
      assert.equal((await admin(gw.url, "GET", `/organizations/${encodeURIComponent("\u00c9cole")}`)).status, 200);
      const emoji = await create(gw.url, "Team 👩‍💻 Zürich");
      assert.equal(emoji.status, 201, "the joiner inside an emoji sequence is allowed");
      assert.equal((await create(gw.url, "team 👩‍💻 zürich")).status, 409);
    });

    it("lets exactly one of simultaneous look-alike creations through", async () => {
      const answers = await Promise.all(["Acme", "ACME", "acme", "AcMe", "ａｃｍｅ", "Acme"].map((n) => create(gw.url, n)));
      assert.deepEqual(answers.map((a) => a.status).sort(), [201, 409, 409, 409, 409, 409]);
    });
  });
}

describe("names stored before the rule that differ only in case", () => {
  let dir: string;
  let drop: (() => Promise<void>) | null = null;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), "tds-names-"));
  });
  after(async () => {
    rmSync(dir, { recursive: true, force: true });
    await drop?.();
  });

  for (const dialect of ["sqlite", "postgres"] as const) {
    it(`do not stop a ${dialect} gateway from starting; both are served and a third spelling is refused`, async () => {
      let url = `sqlite:${join(dir, "legacy.sqlite")}`;
      if (dialect === "postgres") {
        const db = await createTestDatabase("tds_names_legacy");
        url = db.url;
        drop = db.drop;
      }
      const store = await openStore(url);
      const insert = "INSERT INTO organizations (id, name, paused, created_at_ms) VALUES ";
      if (dialect === "sqlite") {
        (store as SqliteStore).db.exec(`${insert} ('org_legacy00001', 'Dup', 0, 1), ('org_legacy00002', 'DUP', 0, 2)`);
      } else {
        const client = new pg.Client({ connectionString: url });
        await client.connect();
        await client.query(`${insert} ('org_legacy00001', 'Dup', false, 1), ('org_legacy00002', 'DUP', false, 2)`);
        await client.end();
      }
      await store.close();

      const gateway = await startGatewayProcess({
        TDS_DATABASE_URL: url,
        TDS_ADMIN_TOKEN: ADMIN_TOKEN,
        TDS_MODEL_SERVICE_URL: "http://127.0.0.1:9",
      });
      try {
        const listed = await admin(gateway.url, "GET", "/organizations");
        assert.equal(listed.status, 200);
        assert.deepEqual(
          listed.json.data.map((o: { name: string }) => o.name),
          ["Dup", "DUP"],
        );
        assert.equal((await admin(gateway.url, "GET", "/organizations/DUP")).json.id, "org_legacy00002", "lookups stay exact");
        assert.equal((await admin(gateway.url, "GET", "/organizations/Dup")).json.id, "org_legacy00001");
        assert.equal((await create(gateway.url, "dup")).status, 409);
      } finally {
        await gateway.stop();
      }
    });
  }
});
