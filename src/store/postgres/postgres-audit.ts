import { AUDIT_INSERT, AUDIT_PARAM_COUNT, type AuditRecord, auditParams } from "../admin-rows.ts";
import type { Client } from "./postgres-connection.ts";

const INSERT_AUDIT = `${AUDIT_INSERT} VALUES (${Array.from({ length: AUDIT_PARAM_COUNT }, (_, i) => `$${i + 1}`).join(", ")})`;

/** Appends one audit entry, in the transaction of the change it records. */
export async function insertAudit(c: Client, entry: AuditRecord): Promise<void> {
  await c.query(INSERT_AUDIT, auditParams(entry));
}
