import { setTimeout as sleep } from "node:timers/promises";
import Database from "better-sqlite3";
import { sqliteFailureKind } from "./sqlite-errors.ts";

/** SQLITE_BUSY or SQLITE_LOCKED (any extended code): another connection holds a lock this statement needs. */
export function isSqliteBusy(err: unknown): boolean {
  return err instanceof Database.SqliteError && sqliteFailureKind(err) === "retryable";
}

/**
 * Runs a synchronous write, and while it fails because the database is busy, tries again after a short
 * asynchronous pause (2 ms, doubling up to 50 ms) until `waitMs` has passed; then the busy error is thrown.
 * The event loop keeps running meanwhile, unlike SQLite's own busy handler, which sleeps in the thread.
 */
export async function whileBusy<T>(write: () => T, waitMs: number): Promise<T> {
  const deadline = Date.now() + waitMs;
  for (let pause = 2; ; pause = Math.min(pause * 2, 50)) {
    try {
      return write();
    } catch (err) {
      if (!isSqliteBusy(err) || Date.now() + pause > deadline) throw err;
    }
    await sleep(pause);
  }
}
