import type Database from "better-sqlite3";
import type { Statement } from "better-sqlite3";
import {
  CounterLimitPassed,
  type Snapshot,
  type SnapshotQuery,
  selectClaims,
  snapshotOf,
  sweepReads,
  USAGE_FINAL_FIELDS,
  USAGE_STATE_FIELDS,
  type WriteSet,
} from "../bookkeeping/rows.ts";
import { type DbRow, sqlite } from "../schema/table.ts";
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
import { isConstraint, UNIQUE_CODES } from "./sqlite-errors.ts";

const SWEEP = sweepReads(() => "");

/**
 * The rows of the bookkeeping programs in SQLite: reads by primary key and writes row by row with prepared
 * statements, inside the caller's BEGIN IMMEDIATE transaction (which already holds the database's write lock,
 * so nothing needs locking row by row).
 */
export class SqliteBookRows {
  readonly #counter: Statement<[string, string], DbRow>;
  readonly #usageState: Statement<[string], DbRow>;
  readonly #balance: Statement<[string], DbRow>;
  readonly #keySpend: Statement<[string, string], DbRow>;
  readonly #idempotency: Statement<[string, string], DbRow>;
  readonly #dueInFlight: Statement<[number, number], DbRow>;
  readonly #orphanedInFlight: Statement<[string, number | null, number, number], DbRow>;

  readonly #insertUsage: Statement<unknown[]>;
  readonly #finalUsage: Statement<unknown[]>;
  readonly #insertLedger: Statement<unknown[]>;
  readonly #insertBalance: Statement<unknown[]>;
  readonly #moveBalance: Statement<unknown[]>;
  readonly #putKeySpend: Statement<unknown[]>;
  readonly #putCounter: Statement<unknown[]>;
  readonly #incrementCounter: Statement<unknown[]>;
  readonly #putIdempotency: Statement<unknown[]>;
  readonly #deleteIdempotency: Statement<unknown[]>;
  readonly #addUsageDaily: Statement<unknown[]>;

  constructor(db: Database.Database) {
    this.#counter = db.prepare(`SELECT ${previewCounters.list()} FROM preview_counters WHERE scope = ? AND day = ?`);
    this.#usageState = db.prepare(`SELECT ${usageRecords.list(USAGE_STATE_FIELDS)} FROM usage_records WHERE request_id = ?`);
    // The organization, if it exists, with its balance if it has one.
    this.#balance = db.prepare(
      `SELECT o.id AS org_id, ${orgBalances.list(BALANCE_FIELDS, "b.")} FROM organizations o LEFT JOIN org_balances b ON b.org_id = o.id WHERE o.id = ?`,
    );
    this.#keySpend = db.prepare(`SELECT ${keySpends.list()} FROM key_spend WHERE key_id = ? AND period = ?`);
    this.#idempotency = db.prepare(`${selectClaims()} WHERE i.org_id = ? AND i.key = ?`);
    this.#dueInFlight = db.prepare(SWEEP.dueInFlight);
    this.#orphanedInFlight = db.prepare(SWEEP.orphanedInFlight);

