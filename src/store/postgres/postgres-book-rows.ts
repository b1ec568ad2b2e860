import {
  CLAIM_HOLDER_COLUMNS,
  CLAIM_HOLDER_JOINS,
  counterKey,
  emptySnapshot,
  IDEMPOTENCY_COLUMNS,
  type IdempotencyDbRow,
  idempotencyKey,
  type ReservationRow,
  type Snapshot,
  type SnapshotQuery,
  toIdempotencyRow,
  toUsageState,
  USAGE_STATE_COLUMNS,
  type UsageStateRow,
  type WriteSet,
} from "../bookkeeping/rows.ts";
import { RESERVATION_COLUMNS } from "../credit-rows.ts";
import { StoreConflictError } from "../store.ts";
import { addToUsageDaily } from "../usage-daily-rows.ts";
import { type Client, isUniqueViolation } from "./postgres-connection.ts";

/**
 * The rows of the bookkeeping programs in PostgreSQL: each list is read or written set-based (arrays unnested), and
 * the lists are combined into one statement to read and one to write, so a batch of any size costs the same two
 * round trips (besides BEGIN and COMMIT). Reads lock their rows (FOR UPDATE)
 * in one order shared by every transaction — idempotency keys, counters, usage, reservations, balances, each
 * sorted by key — so concurrent batches of several instances wait for each other but never deadlock; the daily usage
 * rows are locked last, by the write's upsert, in their own sorted order. The sweep's reads skip rows another
 * transaction holds.
 */

