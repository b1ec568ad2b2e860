import { ADMIN_IDEMPOTENCY_TTL_MS, type AuditAction, type AuditActor, type AuditEntry, type UsageSums } from "./administration.ts";
import { checkGrant, type GrantInput } from "./bookkeeping/books.ts";
import { checkEpochMs, checkText } from "./input-checks.ts";
import type { Balance, Organization } from "./store.ts";
import { StoreInputError } from "./store-errors.ts";
import { badCursor, decodeCursorText, encodeCursorText } from "./usage-cursor.ts";
import { DAY_MS } from "./usage-daily-rows.ts";

/**
 * The rows, cursors and checks of the administration tables (admin_audit, admin_idempotency) and pages, the same
 * in every dialect: the adapters only run the SQL.
 */

// ── audit entries ──

/** One audit entry to write, in the transaction of the change it records. */
export interface AuditRecord {
  action: AuditAction;
  orgId: string;
  targetId: string;
  actor: AuditActor;
  atMs: number;
  details: AuditEntry["details"];
}

/** The INSERT of one entry, without its VALUES clause (the placeholders differ by dialect); parameters from `auditParams`. */
export const AUDIT_INSERT = "INSERT INTO admin_audit (created_at_ms, action, org_id, target_id, source, client, remote_address, details)";
export const AUDIT_PARAM_COUNT = 8;

export function auditParams(r: AuditRecord): unknown[] {
  return [r.atMs, r.action, r.orgId, r.targetId, r.actor.source, r.actor.client, r.actor.remoteAddress, JSON.stringify(r.details)];
}

/** The entries each audited change writes. Only names, amounts and notes: never a key or its hash. */
export const audits = {
  organizationCreated: (org: { id: string; name: string }, actor: AuditActor, atMs: number): AuditRecord => ({
    action: "organization.created",
    orgId: org.id,
    targetId: org.id,
    actor,
    atMs,
    details: { name: org.name },
  }),
  pauseChanged: (orgId: string, paused: boolean, actor: AuditActor, atMs: number): AuditRecord => ({
    action: paused ? "organization.paused" : "organization.resumed",
    orgId,
    targetId: orgId,
    actor,
    atMs,
    details: {},
  }),
  keyCreated: (key: { id: string; orgId: string; name: string | null }, actor: AuditActor, atMs: number): AuditRecord => ({
    action: "key.created",
    orgId: key.orgId,
    targetId: key.id,
    actor,
    atMs,
    details: { name: key.name },
  }),
  keyRevoked: (key: { id: string; orgId: string; name: string | null }, actor: AuditActor, atMs: number): AuditRecord => ({
    action: "key.revoked",
    orgId: key.orgId,
    targetId: key.id,
    actor,
    atMs,
    details: { name: key.name },
  }),
  creditsGranted: (grant: GrantInput, actor: AuditActor): AuditRecord => ({
    action: "credits.granted",
    orgId: grant.orgId,
    targetId: grant.orgId,
    actor,
    atMs: grant.nowMs,
    details: { amount_microusd: grant.amountMicrousd, note: grant.note ?? null },
  }),
};

const SOURCES: readonly AuditActor["source"][] = ["cli", "http"];

/** An audit actor, when given: throws StoreInputError (field `audit`) before anything is written. */
export function checkAudit(actor: AuditActor | undefined, field = "audit"): void {
  if (actor === undefined) return;
  const optionalText = (v: unknown) => v === null || typeof v === "string";
  if (
    typeof actor !== "object" ||
    actor === null ||
    !SOURCES.includes(actor.source) ||
    !optionalText(actor.client) ||
    !optionalText(actor.remoteAddress)
  ) {
    throw new StoreInputError(`${field} must name a source (${SOURCES.join(" or ")}), a client and a remote address (text or null)`, field);
  }
}

/** The pause audit argument, when given. */
export function checkPauseAudit(audit: { actor: AuditActor; nowMs: number } | undefined): void {
  if (audit === undefined) return;
  checkAudit(audit.actor, "audit.actor");
  checkEpochMs(audit.nowMs, "audit.nowMs");
}

export const AUDIT_COLUMNS = "id, created_at_ms, action, org_id, target_id, source, client, remote_address, details";

export interface AuditRow {
  id: number;
  created_at_ms: number;
  action: AuditAction;
  org_id: string;
  target_id: string;
  source: AuditActor["source"];
  client: string | null;
  remote_address: string | null;
  details: string;
}

export function toAuditEntry(row: AuditRow): AuditEntry {
  return {
    id: row.id,
    atMs: row.created_at_ms,
    action: row.action,
    orgId: row.org_id,
    targetId: row.target_id,
    source: row.source,
    client: row.client,
    remoteAddress: row.remote_address,
    details: JSON.parse(row.details) as AuditEntry["details"],
  };
}

// ── pages ──

export const MAX_ADMIN_PAGE = 200;

export function checkPageLimit(limit: number): void {
  if (typeof limit !== "number" || !Number.isInteger(limit) || limit < 1 || limit > MAX_ADMIN_PAGE) {
    throw new StoreInputError(`limit must be a whole number from 1 to ${MAX_ADMIN_PAGE}`, "limit");
  }
}

