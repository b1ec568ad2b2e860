/**
 * API keys and audit entries as the service wrote them before migration 013 (no key settings; audit actions without
 * 'key.updated' and 'key.rotated'), and what must hold after it: the migration tests of both databases.
 */
import assert from "node:assert/strict";
import { hashApiKey } from "../../src/domain/api-keys.ts";
import type { AuditEntry } from "../../src/domain/audit.ts";
import { nameKey } from "../../src/domain/name-key.ts";
import type { ApiKeyRecord } from "../../src/domain/organizations.ts";
import type { Store } from "../../src/store/store.ts";
import { T0 } from "../store/store-contract.ts";

/**
 * org_1 with k1 (named, in use) and k2 (unnamed, revoked), and the four audit entries of their making: ids 1 to 4.
 * `bool` writes a boolean in the dialect.
 */
export function keyRowsBefore013(bool: (b: boolean) => string): string {
  return `
  INSERT INTO organizations (id, name, paused, created_at_ms, name_key) VALUES ('org_1', 'Acme', ${bool(false)}, 1, '${nameKey("Acme")}');
  INSERT INTO api_keys (id, org_id, name, hash, created_at_ms, revoked_at_ms) VALUES
    ('k1', 'org_1', 'ci', '${hashApiKey("raw-k1")}', ${T0}, NULL),
    ('k2', 'org_1', NULL, '${hashApiKey("raw-k2")}', ${T0 + 1}, ${T0 + 2});
  INSERT INTO admin_audit (created_at_ms, action, org_id, target_id, source, client, remote_address, details) VALUES
    (1, 'organization.created', 'org_1', 'org_1', 'cli', NULL, NULL, '{"name":"Acme"}'),
    (${T0}, 'key.created', 'org_1', 'k1', 'http', 'console', '127.0.0.1', '{"name":"ci"}'),
    (${T0 + 1}, 'key.created', 'org_1', 'k2', 'cli', NULL, NULL, '{"name":null}'),
    (${T0 + 2}, 'key.revoked', 'org_1', 'k2', 'cli', NULL, NULL, '{"name":null}');
  `;
}

/** An audit row with `action`, for raw inserts that the schema accepts or refuses. */
export function auditRowWithAction(action: string): string {
  return `INSERT INTO admin_audit (created_at_ms, action, org_id, target_id, source, client, remote_address, details)
    VALUES (${T0 + 3}, '${action}', 'org_1', 'k1', 'cli', NULL, NULL, '{}')`;
}

const NO_SETTINGS_YET = {
  expiresAtMs: null,
  models: null,
  requestsPerMinute: null,
  budget: null,
  replacedBy: null,
  retiresAtMs: null,
  lastUsedAtMs: null,
};

export const K1_AFTER_013: ApiKeyRecord = {
  id: "k1",
  orgId: "org_1",
  lineageId: "k1",
  name: "ci",
  hash: hashApiKey("raw-k1"),
  createdAtMs: T0,
  revokedAtMs: null,
  ...NO_SETTINGS_YET,
};

export const K2_AFTER_013: ApiKeyRecord = {
  id: "k2",
  orgId: "org_1",
  lineageId: "k2",
  name: null,
  hash: hashApiKey("raw-k2"),
  createdAtMs: T0 + 1,
  revokedAtMs: T0 + 2,
  ...NO_SETTINGS_YET,
};

const cli = { source: "cli", client: null, remoteAddress: null } as const;

/** The entries written before 013, newest first, with their ids. */
export const AUDIT_BEFORE_013: AuditEntry[] = [
  { id: 4, atMs: T0 + 2, action: "key.revoked", orgId: "org_1", targetId: "k2", ...cli, details: { name: null } },
  { id: 3, atMs: T0 + 1, action: "key.created", orgId: "org_1", targetId: "k2", ...cli, details: { name: null } },
  {
    id: 2,
    atMs: T0,
    action: "key.created",
    orgId: "org_1",
    targetId: "k1",
    source: "http",
    client: "console",
    remoteAddress: "127.0.0.1",
    details: { name: "ci" },
  },
  { id: 1, atMs: 1, action: "organization.created", orgId: "org_1", targetId: "org_1", ...cli, details: { name: "Acme" } },
];

/**
 * After 013: the keys as they were with no settings of their own, the audit entries with their ids, and a key
 * update recorded as 'key.updated' with the next id (`nextId`: PostgreSQL's sequence also counts refused inserts).
 */
export async function checkKeysAfter013(store: Store, nextId = 5): Promise<void> {
  const org = { id: "org_1", name: "Acme", paused: false, createdAtMs: 1 };
  assert.deepEqual(await store.findApiKey("k1"), { key: K1_AFTER_013, org });
  assert.deepEqual(await store.findApiKey("k2"), { key: K2_AFTER_013, org });
  assert.deepEqual(await store.listApiKeys("org_1"), [K1_AFTER_013, K2_AFTER_013]);
  assert.deepEqual(await store.listAudit({ limit: 10 }), { entries: AUDIT_BEFORE_013, nextCursor: null });
  assert.deepEqual(await store.keySpend("k1", "2026-01"), { reservedMicrousd: 0, spentMicrousd: 0 });

  const updated = await store.updateApiKey({ keyId: "k1", changes: { requestsPerMinute: 5 }, nowMs: T0 + 10, audit: cli });
  assert.deepEqual(updated, { ...K1_AFTER_013, requestsPerMinute: 5 });
  assert.deepEqual(await store.listAudit({ limit: 10 }), {
    entries: [
      { id: nextId, atMs: T0 + 10, action: "key.updated", orgId: "org_1", targetId: "k1", ...cli, details: { requests_per_minute: 5 } },
      ...AUDIT_BEFORE_013,
    ],
    nextCursor: null,
  });
}