const SQL = {
  // Creates missing counters at 0 so that every counter of the batch is locked; the no-op update locks existing ones.
  counters:
    "INSERT INTO preview_counters (scope, day, count) " +
    'SELECT scope, day, 0 FROM unnest($1::text[], $2::text[]) AS k(scope, day) ORDER BY scope COLLATE "C", day COLLATE "C" ' +
    "ON CONFLICT (scope, day) DO UPDATE SET count = preview_counters.count RETURNING scope, day, count",
  usage: `SELECT ${USAGE_STATE_COLUMNS} FROM usage_records WHERE request_id = ANY($1::text[]) ORDER BY request_id FOR UPDATE`,
  reservations: `SELECT ${RESERVATION_COLUMNS} FROM reservations WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE`,
  // The organizations that exist, each with its balance row (locked) when it has one.
  balances:
    "SELECT o.id AS org_id, b.available, b.reserved, b.spent, b.granted FROM organizations o LEFT JOIN LATERAL " +
    "(SELECT available, reserved, spent, granted FROM org_balances WHERE org_id = o.id FOR UPDATE) b ON true " +
    "WHERE o.id = ANY($1::text[]) ORDER BY o.id",
  // Entries that do not exist yet cannot be locked: a transaction-level advisory lock per (organization, key), taken in
  // one order, serializes two claims of one new key (the two-key space does not overlap the migration lock's bigint key).
  lockIdempotency:
    "SELECT pg_advisory_xact_lock(1952671090, h) FROM (SELECT DISTINCT hashtext(length(o)::text || ':' || o || k) AS h " +
    "FROM unnest($1::text[], $2::text[]) AS k(o, k) ORDER BY h) AS keys",
  // Each claim with its holder (not locked: a final outcome and an ended lease stay so).
  idempotency:
    `SELECT ${IDEMPOTENCY_COLUMNS.replace(/(\w+)/g, "i.$1")}, ${CLAIM_HOLDER_COLUMNS} FROM idempotency_keys i ` +
    `JOIN unnest($1::text[], $2::text[]) AS k(org_id, key) ON i.org_id = k.org_id AND i.key = k.key ${CLAIM_HOLDER_JOINS} ` +
    "ORDER BY i.org_id, i.key FOR UPDATE OF i",
  dueInFlight:
    `SELECT ${USAGE_STATE_COLUMNS} FROM usage_records WHERE outcome = 'in_flight' AND created_at_ms < $1 ` +
    "ORDER BY created_at_ms LIMIT $2 FOR UPDATE SKIP LOCKED",
  dueReservations:
    `SELECT ${RESERVATION_COLUMNS.replace(/(\w+)/g, "r.$1")} FROM reservations r WHERE r.status = 'pending' AND r.expires_at_ms <= $1 ` +
    "AND NOT EXISTS (SELECT 1 FROM usage_records u WHERE u.request_id = r.request_id AND u.outcome = 'in_flight') " +
    "ORDER BY r.expires_at_ms LIMIT $2 FOR UPDATE OF r SKIP LOCKED",
  orphanedInFlight:
    `SELECT ${USAGE_STATE_COLUMNS} FROM usage_records u WHERE u.outcome = 'in_flight' AND u.instance_id IS DISTINCT FROM $1 ` +
    "AND (u.created_at_ms < $2 OR EXISTS (SELECT 1 FROM gateway_instances g WHERE g.id = u.instance_id AND g.lease_until_ms <= $3)) " +
    "ORDER BY u.created_at_ms LIMIT $4 FOR UPDATE OF u SKIP LOCKED",

  insertUsage:
    "INSERT INTO usage_records (request_id, org_id, key_id, created_at_ms, source, model, mode, outcome, http_status, input_tokens, output_tokens, " +
    "cost_microusd, latency_ms, gateway_latency_ms, error_detail, over_reservation, completed_at_ms, deployment, attempts, instance_id) " +
    "SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::text[], $9::int[], " +
    "$10::bigint[], $11::bigint[], $12::bigint[], $13::float8[], $14::float8[], $15::text[], $16::bool[], $17::bigint[], $18::text[], $19::int[], " +
    "$20::text[])",
  finalUsage:
    "UPDATE usage_records u SET completed_at_ms = f.completed_at_ms, outcome = f.outcome, http_status = f.http_status, " +
    "input_tokens = f.input_tokens, output_tokens = f.output_tokens, cost_microusd = f.cost_microusd, latency_ms = f.latency_ms, " +
    "gateway_latency_ms = f.gateway_latency_ms, error_detail = f.error_detail, over_reservation = f.over_reservation, " +
    "deployment = f.deployment, attempts = f.attempts " +
    "FROM unnest($1::text[], $2::bigint[], $3::text[], $4::int[], $5::bigint[], $6::bigint[], $7::bigint[], $8::float8[], $9::float8[], " +
    "$10::text[], $11::bool[], $12::text[], $13::int[]) AS f(request_id, completed_at_ms, outcome, http_status, input_tokens, output_tokens, " +
    "cost_microusd, latency_ms, gateway_latency_ms, error_detail, over_reservation, deployment, attempts) " +
    "WHERE u.request_id = f.request_id AND u.outcome = 'in_flight'",
  insertReservations:
    `INSERT INTO reservations (${RESERVATION_COLUMNS}) SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], ` +
    "$6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[])",
  resolveReservations:
    "UPDATE reservations r SET status = f.status, cost_microusd = f.cost_microusd, resolved_at_ms = f.resolved_at_ms " +
    "FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS f(id, status, cost_microusd, resolved_at_ms) " +
    "WHERE r.id = f.id AND r.status = 'pending'",
  // A row another transaction created since the snapshot (it could not be locked) is added to instead.
  insertBalances:
    "INSERT INTO org_balances AS b (org_id, available, reserved, spent, granted) " +
    "SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[]) ON CONFLICT (org_id) DO UPDATE SET " +
    "available = b.available + excluded.available, reserved = b.reserved + excluded.reserved, spent = b.spent + excluded.spent, " +
    "granted = b.granted + excluded.granted",
  moveBalances:
    "UPDATE org_balances b SET available = b.available + d.available, reserved = b.reserved + d.reserved, spent = b.spent + d.spent, " +
    "granted = b.granted + d.granted FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[]) " +
    "AS d(org_id, available, reserved, spent, granted) WHERE b.org_id = d.org_id",
  insertLedger:
    "INSERT INTO ledger_entries (org_id, kind, reservation_id, available_delta, reserved_delta, spent_delta, granted_delta, created_at_ms, note) " +
    "SELECT org_id, kind, reservation_id, available_delta, reserved_delta, spent_delta, granted_delta, created_at_ms, note " +
    "FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[], $9::text[]) " +
    "WITH ORDINALITY AS e(org_id, kind, reservation_id, available_delta, reserved_delta, spent_delta, granted_delta, created_at_ms, note, n) ORDER BY n",
  putCounters:
    "INSERT INTO preview_counters (scope, day, count) SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]) " +
    "ON CONFLICT (scope, day) DO UPDATE SET count = excluded.count",
  putIdempotency:
    `INSERT INTO idempotency_keys (${IDEMPOTENCY_COLUMNS}) SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], ` +
    "$6::int[], $7::text[], $8::text[], $9::bigint[], $10::bigint[]) ON CONFLICT (org_id, key) DO UPDATE SET request_hash = excluded.request_hash, " +
    "request_id = excluded.request_id, state = excluded.state, response_status = excluded.response_status, response_body = excluded.response_body, " +
    "response_request_id = excluded.response_request_id, lock_until_ms = excluded.lock_until_ms, expires_at_ms = excluded.expires_at_ms",
  deleteIdempotency:
    "DELETE FROM idempotency_keys i USING unnest($1::text[], $2::text[]) AS k(org_id, key) WHERE i.org_id = k.org_id AND i.key = k.key",
  // Increments, in one order shared by every transaction (a day's row is locked from here until commit).
  addUsageDaily: addToUsageDaily(
    "SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[], " +
      "$9::bigint[]) AS d(org_id, day_start_ms, requests, in_flight, succeeded, failed, input_tokens, output_tokens, cost_microusd) " +
      'ORDER BY org_id COLLATE "C", day_start_ms',
  ),
} as const;

