import type pg from "pg";
import { Accounts } from "../accounts.ts";
import { MIGRATION_DATA_STEPS } from "../organization-names.ts";
import { postgres } from "../schema/table.ts";
import { runSqlAsync, type SqlRunner, type Statement, type StatementResult } from "../sql-program.ts";
import { FOREIGN_KEY_VIOLATION, hasNul, isUniqueViolation, pgCode, transaction, withClient } from "./postgres-connection.ts";

/** Runs statements on `client`, their `?` placeholders numbered. */
function statementsOf(client: pg.ClientBase): (statement: Statement) => Promise<StatementResult> {
  return async ({ sql, params }) => {
    const result = await client.query(postgres.numbered(sql), params as unknown[]);
    return { rows: result.rows, changes: result.rowCount ?? 0 };
  };
}

/** The columns of a unique violation, from its detail (`Key (name)=(…) already exists.`), as `table.column`. */
function uniqueKey(err: pg.DatabaseError): string {
  return `${err.table}.${/^Key \(([^)]*)\)=/.exec(err.detail ?? "")?.[1] ?? err.constraint}`;
}

export const postgresRunner = (pool: pg.Pool): SqlRunner => ({
  read: (program) => withClient(pool, (c) => runSqlAsync(program(), statementsOf(c))),
  write: (program) => transaction(pool, (c) => runSqlAsync(program(), statementsOf(c))),
  violation: (err) =>
    pgCode(err) === FOREIGN_KEY_VIOLATION
      ? { kind: "foreign_key" }
      : isUniqueViolation(err)
        ? { kind: "unique", key: uniqueKey(err) }
        : null,
  holds: (...texts) => !hasNul(...texts),
});

/** Organizations, API keys and the audit log in PostgreSQL (accounts.ts): each write one READ COMMITTED transaction. */
export class PostgresAccounts extends Accounts {
  constructor(pool: pg.Pool) {
    super(postgresRunner(pool));
  }
}

/** The data step of a migration file, if it has one, on the migrating connection (inside its transaction). */
export async function runPostgresDataStep(client: pg.ClientBase, file: string): Promise<void> {
  const step = MIGRATION_DATA_STEPS[file];
  if (step) await runSqlAsync(step(), statementsOf(client));
}
