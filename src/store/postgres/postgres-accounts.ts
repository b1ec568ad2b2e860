import { createHash } from "node:crypto";
import type pg from "pg";
import { ACCOUNT_STATEMENTS, Accounts } from "../accounts.ts";
import { MIGRATION_DATA_STEPS } from "../organization-names.ts";
import { postgres } from "../schema/table.ts";
import { runSqlAsync, type SqlRunner, type Statement, type StatementResult } from "../sql-program.ts";
import { FOREIGN_KEY_VIOLATION, hasNul, isUniqueViolation, pgCode, transaction, withClient } from "./postgres-connection.ts";

/**
 * Runs statements on `client`, their `?` placeholders numbered. A statement of `prepared` goes by its name, so that each
 * connection parses it once and PostgreSQL may keep its plan (a key lookup runs for every few requests: unnamed, it
 * was parsed and planned every time); any other runs unnamed.
 */
function statementsOf(
  client: pg.ClientBase,
  prepared: ReadonlyMap<string, { name: string; text: string }> = new Map(),
): (statement: Statement) => Promise<StatementResult> {
  return async ({ sql, params }) => {
    const result = await client.query(prepared.get(sql) ?? postgres.numbered(sql), params as unknown[]);
    return { rows: result.rows, changes: result.rowCount ?? 0 };
  };
}

/** The columns of a unique violation, from its detail (`Key (name)=(…) already exists.`), as `table.column`. */
function uniqueKey(err: pg.DatabaseError): string {
  return `${err.table}.${/^Key \(([^)]*)\)=/.exec(err.detail ?? "")?.[1] ?? err.constraint}`;
}

/**
 * A SqlRunner on `pool`; `prepared`: statements run by name, one prepared statement each per connection (a fixed set).
 * The name comes from the text, so that runners sharing a pool never give one name to two texts (pg refuses that).
 */
export function postgresRunner(pool: pg.Pool, prepared: readonly string[] = []): SqlRunner {
  // Named and numbered once, not at every run.
  const names = new Map(
    prepared.map((sql) => [
      sql,
      { name: `tds_a_${createHash("sha256").update(sql).digest("hex").slice(0, 24)}`, text: postgres.numbered(sql) },
    ]),
  );
  return {
    read: (program) => withClient(pool, (c) => runSqlAsync(program(), statementsOf(c, names))),
    write: (program) => transaction(pool, (c) => runSqlAsync(program(), statementsOf(c, names))),
    violation: (err) =>
      pgCode(err) === FOREIGN_KEY_VIOLATION
        ? { kind: "foreign_key" }
        : isUniqueViolation(err)
          ? { kind: "unique", key: uniqueKey(err) }
          : null,
    holds: (...texts) => !hasNul(...texts),
  };
}

/** Organizations, API keys and the audit log in PostgreSQL (accounts.ts): each write one READ COMMITTED transaction. */
export class PostgresAccounts extends Accounts {
  constructor(pool: pg.Pool) {
    super(postgresRunner(pool, ACCOUNT_STATEMENTS));
  }
}

/** The data step of a migration file, if it has one, on the migrating connection (inside its transaction). */
export async function runPostgresDataStep(client: pg.ClientBase, file: string): Promise<void> {
  const step = MIGRATION_DATA_STEPS[file];
  if (step) await runSqlAsync(step(), statementsOf(client));
}