type Name = keyof typeof SQL;
const NAMES = Object.keys(SQL) as Name[];

/** Columns of a list of rows, as the arrays `unnest` takes. */
function columns<T>(rows: readonly T[], ...pick: ((row: T) => unknown)[]): unknown[][] {
  return pick.map((f) => rows.map(f));
}

/** One part of a combined statement: a statement of SQL and the values of its $1…$n. */
interface Part {
  name: Name;
  values: unknown[];
}

/** The SQL of a part with its parameters renumbered after `offset` others. */
function renumbered(part: Part, offset: number): string {
  return SQL[part.name].replace(/\$(\d+)/g, (_, n: string) => `$${Number(n) + offset}`);
}

/**
 * Several statements as one, so that a batch costs one round trip to read and one to write. The statement is
 * prepared once per connection under a name made of its parts (a handful of combinations occur).
 */
async function runCombined<R extends Record<string, unknown>>(c: Client, parts: Part[], sql: (texts: string[]) => string): Promise<R> {
  const texts: string[] = [];
  const values: unknown[] = [];
  for (const part of parts) {
    texts.push(renumbered(part, values.length));
    values.push(...part.values);
  }
  const name = `tds_${parts.map((p) => NAMES.indexOf(p.name)).join("_")}`;
  return (await c.query<R>({ name, text: sql(texts), values })).rows[0]!;
}

/** A read part's rows as JSON (json_agg keeps the rows' order); null → []. */
const rowsOf = <T>(value: unknown): T[] => (value as T[] | null) ?? [];

/**
 * The snapshot of a batch in one statement (after the idempotency keys' advisory locks, when there are keys): each
 * part is a scalar subquery, evaluated in the order written — the counters (created at 0 where missing, in a CTE),
 * usage records, reservations, balances, idempotency entries. Every transaction locks in that order (idempotency
 * keys first), so none waits for another in a cycle. The sweep's reads stay separate.
 */
