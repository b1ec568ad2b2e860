import type { AuditAction, AuditActor, AuditEntry } from "../domain/audit.ts";
import type { Balance } from "../domain/credits.ts";
import type { KeySettings } from "../domain/organizations.ts";
import type { UsageSums } from "../domain/usage-records.ts";
import { DAY_MS } from "../domain/utc-day.ts";
import { ADMIN_IDEMPOTENCY_TTL_MS } from "./administration.ts";
import { checkGrant, type GrantInput } from "./bookkeeping/checked-writes.ts";
import { checkEpochMs, checkText } from "./input-checks.ts";
import { bigint, type DbRow, sqlite, Table, text } from "./schema/table.ts";
import { execute, query, type SqlProgram } from "./sql-program.ts";
import { StoreInputError } from "./store-errors.ts";
import { badCursor, decodeCursorText, encodeCursorText } from "./usage-cursor.ts";

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

/** An admin_audit row: an entry with its details as JSON text. */
type AuditRow = Omit<AuditEntry, "details"> & { details: string };

const auditLog = new Table<AuditRow>("admin_audit", {
  id: bigint("id"),
  atMs: bigint("created_at_ms"),
  action: text("action"),
  orgId: text("org_id"),
  targetId: text("target_id"),
  source: text("source"),
  client: text("client"),
  remoteAddress: text("remote_address"),
  details: text("details"),
});
const WRITTEN = auditLog.fieldsExcept("id");

/** The INSERT of one entry, without its VALUES clause; parameters from `auditParams`. */
/** The whole INSERT of one entry, with `?` placeholders. */
export const INSERT_AUDIT = `INSERT INTO ${auditLog.name} (${auditLog.list(WRITTEN)}) VALUES (${sqlite.placeholders(WRITTEN.length)})`;

export function auditParams(r: AuditRecord): unknown[] {
  const row: Omit<AuditRow, "id"> = {
    ...r.actor,
    atMs: r.atMs,
    action: r.action,
    orgId: r.orgId,
    targetId: r.targetId,
    details: JSON.stringify(r.details),
  };
  return WRITTEN.map((field) => row[field]);
}

/** Appends one audit entry, in the transaction of the change it records. */
export function* recordAudit(record: AuditRecord): SqlProgram<void> {
  yield* execute(INSERT_AUDIT, ...auditParams(record));
}

const entry = (
  action: AuditAction,
  orgId: string,
  targetId: string,
  details: AuditEntry["details"],
  actor: AuditActor,
  atMs: number,
): AuditRecord => ({ action, orgId, targetId, details, actor, atMs });

type KeyChanges = Partial<KeySettings> & { name?: string | null };

/**
 * A key's settings as audit details (flat): `name`, `expires_at` (ISO-8601), `models` (a JSON array as text),
 * `requests_per_minute`, `budget_microusd` with `budget_period`; each null when cleared, absent when not given.
 */
export function keySettingsDetails(changes: KeyChanges): AuditEntry["details"] {
  const details: AuditEntry["details"] = {};
  if (changes.name !== undefined) details.name = changes.name;
  if (changes.expiresAtMs !== undefined)
    details.expires_at = changes.expiresAtMs === null ? null : new Date(changes.expiresAtMs).toISOString();
  if (changes.models !== undefined) details.models = changes.models === null ? null : JSON.stringify(changes.models);
  if (changes.requestsPerMinute !== undefined) details.requests_per_minute = changes.requestsPerMinute;
  if (changes.budget !== undefined) {
    details.budget_microusd = changes.budget?.limitMicrousd ?? null;
    details.budget_period = changes.budget?.period ?? null;
  }
  return details;
}

/** The settings a key has (the ones not null), for "key.created". */
function settingsHeld(key: Partial<KeySettings>): KeyChanges {
  return Object.fromEntries(Object.entries(key).filter(([f, v]) => v !== null && v !== undefined && f in NO_SETTINGS));
}
const NO_SETTINGS: KeySettings = { expiresAtMs: null, models: null, requestsPerMinute: null, budget: null };

