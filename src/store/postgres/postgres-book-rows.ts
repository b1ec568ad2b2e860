import {
  RESOLUTION_FIELDS,
  type ReservationRow,
  type Snapshot,
  type SnapshotQuery,
  type SnapshotRows,
  selectClaims,
  snapshotOf,
  sweepReads,
  USAGE_FINAL_FIELDS,
  USAGE_STATE_FIELDS,
  type WriteSet,
} from "../bookkeeping/rows.ts";
import { type DbRow, postgres, type Table } from "../schema/table.ts";
import {
  BALANCE_FIELDS,
  idempotencyKeys,
  ledgerEntries,
  NEW_LEDGER_FIELDS,
  orgBalances,
  previewCounters,
  reservations,
  usageDaily,
  usageRecords,
} from "../schema/tables.ts";
import { StoreConflictError } from "../store-errors.ts";
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

const KEY = { counter: ["scope", "day"], idempotency: ["orgId", "key"] } as const;
const FINAL = ["requestId", ...USAGE_FINAL_FIELDS] as const;
const RESOLUTION = ["id", ...RESOLUTION_FIELDS] as const;
const SWEEP = sweepReads((alias) => ` FOR UPDATE OF ${alias} SKIP LOCKED`);

const SQL = {
  // Creates missing counters at 0 so that every counter of the batch is locked; the no-op update locks existing ones.
  counters:
    `INSERT INTO preview_counters (${previewCounters.list()}) SELECT scope, day, 0 FROM ${postgres.unnestAs(previewCounters, KEY.counter, "k")} ` +
    'ORDER BY scope COLLATE "C", day COLLATE "C" ' +
    `ON CONFLICT (scope, day) DO UPDATE SET count = preview_counters.count RETURNING ${previewCounters.list()}`,
  usage: `SELECT ${usageRecords.list(USAGE_STATE_FIELDS)} FROM usage_records WHERE request_id = ANY($1::text[]) ORDER BY request_id FOR UPDATE`,
  reservations: `SELECT ${reservations.list()} FROM reservations WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE`,
  // The organizations that exist, each with its balance row (locked) when it has one.
  balances:
    `SELECT o.id AS org_id, ${orgBalances.list(BALANCE_FIELDS, "b.")} FROM organizations o LEFT JOIN LATERAL ` +
    `(SELECT ${orgBalances.list(BALANCE_FIELDS)} FROM org_balances WHERE org_id = o.id FOR UPDATE) b ON true ` +
    "WHERE o.id = ANY($1::text[]) ORDER BY o.id",
  // Entries that do not exist yet cannot be locked: a transaction-level advisory lock per (organization, key), taken in
  // one order, serializes two claims of one new key (the two-key space does not overlap the migration lock's bigint key).
  lockIdempotency:
    "SELECT pg_advisory_xact_lock(1952671090, h) FROM (SELECT DISTINCT hashtext(length(o)::text || ':' || o || k) AS h " +
    "FROM unnest($1::text[], $2::text[]) AS k(o, k) ORDER BY h) AS keys",
  // Each claim with its holder (not locked: a final outcome and an ended lease stay so).
  idempotency:
    `${selectClaims(`JOIN ${postgres.unnestAs(idempotencyKeys, KEY.idempotency, "k")} ON i.org_id = k.org_id AND i.key = k.key`)} ` +
    "ORDER BY i.org_id, i.key FOR UPDATE OF i",
  dueInFlight: postgres.numbered(SWEEP.dueInFlight),
  dueReservations: postgres.numbered(SWEEP.dueReservations),
  orphanedInFlight: postgres.numbered(SWEEP.orphanedInFlight),

  insertUsage: postgres.insert(usageRecords),
  finalUsage:
    `UPDATE usage_records u SET ${usageRecords.assign(USAGE_FINAL_FIELDS, (c) => `f.${c}`)} FROM ${postgres.unnestAs(usageRecords, FINAL, "f")} ` +
    "WHERE u.request_id = f.request_id AND u.outcome = 'in_flight'",
  insertReservations: postgres.insert(reservations),
  resolveReservations:
    `UPDATE reservations r SET ${reservations.assign(RESOLUTION_FIELDS, (c) => `f.${c}`)} FROM ${postgres.unnestAs(reservations, RESOLUTION, "f")} ` +
    "WHERE r.id = f.id AND r.status = 'pending'",
  // A row another transaction created since the snapshot (it could not be locked) is added to instead.
  insertBalances: `${postgres.insert(orgBalances, orgBalances.fields, "b")} ON CONFLICT (org_id) DO UPDATE SET ${orgBalances.assign(
    BALANCE_FIELDS,
    (c) => `b.${c} + excluded.${c}`,
  )}`,
  moveBalances:
    `UPDATE org_balances b SET ${orgBalances.assign(BALANCE_FIELDS, (c) => `b.${c} + d.${c}`)} ` +
    `FROM ${postgres.unnestAs(orgBalances, orgBalances.fields, "d")} WHERE b.org_id = d.org_id`,
  insertLedger:
    `INSERT INTO ledger_entries (${ledgerEntries.list(NEW_LEDGER_FIELDS)}) SELECT ${ledgerEntries.list(NEW_LEDGER_FIELDS)} ` +
    `FROM ${postgres.unnest(ledgerEntries, NEW_LEDGER_FIELDS)} WITH ORDINALITY AS e(${ledgerEntries.list(NEW_LEDGER_FIELDS)}, n) ORDER BY n`,
  putCounters: postgres.insert(previewCounters) + previewCounters.onConflictReplace(KEY.counter),
  putIdempotency: postgres.insert(idempotencyKeys) + idempotencyKeys.onConflictReplace(KEY.idempotency),
  deleteIdempotency: `DELETE FROM idempotency_keys i USING ${postgres.unnestAs(idempotencyKeys, KEY.idempotency, "k")} WHERE i.org_id = k.org_id AND i.key = k.key`,
  // Increments, in one order shared by every transaction (a day's row is locked from here until commit).
  addUsageDaily: addToUsageDaily(
    `SELECT * FROM ${postgres.unnestAs(usageDaily, usageDaily.fields, "d")} ORDER BY org_id COLLATE "C", day_start_ms`,
  ),
} as const;