    this.#insertUsage = db.prepare(sqlite.insert(usageRecords));
    this.#finalUsage = db.prepare(
      `UPDATE usage_records SET ${usageRecords.assign(USAGE_FINAL_FIELDS, () => "?")} WHERE request_id = ? AND outcome = 'in_flight'`,
    );
    this.#insertLedger = db.prepare(sqlite.insert(ledgerEntries, NEW_LEDGER_FIELDS));
    this.#insertBalance = db.prepare(sqlite.insert(orgBalances));
    this.#moveBalance = db.prepare(`UPDATE org_balances SET ${orgBalances.assign(BALANCE_FIELDS, (c) => `${c} + ?`)} WHERE org_id = ?`);
    this.#putKeySpend = db.prepare(sqlite.insert(keySpends) + keySpends.onConflictReplace(["keyId", "period"]));
    this.#putCounter = db.prepare(sqlite.insert(previewCounters) + previewCounters.onConflictReplace(["scope", "day"]));
    // One writer: the count read is still the count, so the limit always holds here; checked all the same.
    this.#incrementCounter = db.prepare(
      `${sqlite.insert(previewCounters)} ON CONFLICT (scope, day) DO UPDATE SET count = count + excluded.count WHERE count + excluded.count <= ?`,
    );
    this.#putIdempotency = db.prepare(sqlite.insert(idempotencyKeys) + idempotencyKeys.onConflictReplace(["orgId", "key"]));
    this.#deleteIdempotency = db.prepare("DELETE FROM idempotency_keys WHERE org_id = ? AND key = ?");
    this.#addUsageDaily = db.prepare(addToUsageDaily(`VALUES (${sqlite.placeholders(usageDaily.fields.length)})`));
  }

  read(q: SnapshotQuery): Snapshot {
    const orphans = q.orphanedInFlight;
    return snapshotOf({
      counters: q.counters?.flatMap(({ scope, day }) => this.#counter.all(scope, day)),
      sharedCounters: q.sharedCounters?.flatMap(({ scope, day }) => this.#counter.all(scope, day)),
      usage: q.usage?.flatMap((id) => this.#usageState.all(id)),
      balances: q.balances?.flatMap((orgId) => this.#balance.all(orgId)),
      keySpend: q.keySpend?.flatMap(({ keyId, period }) => this.#keySpend.all(keyId, period)),
      idempotency: q.idempotency?.flatMap(({ orgId, key }) => this.#idempotency.all(orgId, key)),
      dueInFlight: q.dueInFlight && this.#dueInFlight.all(q.dueInFlight.createdBeforeMs, q.dueInFlight.limit),
      orphanedInFlight: orphans && this.#orphanedInFlight.all(orphans.instanceId, orphans.createdBeforeMs, orphans.nowMs, orphans.limit),
    });
  }

  /** Writes the rows; a duplicate key (a request id) fails with StoreConflictError. */
  write(w: WriteSet): void {
    try {
      this.#write(w);
    } catch (err) {
      if (isConstraint(err, ...UNIQUE_CODES)) throw new StoreConflictError(`A row with this key already exists: ${err.message}`);
      throw err;
    }
  }

  #write(w: WriteSet): void {
    for (const u of w.usageInserts) this.#insertUsage.run(...usageRecords.params(sqlite, u));
    for (const f of w.usageFinals) {
      if (this.#finalUsage.run(...usageRecords.params(sqlite, f, USAGE_FINAL_FIELDS), f.requestId).changes !== 1) {
        throw new Error(`The usage record ${JSON.stringify(f.requestId)} was not in flight`);
      }
    }
    // The whole database is locked: a row missing from the snapshot is still missing.
    for (const b of w.balanceInserts) this.#insertBalance.run(...orgBalances.params(sqlite, b));
    for (const b of w.balanceDeltas) {
      if (this.#moveBalance.run(...orgBalances.params(sqlite, b, BALANCE_FIELDS), b.orgId).changes !== 1) {
        throw new Error(`No credit balance for organization ${JSON.stringify(b.orgId)}`);
      }
    }
    for (const k of w.keySpend) this.#putKeySpend.run(...keySpends.params(sqlite, k));
    for (const e of w.ledger) this.#insertLedger.run(...ledgerEntries.params(sqlite, e, NEW_LEDGER_FIELDS));
    for (const c of w.counters) this.#putCounter.run(...previewCounters.params(sqlite, c));
    for (const c of w.counterIncrements) {
      if (this.#incrementCounter.run(...previewCounters.params(sqlite, c), c.limit).changes !== 1) throw new CounterLimitPassed();
    }
    for (const i of w.idempotencyPuts) this.#putIdempotency.run(...idempotencyKeys.params(sqlite, i));
    for (const i of w.idempotencyDeletes) this.#deleteIdempotency.run(i.orgId, i.key);
    for (const d of w.usageDaily) this.#addUsageDaily.run(...usageDaily.params(sqlite, d));
  }
}
