import type pg from "pg";
import {
  CounterLimitPassed,
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
  keySpends,
  ledgerEntries,
  NEW_LEDGER_FIELDS,
  orgBalances,
  previewCounters,
  usageDaily,
  usageRecords,
} from "../schema/tables.ts";
import { StoreConflictError } from "../store-errors.ts";
import { addToUsageDaily } from "../usage-daily-rows.ts";
import { isUniqueViolation, type Pipeline, pgCode } from "./postgres-connection.ts";

/**
 * The rows of the bookkeeping programs in PostgreSQL: each list is read or written set-based (arrays unnested), and
 * the lists are combined into one statement to read and one to write, pipelined with BEGIN and COMMIT, so a batch of
 * any size costs the same two round trips (postgres-connection.ts, pipelinedTransaction). Reads lock their rows (FOR UPDATE)
 * in one order shared by every transaction — idempotency keys, counters, usage (with their reservations), balances, key
 * spend, idempotency entries, each sorted by key — so concurrent batches of several instances wait for each other but
 * never deadlock; the daily usage rows are locked last, by the write's upsert, in their own sorted order. The sweep's
 * reads skip rows another transaction holds.
 */

const KEY = { counter: ["scope", "day"], keySpend: ["keyId", "period"], idempotency: ["orgId", "key"] } as const;
const FINAL = ["requestId", ...USAGE_FINAL_FIELDS] as const;
const SWEEP = sweepReads((alias) => ` FOR UPDATE OF ${alias} SKIP LOCKED`);

/*
 * BY_KEY: a statement that joins the batch's keys (unnested) to a table also says `key = ANY(the keys)`. With the
 * bookkeeping connections' settings (no Seq Scans, no hash or merge joins: postgres-connection.ts) a join is a nested
 * loop; a plan made while the table held a few rows, or few of the rows asked for (records in flight), puts the table
 * outside the loop, and without that condition it would read the table's whole index, as it grew, until the next ANALYZE.
 */