export async function readSnapshot(c: Client, q: SnapshotQuery): Promise<Snapshot> {
  const s = emptySnapshot();
  const parts: Part[] = [];
  if (q.counters?.length)
    parts.push({
      name: "counters",
      values: columns(
        q.counters,
        (k) => k.scope,
        (k) => k.day,
      ),
    });
  if (q.usage?.length) parts.push({ name: "usage", values: [q.usage] });
  if (q.reservations?.length) parts.push({ name: "reservations", values: [q.reservations] });
  if (q.balances?.length) parts.push({ name: "balances", values: [q.balances] });
  if (q.idempotency?.length) {
    const keys = columns(
      q.idempotency,
      (k) => k.orgId,
      (k) => k.key,
    );
    // First and on its own: the read below must take its snapshot after the locks are held, to see a claim
    // committed by the transaction it waited for.
    await c.query({ name: "tds_lockIdempotency", text: SQL.lockIdempotency, values: keys });
    parts.push({ name: "idempotency", values: keys });
  }
  if (parts.length > 0) {
    const row = await runCombined<Record<string, unknown>>(c, parts, (texts) => {
      const counters = parts[0]!.name === "counters" ? `WITH counters AS (${texts[0]}) ` : "";
      const selects = parts.map((p, i) =>
        p.name === "counters" ? "(SELECT json_agg(x) FROM counters x)" : `(SELECT json_agg(x) FROM (${texts[i]}) x)`,
      );
      return `${counters}SELECT ${selects.map((sel, i) => `${sel} AS "${parts[i]!.name}"`).join(", ")}`;
    });
    for (const r of rowsOf<{ scope: string; day: string; count: number }>(row.counters))
      s.counters.set(counterKey(r.scope, r.day), r.count);
    for (const r of rowsOf<UsageStateRow>(row.usage)) s.usage.set(r.request_id, toUsageState(r));
    for (const r of rowsOf<ReservationRow>(row.reservations)) s.reservations.set(r.id, r);
    for (const r of rowsOf<{ org_id: string; available: number | null; reserved: number; spent: number; granted: number }>(row.balances)) {
      s.organizations.add(r.org_id);
      if (r.available !== null)
        s.balances.set(r.org_id, { available: r.available, reserved: r.reserved, spent: r.spent, granted: r.granted });
    }
    for (const r of rowsOf<IdempotencyDbRow>(row.idempotency)) s.idempotency.set(idempotencyKey(r.org_id, r.key), toIdempotencyRow(r));
  }
  if (q.dueInFlight) {
    const { rows } = await c.query<UsageStateRow>({
      name: "tds_dueInFlight",
      text: SQL.dueInFlight,
      values: [q.dueInFlight.createdBeforeMs, q.dueInFlight.limit],
    });
    s.dueInFlight = rows.map(toUsageState);
  }
  if (q.dueReservations) {
    const { rows } = await c.query<ReservationRow>({
      name: "tds_dueReservations",
      text: SQL.dueReservations,
      values: [q.dueReservations.nowMs, q.dueReservations.limit],
    });
    s.dueReservations = rows;
  }
  if (q.orphanedInFlight) {
    const { instanceId, createdBeforeMs, nowMs, limit } = q.orphanedInFlight;
    const { rows } = await c.query<UsageStateRow>({
      name: "tds_orphanedInFlight",
      text: SQL.orphanedInFlight,
      values: [instanceId, createdBeforeMs, nowMs, limit],
    });
    s.orphanedInFlight = rows.map(toUsageState);
  }
  return s;
}

/** Writes the rows in one statement; a duplicate key (a request id, a reservation id) fails with StoreConflictError. */
export async function writeRows(c: Client, w: WriteSet): Promise<void> {
  const parts = writeParts(w);
  if (parts.length === 0) return;
  let counts: Record<string, number>;
  try {
    counts = await runCombined<Record<string, number>>(c, parts, (texts) => {
      const ctes = parts.map((p, i) => `${p.name} AS (${texts[i]} RETURNING 1)`).join(", ");
      return `WITH ${ctes} SELECT ${parts.map((p) => `(SELECT count(*) FROM ${p.name}) AS "${p.name}"`).join(", ")}`;
    });
  } catch (err) {
    if (isUniqueViolation(err)) throw new StoreConflictError(`A row with this key already exists (${err.constraint ?? "unique"})`);
    throw err;
  }
  // Rows the snapshot locked must all have been there to change.
  for (const [name, expected, what] of [
    ["finalUsage", w.usageFinals.length, "usage records were not in flight"],
    ["resolveReservations", w.reservationResolutions.length, "reservations were not pending"],
    ["moveBalances", w.balanceDeltas.length, "organizations had no credit balance"],
  ] as const) {
    const changed = counts[name] ?? 0;
    if (changed !== expected) throw new Error(`Bookkeeping conflict: ${expected - changed} of ${expected} ${what}`);
  }
}

