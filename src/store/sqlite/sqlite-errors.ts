import Database from "better-sqlite3";
import type { StoreFailureKind } from "../store-errors.ts";

export type SqliteError = InstanceType<typeof Database.SqliteError>;

/** True when `err` is a SQLite error with one of the given extended codes, such as SQLITE_CONSTRAINT_UNIQUE. */
export function isConstraint(err: unknown, ...codes: string[]): err is SqliteError {
  return err instanceof Database.SqliteError && codes.includes(err.code);
}

export const UNIQUE_CODES = ["SQLITE_CONSTRAINT_PRIMARYKEY", "SQLITE_CONSTRAINT_UNIQUE"];

const RETRYABLE = /^SQLITE_(BUSY|LOCKED)/;
const UNAVAILABLE = /^SQLITE_(IOERR|FULL|CANTOPEN|READONLY|PROTOCOL)/;
/** better-sqlite3's error (a TypeError without a code) for a statement run on a closed connection. */
const CLOSED = "The database connection is not open";

/** SQLite's storage failures as the port's kinds: busy or locked can run again; I/O, full disk, read-only are outages. */
export function sqliteFailureKind(err: unknown): StoreFailureKind {
  if (typeof err !== "object" || err === null) return "other";
  const code = (err as { code?: unknown }).code;
  if (typeof code !== "string") return err instanceof TypeError && err.message === CLOSED ? "unavailable" : "other";
  return RETRYABLE.test(code) ? "retryable" : UNAVAILABLE.test(code) ? "unavailable" : "other";
}