const SQL = {
  // Creates missing counters at 0 so that every counter of the batch is locked; the no-op update locks existing ones.
  counters:
    `INSERT INTO preview_counters (${previewCounters.list()}) SELECT scope, day, 0 FROM ${postgres.unnestAs(previewCounters, KEY.counter, "k")} ` +
    'ORDER BY scope COLLATE "C", day COLLATE "C" ' +
    `ON CONFLICT (scope, day) DO UPDATE SET count = preview_counters.count RETURNING ${previewCounters.list()}`,
  // Not locked: the write adds to them within a limit (incrementCounters). The keys also as `= ANY` (BY_KEY).
  sharedCounters:
    `SELECT ${previewCounters.list(previewCounters.fields, "c.")} FROM preview_counters c ` +
    `JOIN ${postgres.unnestAs(previewCounters, KEY.counter, "k")} ON c.scope = k.scope AND c.day = k.day ` +
    "WHERE c.scope = ANY($1::text[]) AND c.day = ANY($2::text[])",
  usage: `SELECT ${usageRecords.list(USAGE_STATE_FIELDS)} FROM usage_records WHERE request_id = ANY($1::text[]) ORDER BY request_id FOR UPDATE`,
  // The balance rows, locked in org_id order: LockRows runs above the sort, and json_agg reads every row (see readSnapshot).
  balances: `SELECT org_id, ${orgBalances.list(BALANCE_FIELDS)} FROM org_balances WHERE org_id = ANY($1::text[]) ORDER BY org_id FOR UPDATE`,
  // The organizations that exist (not locked), reported with or without a balance.
  organizations: "SELECT id AS org_id FROM organizations WHERE id = ANY($1::text[])",
  // As the counters: missing rows created at 0 so that every key spend of the batch is locked, in (key_id, period) order.
  keySpend:
    `INSERT INTO key_spend (${keySpends.list()}) SELECT key_id, period, 0, 0 FROM ${postgres.unnestAs(keySpends, KEY.keySpend, "k")} ` +
    'ORDER BY key_id COLLATE "C", period COLLATE "C" ' +
    `ON CONFLICT (key_id, period) DO UPDATE SET reserved_microusd = key_spend.reserved_microusd RETURNING ${keySpends.list()}`,
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
  orphanedInFlight: postgres.numbered(SWEEP.orphanedInFlight),

  insertUsage: postgres.insert(usageRecords),
  // Each record found by its key (also as `= ANY`: BY_KEY). `IS NOT DISTINCT FROM`, not `=`: the partial index usage_records_in_flight would match
  // `outcome = 'in_flight'`, and once ANALYZE says few records are in flight the planner scans that whole index (with
  // every dead entry of the records completed since the last VACUUM) and hash-joins it, instead of 1 lookup per record.
  finalUsage:
    `UPDATE usage_records u SET ${usageRecords.assign(USAGE_FINAL_FIELDS, (c) => `f.${c}`)} FROM ${postgres.unnestAs(usageRecords, FINAL, "f")} ` +
    "WHERE u.request_id = f.request_id AND u.request_id = ANY($1::text[]) AND u.outcome IS NOT DISTINCT FROM 'in_flight'",
  // A row another transaction created since the snapshot (it could not be locked) is added to instead.
  insertBalances: `${postgres.insert(orgBalances, orgBalances.fields, "b")} ON CONFLICT (org_id) DO UPDATE SET ${orgBalances.assign(
    BALANCE_FIELDS,
    (c) => `b.${c} + excluded.${c}`,
  )}`,
  // BY_KEY.
  moveBalances:
    `UPDATE org_balances b SET ${orgBalances.assign(BALANCE_FIELDS, (c) => `b.${c} + d.${c}`)} ` +
    `FROM ${postgres.unnestAs(orgBalances, orgBalances.fields, "d")} WHERE b.org_id = d.org_id AND b.org_id = ANY($1::text[])`,
  insertLedger:
    `INSERT INTO ledger_entries (${ledgerEntries.list(NEW_LEDGER_FIELDS)}) SELECT ${ledgerEntries.list(NEW_LEDGER_FIELDS)} ` +
    `FROM ${postgres.unnest(ledgerEntries, NEW_LEDGER_FIELDS)} WITH ORDINALITY AS e(${ledgerEntries.list(NEW_LEDGER_FIELDS)}, n) ORDER BY n`,
  // Rows the read locked (and created): final values.
  putKeySpend: postgres.insert(keySpends) + keySpends.onConflictReplace(KEY.keySpend),
  putCounters: postgres.insert(previewCounters) + previewCounters.onConflictReplace(KEY.counter),
  // Adds to the shared counters, in one order, each within its limit ($4); past it the statement fails (an invalid cast of
  // a text that is not constant, so not folded at planning), so the COMMIT behind it rolls back: CounterLimitPassed.
  incrementCounters:
    `INSERT INTO preview_counters AS c (${previewCounters.list()}) SELECT * FROM ${postgres.unnestAs(previewCounters, previewCounters.fields, "k")} ` +
    'ORDER BY scope COLLATE "C", day COLLATE "C" ON CONFLICT (scope, day) DO UPDATE SET count = CASE WHEN c.count + excluded.count <= ' +
    "(SELECT l.lim FROM unnest($1::text[], $2::text[], $4::bigint[]) AS l(scope, day, lim) WHERE l.scope = excluded.scope AND l.day = excluded.day) " +
    "THEN c.count + excluded.count ELSE ('shared counter limit passed at ' || c.count)::bigint END",
  putIdempotency: postgres.insert(idempotencyKeys) + idempotencyKeys.onConflictReplace(KEY.idempotency),
  deleteIdempotency: `DELETE FROM idempotency_keys i USING ${postgres.unnestAs(idempotencyKeys, KEY.idempotency, "k")} WHERE i.org_id = k.org_id AND i.key = k.key`,
  // Increments, in one order shared by every transaction (a day's row is locked from here until commit).
  addUsageDaily: addToUsageDaily(
    `SELECT * FROM ${postgres.unnestAs(usageDaily, usageDaily.fields, "d")} ORDER BY org_id COLLATE "C", day_start_ms`,
  ),
} as const;

type Name = keyof typeof SQL;
const NAMES = Object.keys(SQL) as Name[];
/** The parts of a read that insert the rows they lock: a statement's WITH holds them (a subquery cannot insert). */
const INSERTING = new Set<Name>(["counters", "keySpend"]);

/** One part of a combined statement: a statement of SQL and the values of its $1…$n. */
interface Part {
  name: Name;
  values: unknown[];
}

/**
 * The text of each combined statement, built once per shape: its parts in order (its name) and each part's number of
 * parameters (today fixed per part: one array per column). Should a part's parameters ever vary, the shape differs
 * while the name does not, and pg refuses the second text for a prepared statement's name on a connection. Bounded
 * all the same: past the bound a text is built every time.
 */
const COMBINED_TEXTS = new Map<string, string>();
const MAX_COMBINED_TEXTS = 512;

/** The SQL of a part with its parameters renumbered after `offset` others. */
function renumbered(part: Part, offset: number): string {
  return SQL[part.name].replace(/\$(\d+)/g, (_, n: string) => `$${Number(n) + offset}`);
}

/**
 * Several statements as one, so that a batch costs one statement to read and one to write. The statement is
 * prepared once per connection under a name made of its parts (a handful of combinations occur). `extra` are
 * parameters of `sql`'s own, numbered after the parts'.
 */
