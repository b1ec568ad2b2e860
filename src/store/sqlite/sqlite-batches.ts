import type Database from "better-sqlite3";
import { Batches, type BatchesOptions } from "../batches.ts";
import { sqliteRunner } from "./sqlite-accounts.ts";

/**
 * Batch submissions in SQLite (batches.ts): each write one BEGIN IMMEDIATE transaction, run through `write` (the store
 * passes a wrapper that waits asynchronously while another process holds the lock). One process serves a SQLite
 * database, so claims need no row locks.
 */
export class SqliteBatches extends Batches {
  constructor(db: Database.Database, write: <T>(fn: () => T) => Promise<T>, options?: BatchesOptions) {
    super(sqliteRunner(db, write), "sqlite", options);
  }
}