type Name = keyof typeof SQL;
const NAMES = Object.keys(SQL) as Name[];

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

/**
 * The snapshot of a batch in one statement (after the idempotency keys' advisory locks, when there are keys): each
 * part is a scalar subquery, evaluated in the order written — the counters (created at 0 where missing, in a CTE),
 * usage records, reservations, balances, idempotency entries. Every transaction locks in that order (idempotency
 * keys first), so none waits for another in a cycle. The sweep's reads stay separate.
 */
export async function readSnapshot(c: Client, q: SnapshotQuery): Promise<Snapshot> {
  const parts: Part[] = [];
  if (q.counters?.length) parts.push({ name: "counters", values: postgres.arrays(previewCounters, q.counters, KEY.counter) });
  if (q.usage?.length) parts.push({ name: "usage", values: [q.usage] });
  if (q.reservations?.length) parts.push({ name: "reservations", values: [q.reservations] });
  if (q.balances?.length) parts.push({ name: "balances", values: [q.balances] });
  if (q.idempotency?.length) {
    const keys = postgres.arrays(idempotencyKeys, q.idempotency, KEY.idempotency);
    // First and on its own: the read below must take its snapshot after the locks are held, to see a claim
    // committed by the transaction it waited for.
    await c.query({ name: "tds_lockIdempotency", text: SQL.lockIdempotency, values: keys });
    parts.push({ name: "idempotency", values: keys });
  }
  const rows: SnapshotRows = {};
  if (parts.length > 0) {
    const row = await runCombined<Record<string, unknown>>(c, parts, (texts) => {
      const counters = parts[0]!.name === "counters" ? `WITH counters AS (${texts[0]}) ` : "";
      const selects = parts.map((p, i) =>
        p.name === "counters" ? "(SELECT json_agg(x) FROM counters x)" : `(SELECT json_agg(x) FROM (${texts[i]}) x)`,
      );
      return `${counters}SELECT ${selects.map((sel, i) => `${sel} AS "${parts[i]!.name}"`).join(", ")}`;
    });
    // json_agg keeps the rows' order; a part without rows is null.
    for (const { name } of parts) Object.assign(rows, { [name]: row[name] ?? [] });
  }
  const sweep = async <R>(name: "dueInFlight" | "dueReservations" | "orphanedInFlight", values: unknown[]) =>
    (await c.query<R & DbRow>({ name: `tds_${name}`, text: SQL[name], values })).rows;
  if (q.dueInFlight) rows.dueInFlight = await sweep("dueInFlight", [q.dueInFlight.createdBeforeMs, q.dueInFlight.limit]);
  if (q.dueReservations)
    rows.dueReservations = await sweep<ReservationRow>("dueReservations", [q.dueReservations.nowMs, q.dueReservations.limit]);
  if (q.orphanedInFlight) {
    const { instanceId, createdBeforeMs, nowMs, limit } = q.orphanedInFlight;
    rows.orphanedInFlight = await sweep("orphanedInFlight", [instanceId, createdBeforeMs, nowMs, limit]);
  }
  return snapshotOf(rows);
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
  const add = <T>(name: Name, table: Table<T>, rows: readonly Partial<T>[], fields: readonly (keyof T)[] = table.fields) => {
    if (rows.length > 0) parts.push({ name, values: postgres.arrays(table, rows, fields) });
  };
  add("insertUsage", usageRecords, w.usageInserts);
  add("finalUsage", usageRecords, w.usageFinals, FINAL);
  add("insertReservations", reservations, w.reservationInserts);
  add("resolveReservations", reservations, w.reservationResolutions, RESOLUTION);
  add("insertBalances", orgBalances, w.balanceInserts);
  add("moveBalances", orgBalances, w.balanceDeltas);
  add("insertLedger", ledgerEntries, w.ledger, NEW_LEDGER_FIELDS);
  add("putCounters", previewCounters, w.counters);
  add("putIdempotency", idempotencyKeys, w.idempotencyPuts);
  add("deleteIdempotency", idempotencyKeys, w.idempotencyDeletes, KEY.idempotency);
  // Last: the roll-up rows are the hottest (one per organization and day), so they are held for the shortest time.
  add("addUsageDaily", usageDaily, w.usageDaily);
  return parts;
}