function combined(parts: Part[], sql: (texts: string[], next: number) => string, extra: unknown[] = []): pg.QueryConfig {
  const values: unknown[] = [];
  for (const part of parts) for (const value of part.values) values.push(value);
  const name = `tds_${parts.map((p) => NAMES.indexOf(p.name)).join("_")}`;
  const shape = `${name}/${parts.map((p) => p.values.length).join(",")}/${extra.length}`;
  let text = COMBINED_TEXTS.get(shape);
  if (text === undefined) {
    const texts: string[] = [];
    let offset = 0;
    for (const part of parts) {
      texts.push(renumbered(part, offset));
      offset += part.values.length;
    }
    text = sql(texts, offset + 1);
    if (COMBINED_TEXTS.size < MAX_COMBINED_TEXTS) COMBINED_TEXTS.set(shape, text);
  }
  for (const value of extra) values.push(value);
  return { name, text, values };
}

/**
 * The snapshot of a batch in one statement (after the idempotency keys' advisory locks, when there are keys), sent
 * with them and the sweep's reads in one round trip: each part is a scalar subquery, evaluated in the order written
 * and read to its end by json_agg — the counters (created at 0 where missing, in a CTE), usage records, balances, key
 * spend (created at 0 where missing, in a CTE), idempotency entries — and each locks its rows in its own sorted order
 * (LockRows above the sort; the inserts in the order they insert). Every transaction locks in that order (idempotency
 * keys first), so none waits for another in a cycle.
 */
export async function readSnapshot(p: Pipeline, q: SnapshotQuery): Promise<Snapshot> {
  const parts: Part[] = [];
  if (q.counters?.length) parts.push({ name: "counters", values: postgres.arrays(previewCounters, q.counters, KEY.counter) });
  const shared = q.sharedCounters;
  if (shared?.length) parts.push({ name: "sharedCounters", values: postgres.arrays(previewCounters, shared, KEY.counter) });
  if (q.usage?.length) parts.push({ name: "usage", values: [q.usage] });
  if (q.balances?.length) parts.push({ name: "balances", values: [q.balances] }, { name: "organizations", values: [q.balances] });
  if (q.keySpend?.length) parts.push({ name: "keySpend", values: postgres.arrays(keySpends, q.keySpend, KEY.keySpend) });
  if (q.idempotency?.length) {
    const keys = postgres.arrays(idempotencyKeys, q.idempotency, KEY.idempotency);
    // A statement of its own, before the read: the read must take its snapshot after the locks are held, to see a
    // claim committed by the transaction it waited for.
    p.send({ name: "tds_lockIdempotency", text: SQL.lockIdempotency, values: keys });
    parts.push({ name: "idempotency", values: keys });
  }
  const read =
    parts.length === 0
      ? undefined
      : p.send<Record<string, DbRow[] | null>>(
          combined(parts, (texts) => {
            // Each CTE runs when its subquery is first read: in the order of the select list, with the other parts.
            const inserts = parts.flatMap((part, i) => (INSERTING.has(part.name) ? [`${part.name} AS (${texts[i]})`] : []));
            const selects = parts.map((part, i) =>
              INSERTING.has(part.name) ? `(SELECT json_agg(x) FROM ${part.name} x)` : `(SELECT json_agg(x) FROM (${texts[i]}) x)`,
            );
            const ctes = inserts.length ? `WITH ${inserts.join(", ")} ` : "";
            return `${ctes}SELECT ${selects.map((sel, i) => `${sel} AS "${parts[i]!.name}"`).join(", ")}`;
          }),
        );
  const sweep = (name: "dueInFlight" | "orphanedInFlight", values: unknown[]) =>
    p.send<DbRow>({ name: `tds_${name}`, text: SQL[name], values });
  const dueInFlight = q.dueInFlight && sweep("dueInFlight", [q.dueInFlight.createdBeforeMs, q.dueInFlight.limit]);
  const orphan = q.orphanedInFlight;
  const orphans = orphan && sweep("orphanedInFlight", [orphan.instanceId, orphan.createdBeforeMs, orphan.nowMs, orphan.limit]);
  await p.settle();
  const rows: SnapshotRows = {};
  if (read !== undefined) {
    // json_agg keeps the rows' order; a part without rows is null.
    const row = (await read).rows[0]!;
    for (const { name } of parts) if (name !== "organizations") Object.assign(rows, { [name]: row[name] ?? [] });
    if (q.balances?.length) rows.balances = withBalances(row.organizations ?? [], row.balances ?? []);
  }
  if (dueInFlight) rows.dueInFlight = (await dueInFlight).rows;
  if (orphans) rows.orphanedInFlight = (await orphans).rows;
  return snapshotOf(rows);
}

