import type { DbRow } from "./schema/table.ts";

/**
 * Storage logic written once for both databases: a program yields statements written with `?` placeholders (booleans
 * as booleans, null as null) and receives each one's rows and number of changed rows. An adapter runs programs with a
 * `SqlRunner`: SQLite synchronously inside its transaction, PostgreSQL with awaits (numbering the placeholders).
 */
export interface Statement {
  readonly sql: string;
  readonly params: readonly unknown[];
}

export interface StatementResult {
  readonly rows: DbRow[];
  readonly changes: number;
}

export type SqlProgram<T> = Generator<Statement, T, StatementResult>;

/** What an adapter supplies to run programs. */
export interface SqlRunner {
  /** Runs a program without a transaction of its own: each statement commits by itself (reads). */
  read<T>(program: () => SqlProgram<T>): Promise<T>;
  /** Runs a program in one transaction: its changes commit together or not at all. */
  write<T>(program: () => SqlProgram<T>): Promise<T>;
  /** The unique key (`table.column`) or foreign key a failed statement violated, or null for any other failure. */
  violation(err: unknown): { kind: "unique"; key: string } | { kind: "foreign_key" } | null;
  /** False for text this database cannot hold (PostgreSQL: U+0000): no stored row can equal it. */
  holds(...texts: string[]): boolean;
}

/** The rows of a query. */
export function* query(sql: string, ...params: unknown[]): SqlProgram<DbRow[]> {
  return (yield { sql, params }).rows;
}

/** The number of rows a statement changed. */
export function* execute(sql: string, ...params: unknown[]): SqlProgram<number> {
  return (yield { sql, params }).changes;
}

export function runSqlSync<T>(program: SqlProgram<T>, run: (statement: Statement) => StatementResult): T {
  let step = program.next();
  while (!step.done) step = program.next(run(step.value));
  return step.value;
}

export async function runSqlAsync<T>(program: SqlProgram<T>, run: (statement: Statement) => Promise<StatementResult>): Promise<T> {
  let step = program.next();
  while (!step.done) step = program.next(await run(step.value));
  return step.value;
}
