import { type AuditRecord, auditParams, INSERT_AUDIT } from "../admin-rows.ts";
import { postgres } from "../schema/table.ts";
import type { Client } from "./postgres-connection.ts";

const INSERT = postgres.numbered(INSERT_AUDIT);

/** Appends one audit entry, in the transaction of the change it records. */
export async function insertAudit(c: Client, entry: AuditRecord): Promise<void> {
  await c.query(INSERT, auditParams(entry));
}