/** The parts of a write set, each list one statement; the rows of one table are never in two parts. */
function writeParts(w: WriteSet): Part[] {
  const parts: Part[] = [];
  const add = <T>(name: Name, rows: readonly T[], ...pick: ((row: T) => unknown)[]) => {
    if (rows.length > 0) parts.push({ name, values: columns(rows, ...pick) });
  };
  add(
    "insertUsage",
    w.usageInserts,
    (u) => u.requestId,
    (u) => u.orgId,
    (u) => u.keyId,
    (u) => u.createdAtMs,
    (u) => u.source,
    (u) => u.model,
    (u) => u.mode,
    (u) => u.outcome,
    (u) => u.httpStatus,
    (u) => u.inputTokens,
    (u) => u.outputTokens,
    (u) => u.costMicrousd,
    (u) => u.latencyMs,
    (u) => u.gatewayLatencyMs,
    (u) => u.errorDetail,
    (u) => u.overReservation,
    (u) => u.completedAtMs,
    (u) => u.deployment,
    (u) => u.attempts,
    (u) => u.instanceId,
  );
  add(
    "finalUsage",
    w.usageFinals,
    (f) => f.requestId,
    (f) => f.completedAtMs,
    (f) => f.outcome,
    (f) => f.httpStatus,
    (f) => f.inputTokens,
    (f) => f.outputTokens,
    (f) => f.costMicrousd,
    (f) => f.latencyMs,
    (f) => f.gatewayLatencyMs,
    (f) => f.errorDetail,
    (f) => f.overReservation,
    (f) => f.deployment,
    (f) => f.attempts,
  );
  add(
    "insertReservations",
    w.reservationInserts,
    (r) => r.id,
    (r) => r.org_id,
    (r) => r.request_id,
    (r) => r.amount_microusd,
    (r) => r.status,
    (r) => r.cost_microusd,
    (r) => r.created_at_ms,
    (r) => r.expires_at_ms,
    (r) => r.resolved_at_ms,
  );
  add(
    "resolveReservations",
    w.reservationResolutions,
    (r) => r.id,
    (r) => r.status,
    (r) => r.costMicrousd,
    (r) => r.resolvedAtMs,
  );
  add(
    "insertBalances",
    w.balanceInserts,
    (b) => b.orgId,
    (b) => b.available,
    (b) => b.reserved,
    (b) => b.spent,
    (b) => b.granted,
  );
  add(
    "moveBalances",
    w.balanceDeltas,
    (b) => b.orgId,
    (b) => b.available,
    (b) => b.reserved,
    (b) => b.spent,
    (b) => b.granted,
  );
  add(
    "insertLedger",
    w.ledger,
    (e) => e.orgId,
    (e) => e.kind,
    (e) => e.reservationId,
    (e) => e.availableDelta,
    (e) => e.reservedDelta,
    (e) => e.spentDelta,
    (e) => e.grantedDelta,
    (e) => e.createdAtMs,
    (e) => e.note,
  );
  add(
    "putCounters",
    w.counters,
    (k) => k.scope,
    (k) => k.day,
    (k) => k.count,
  );
  add(
    "putIdempotency",
    w.idempotencyPuts,
    (i) => i.orgId,
    (i) => i.key,
    (i) => i.requestHash,
    (i) => i.requestId,
    (i) => i.state,
    (i) => i.responseStatus,
    (i) => i.responseBody,
    (i) => i.responseRequestId,
    (i) => i.lockUntilMs,
    (i) => i.expiresAtMs,
  );
  add(
    "deleteIdempotency",
    w.idempotencyDeletes,
    (k) => k.orgId,
    (k) => k.key,
  );
  // Last: the roll-up rows are the hottest (one per organization and day), so they are held for the shortest time.
  add(
    "addUsageDaily",
    w.usageDaily,
    (d) => d.orgId,
    (d) => d.dayStartMs,
    (d) => d.requests,
    (d) => d.inFlight,
    (d) => d.succeeded,
    (d) => d.failed,
    (d) => d.inputTokens,
    (d) => d.outputTokens,
    (d) => d.costMicrousd,
  );
  return parts;
}
