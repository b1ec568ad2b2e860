import Database from "better-sqlite3";

export type SqliteError = InstanceType<typeof Database.SqliteError>;

/** True when `err` is a SQLite error with one of the given extended codes, such as SQLITE_CONSTRAINT_UNIQUE. */
export function isConstraint(err: unknown, ...codes: string[]): err is SqliteError {
  return err instanceof Database.SqliteError && codes.includes(err.code);
}

export const UNIQUE_CODES = ["SQLITE_CONSTRAINT_PRIMARYKEY", "SQLITE_CONSTRAINT_UNIQUE"];
