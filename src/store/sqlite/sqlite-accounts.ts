import type Database from "better-sqlite3";
import { ACCOUNT_STATEMENTS, Accounts } from "../accounts.ts";
import type { KeyLookupCache } from "../key-lookup-cache.ts";
import { MIGRATION_DATA_STEPS } from "../organization-names.ts";
import type { DbRow } from "../schema/table.ts";
import { runSqlSync, type SqlRunner, type Statement, type StatementResult } from "../sql-program.ts";
import { isConstraint, UNIQUE_CODES } from "./sqlite-errors.ts";

/** Runs statements on `db`, each prepared once (`ahead` at once); booleans are bound as 0/1. */
function statementsOf(db: Database.Database, ahead: readonly string[] = []): (statement: Statement) => StatementResult {
  const prepared = new Map(ahead.map((sql) => [sql, db.prepare<unknown[], DbRow>(sql)]));
  return ({ sql, params }) => {
    const statement = prepared.get(sql) ?? db.prepare<unknown[], DbRow>(sql);
    prepared.set(sql, statement);
    const values = params.map((v) => (typeof v === "boolean" ? Number(v) : v));
    if (!statement.reader) return { rows: [], changes: statement.run(...values).changes };
    const rows = statement.all(...values);
    return { rows, changes: rows.length };
  };
}

/** A SqlRunner on `db`; `ahead`: statements prepared on opening, so that one the schema cannot run fails at once. */
export function sqliteRunner(db: Database.Database, write: <T>(fn: () => T) => Promise<T>, ahead: readonly string[] = []): SqlRunner {
  const run = statementsOf(db, ahead);
  return {
    read: async (program) => runSqlSync(program(), run),
    write: (program) => write(() => db.transaction(() => runSqlSync(program(), run)).immediate()),
    violation: (err) =>
      isConstraint(err, "SQLITE_CONSTRAINT_FOREIGNKEY")
        ? { kind: "foreign_key" }
        : isConstraint(err, ...UNIQUE_CODES)
          ? { kind: "unique", key: err.message.replace(/^UNIQUE constraint failed: /, "") }
          : null,
    holds: () => true,
  };
}

/**
 * Organizations, API keys and the audit log in SQLite (accounts.ts): each write is one BEGIN IMMEDIATE transaction,
 * run through `write` (the store passes a wrapper that waits asynchronously while another process holds the lock).
 */
export class SqliteAccounts extends Accounts {
  /** `found`: the store's kept key lookups, which outlive a connection opened again. */
  constructor(db: Database.Database, write: <T>(fn: () => T) => Promise<T>, found: KeyLookupCache<DbRow>) {
    super(sqliteRunner(db, write, ACCOUNT_STATEMENTS), found);
  }
}

/** The data step of a migration file, if it has one, on the migrating connection (inside its transaction). */
export function runSqliteDataStep(db: Database.Database, file: string): void {
  const step = MIGRATION_DATA_STEPS[file];
  if (step) runSqlSync(step(), statementsOf(db));
}