/** Each organization that exists with its balance row's columns (null without one), as snapshotOf reads them. */
function withBalances(organizations: DbRow[], balances: DbRow[]): DbRow[] {
  const byOrg = new Map(balances.map((b) => [b.org_id, b]));
  return organizations.map((o) => byOrg.get(o.org_id) ?? { org_id: o.org_id });
}

/** What must hold after a write: rows the snapshot locked were all there to change. */
const EXPECTED_CHANGES = [
  ["finalUsage", (w: WriteSet) => w.usageFinals.length, "usage records were not in flight"],
  ["moveBalances", (w: WriteSet) => w.balanceDeltas.length, "organizations had no credit balance"],
] as const;
const CONFLICT = "Bookkeeping conflict";
/** 22P02: the cast of the conflict's message fails with it. */
const INVALID_TEXT_REPRESENTATION = "22P02";

/**
 * Sends the rows' write, one statement; its failure surfaces when the pipeline settles. A duplicate key (a request
 * id) fails with StoreConflictError. The checks of EXPECTED_CHANGES are made by the statement itself, which fails
 * (an invalid cast carrying the message: plain SQL cannot RAISE) when one does not hold, so that the COMMIT sent
 * right behind it rolls back.
 */
export function writeRows(p: Pipeline, w: WriteSet): void {
  const parts = writeParts(w);
  if (parts.length === 0) return;
  const checks = parts.flatMap((part) => EXPECTED_CHANGES.filter(([name]) => name === part.name));
  const query = combined(
    parts,
    (texts, next) => {
      const ctes = parts.map((part, i) => `${part.name} AS (${texts[i]} RETURNING 1)`).join(", ");
      // Every part is read by the SELECT, in the order written, so the parts run (and lock) in that order: PostgreSQL
      // runs the parts a query does not read after it, last written first.
      let param = next;
      const columns = parts.map(({ name }) => {
        const changed = `(SELECT count(*) FROM ${name})`;
        const check = checks.find(([checked]) => checked === name);
        if (!check) return `${changed} AS "${name}"`;
        const expected = `$${param++}::bigint`;
        return (
          `CASE WHEN ${changed} = ${expected} THEN 0 ` +
          `ELSE ('${CONFLICT}: ' || (${expected} - ${changed}) || ' of ' || ${expected} || ' ${check[2]}')::int END AS "${name}"`
        );
      });
      return `WITH ${ctes} SELECT ${columns.join(", ")}`;
    },
    checks.map(([, expected]) => expected(w)),
  );
  p.send(query, (err) => {
    if (isUniqueViolation(err)) return new StoreConflictError(`A row with this key already exists (${err.constraint ?? "unique"})`);
    if (pgCode(err) === INVALID_TEXT_REPRESENTATION && /shared counter limit passed/.test(String(err))) return new CounterLimitPassed();
    const conflict = pgCode(err) === INVALID_TEXT_REPRESENTATION && new RegExp(`"(${CONFLICT}: [^"]*)"`).exec((err as Error).message);
    return conflict ? new Error(conflict[1]) : err;
  });
}

/** The parts of a write set, each list one statement; the rows of one table are never in two parts. */
function writeParts(w: WriteSet): Part[] {
  const parts: Part[] = [];
  const add = <T>(name: Name, table: Table<T>, rows: readonly Partial<T>[], fields: readonly (keyof T)[] = table.fields) => {
    if (rows.length > 0) parts.push({ name, values: postgres.arrays(table, rows, fields) });
  };
  add("insertUsage", usageRecords, w.usageInserts);
  add("finalUsage", usageRecords, w.usageFinals, FINAL);
  add("insertBalances", orgBalances, w.balanceInserts);
  add("moveBalances", orgBalances, w.balanceDeltas);
  add("putKeySpend", keySpends, w.keySpend);
  add("insertLedger", ledgerEntries, w.ledger, NEW_LEDGER_FIELDS);
  add("putCounters", previewCounters, w.counters);
  add("putIdempotency", idempotencyKeys, w.idempotencyPuts);
  add("deleteIdempotency", idempotencyKeys, w.idempotencyDeletes, KEY.idempotency);
  // After every row the read locked, before the roll-up rows: see docs/architecture.md on the lock order.
  const increments = w.counterIncrements;
  if (increments.length > 0)
    parts.push({ name: "incrementCounters", values: [...postgres.arrays(previewCounters, increments), increments.map((i) => i.limit)] });
  // Last: the roll-up rows are the hottest (one per organization and day), so they are held for the shortest time.
  add("addUsageDaily", usageDaily, w.usageDaily);
  return parts;
}
