/**
 * The first start's organization and key are in the audit log, read through the real server's admin API: source
 * "cli" (a local change, like the CLI's on the database) with the client `bootstrap:` and the OS user.
 */
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { osOperator } from "../../src/admin/operator.ts";
import { keyIdOf } from "../../src/domain/api-keys.ts";
import { startGatewayProcess } from "../support/gateway-process.ts";

const ADMIN_TOKEN = "adm-bootstrap-3Hq8Zx1Lw6Nv4Bc7Rt2Ks9";

describe("the first start's bootstrap", () => {
  let dir: string;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), "tds-bootstrap-audit-"));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it("records the default organization and its first key in the audit log", async () => {
    const keyFile = join(dir, "bootstrap-key.txt");
    const gateway = await startGatewayProcess({
      TDS_DATABASE_URL: `sqlite:${join(dir, "tds.sqlite")}`,
      TDS_BOOTSTRAP: "true",
      TDS_BOOTSTRAP_KEY_FILE: keyFile,
      TDS_ADMIN_TOKEN: ADMIN_TOKEN,
      TDS_MODEL_SERVICE_URL: "http://127.0.0.1:9",
    });
    try {
      const keyId = keyIdOf(readFileSync(keyFile, "utf8").trim());
      assert.ok(keyId, "the key file holds the first key");
      const res = await fetch(`${gateway.url}/admin/v1/audit`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
      assert.equal(res.status, 200);
      const { data } = (await res.json()) as { data: Array<Record<string, unknown>> };
      const client = `bootstrap:${osOperator()}`;
      assert.deepEqual(
        data.map((e) => [e.action, e.org_name, e.source, e.client, e.remote_address, e.details]),
        [
          ["key.created", "default", "cli", client, null, { name: "bootstrap" }],
          ["organization.created", "default", "cli", client, null, { name: "default" }],
        ],
      );
      assert.equal(data[0]!.target, keyId);
      assert.equal(data[1]!.target, data[1]!.org_id);
    } finally {
      await gateway.stop();
    }
  });
});
