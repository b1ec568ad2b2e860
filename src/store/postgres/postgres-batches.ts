import type pg from "pg";
import { Batches, type BatchesOptions } from "../batches.ts";
import { postgresRunner } from "./postgres-accounts.ts";

/**
 * Batch submissions in PostgreSQL (batches.ts): each write one READ COMMITTED transaction; claims lock the rows they
 * take (FOR UPDATE SKIP LOCKED), so that instances claiming at once never take one row, and with a per-organization
 * limit take an advisory lock per organization, so that they count each other's claims.
 */
export class PostgresBatches extends Batches {
  constructor(pool: pg.Pool, options?: BatchesOptions) {
    super(postgresRunner(pool), "postgres", options);
  }
}