/** The audit cursor: the id of the last entry of a page (opaque to callers). */
export function encodeAuditCursor(id: number): string {
  return encodeCursorText(`audit:${id}`);
}

/** Throws StoreInputError (field `cursor`) for anything encodeAuditCursor could not have produced. */
export function decodeAuditCursor(text: string): number {
  const match = /^audit:([1-9][0-9]{0,15})$/.exec(decodeCursorText(text));
  const id = Number(match?.[1]);
  if (!match || !Number.isSafeInteger(id)) throw badCursor();
  return id;
}

/** The organization cursor: the position (createdAtMs, id) of the last organization of a page. */
export function encodeOrganizationCursor(org: Organization): string {
  return encodeCursorText(`org:${org.createdAtMs}:${org.id}`);
}

/** Throws StoreInputError (field `cursor`) for anything encodeOrganizationCursor could not have produced. */
export function decodeOrganizationCursor(text: string): { createdAtMs: number; id: string } {
  const match = /^org:(0|[1-9][0-9]{0,15}):(.+)$/s.exec(decodeCursorText(text));
  const createdAtMs = Number(match?.[1]);
  if (!match || !Number.isSafeInteger(createdAtMs)) throw badCursor();
  return { createdAtMs, id: match[2]! };
}

/** A page of `limit` rows from the `limit + 1` read, and the cursor of its last row when more follow. */
export function pageOf<R, T>(
  rows: R[],
  limit: number,
  map: (row: R) => T,
  cursorOf: (last: T) => string,
): { items: T[]; nextCursor: string | null } {
  const more = rows.length > limit;
  const items = (more ? rows.slice(0, limit) : rows).map(map);
  const last = items[items.length - 1];
  return { items, nextCursor: more && last !== undefined ? cursorOf(last) : null };
}

// ── usage totals ──

export { DAY_MS };

export interface UsageTotalsQuery {
  fromMs: number;
  toMs: number;
  orgId?: string;
}

/** Whole UTC days: the totals are kept per day (usage_daily). */
export function checkUsageTotalsQuery(query: UsageTotalsQuery): void {
  for (const field of ["fromMs", "toMs"] as const) {
    checkEpochMs(query[field], field);
    if (query[field] < 0 || query[field] % DAY_MS !== 0)
      throw new StoreInputError(`${field} must be a UTC midnight (a multiple of ${DAY_MS} epoch milliseconds, 0 or more)`, field);
  }
  if (query.toMs < query.fromMs) throw new StoreInputError("toMs must not be before fromMs", "toMs");
  if (query.orgId !== undefined) checkText(query.orgId, "orgId");
}

/** A totals row: the sums of `dailySumColumns` (usage-daily-rows.ts). */
export interface SumsRow {
  requests: number;
  sum_input: number;
  sum_output: number;
  sum_cost: number;
}

export function toSums(row: SumsRow): UsageSums {
  return { requests: row.requests, inputTokens: row.sum_input, outputTokens: row.sum_output, costMicrousd: row.sum_cost };
}

// ── idempotent grants ──

export interface GrantOnceInput extends GrantInput {
  audit: AuditActor;
  idempotency: { key: string; requestHash: string };
}

export function checkGrantOnce(input: GrantOnceInput): void {
  checkGrant(input);
  if (input.audit === undefined) throw new StoreInputError("audit is required", "audit");
  checkAudit(input.audit);
  if (typeof input.idempotency !== "object" || input.idempotency === null)
    throw new StoreInputError("idempotency is required", "idempotency");
  checkText(input.idempotency.key, "idempotency.key");
  checkText(input.idempotency.requestHash, "idempotency.requestHash");
}

export interface AdminIdempotencyRow {
  request_hash: string;
  response: string;
  expires_at_ms: number;
}

/** What a stored entry answers at `nowMs`: null when there is none or it expired (the grant runs, replacing it). */
export function storedAnswer(
  row: AdminIdempotencyRow | undefined,
  requestHash: string,
  nowMs: number,
): { kind: "replayed"; balance: Balance } | { kind: "mismatch" } | null {
  if (!row || row.expires_at_ms <= nowMs) return null;
  return row.request_hash === requestHash ? { kind: "replayed", balance: parseBalance(row.response) } : { kind: "mismatch" };
}

/** The parameters of the entry a grant stores: key, request hash, response, created, expires. */
export function idempotencyParams(input: GrantOnceInput, balance: Balance): unknown[] {
  return [
    input.idempotency.key,
    input.idempotency.requestHash,
    JSON.stringify(balanceOf(balance)),
    input.nowMs,
    input.nowMs + ADMIN_IDEMPOTENCY_TTL_MS,
  ];
}

function parseBalance(text: string): Balance {
  return balanceOf(JSON.parse(text) as Balance);
}

function balanceOf(b: Balance): Balance {
  return { available: b.available, reserved: b.reserved, spent: b.spent, granted: b.granted };
}