/** The entries each audited change writes. Only names, amounts, notes and settings: never a key or its hash. */
export const audits = {
  organizationCreated: (org: { id: string; name: string }, actor: AuditActor, atMs: number) =>
    entry("organization.created", org.id, org.id, { name: org.name }, actor, atMs),
  pauseChanged: (orgId: string, paused: boolean, actor: AuditActor, atMs: number) =>
    entry(paused ? "organization.paused" : "organization.resumed", orgId, orgId, {}, actor, atMs),
  key: (action: "key.created" | "key.revoked", key: { id: string; orgId: string; name: string | null }, actor: AuditActor, atMs: number) =>
    entry(action, key.orgId, key.id, { name: key.name }, actor, atMs),
  /** A key created with settings of its own: its name and those settings. */
  /** `rotatedFrom`: the key a rotation replaced with this one. */
  keyCreated: (
    key: { id: string; orgId: string; name: string | null } & KeySettings,
    actor: AuditActor,
    atMs: number,
    rotatedFrom?: string,
  ) =>
    entry(
      "key.created",
      key.orgId,
      key.id,
      { name: key.name, ...(rotatedFrom === undefined ? {} : { rotated_from: rotatedFrom }), ...keySettingsDetails(settingsHeld(key)) },
      actor,
      atMs,
    ),
  /** The fields an update changed, with their new values. */
  keyUpdated: (key: { id: string; orgId: string }, changed: KeyChanges, actor: AuditActor, atMs: number) =>
    entry("key.updated", key.orgId, key.id, keySettingsDetails(changed), actor, atMs),
  keyRotated: (
    old: { id: string; orgId: string; name: string | null },
    newKeyId: string,
    retiresAtMs: number,
    actor: AuditActor,
    atMs: number,
  ) =>
    entry(
      "key.rotated",
      old.orgId,
      old.id,
      { name: old.name, new_key_id: newKeyId, retires_at: new Date(retiresAtMs).toISOString() },
      actor,
      atMs,
    ),
  creditsGranted: (grant: GrantInput, actor: AuditActor) =>
    entry(
      "credits.granted",
      grant.orgId,
      grant.orgId,
      { amount_microusd: grant.amountMicrousd, note: grant.note ?? null },
      actor,
      grant.nowMs,
    ),
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

/** The audit pages: [all, one organization] × [newest first, older than the entry of a cursor]. */
const AUDIT_PAGES = ["", "WHERE id < ? ", "WHERE org_id = ? ", "WHERE org_id = ? AND id < ? "].map(
  (where) => `SELECT ${auditLog.list()} FROM ${auditLog.name} ${where}ORDER BY id DESC`,
);
/** Every statement of the audit log. */
export const AUDIT_STATEMENTS = [INSERT_AUDIT, ...AUDIT_PAGES.map(withLimit)];

/** The entries of one organization (or all), newest first, older than the entry `before` (an id from a cursor). */
export function auditPage(orgId: string | undefined, before: number | undefined, limit: number): SqlProgram<Page<AuditEntry>> {
  const sql = AUDIT_PAGES[(orgId === undefined ? 0 : 2) + (before === undefined ? 0 : 1)]!;
  const params = [orgId, before].filter((p) => p !== undefined);
  return keysetPage(sql, params, limit, toAuditEntry, (last) => encodeCursor("audit", last.id));
}

function toAuditEntry(row: DbRow): AuditEntry {
  const entry = auditLog.fromRow(row);
  return { ...entry, details: JSON.parse(entry.details) as AuditEntry["details"] };
}

// ── pages ──

/**
 * The cursor of a keyset page, opaque to callers: the position of the page's last row, a whole number (an audit
 * entry's id; an organization's createdAtMs) and, for organizations, the id that follows it in the order.
 */
const CURSORS = {
  audit: /^audit:([1-9][0-9]{0,15})$/,
  org: /^org:(0|[1-9][0-9]{0,15}):(.+)$/s,
  batch: /^batch:(0|[1-9][0-9]{0,15}):(.+)$/s,
};

export function encodeCursor(kind: keyof typeof CURSORS, position: number, id?: string): string {
  return encodeCursorText(id === undefined ? `${kind}:${position}` : `${kind}:${position}:${id}`);
}

/** Throws StoreInputError (field `cursor`) for anything encodeCursor could not have produced. */
export function decodeCursor(kind: keyof typeof CURSORS, text: string): { position: number; id: string } {
  const match = CURSORS[kind].exec(decodeCursorText(text));
  const position = Number(match?.[1]);
  if (!match || !Number.isSafeInteger(position)) throw badCursor();
  return { position, id: match[2] ?? "" };
}

export interface Page<T> {
  items: T[];
  nextCursor: string | null;
}

/** A keyset page's statement: `sql` (in the keyset's order) with the limit as its last parameter. */
export function withLimit(sql: string): string {
  return `${sql} LIMIT ?`;
}

/** A page of `limit` rows of `sql` (ordered by the keyset), read as `limit + 1` to know whether more follow. */
export function* keysetPage<T>(
  sql: string,
  params: unknown[],
  limit: number,
  map: (row: DbRow) => T,
  cursorOf: (last: T) => string,
): SqlProgram<Page<T>> {
  const rows = yield* query(withLimit(sql), ...params, limit + 1);
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
