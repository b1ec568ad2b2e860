import type Database from "better-sqlite3";
import type { Statement } from "better-sqlite3";
import type { IdempotencyClaim } from "../store.ts";
import { StoreInputError } from "../store-errors.ts";
import type { ClaimInput, CompleteInput, EntryRow, OwnerInput } from "../idempotency-rows.ts";
import { checkEpochMs, checkHttpStatus, checkText } from "../input-checks.ts";

/**
 * Idempotency keys in SQLite, one row per (organization, key). A claim reads the row and inserts or takes
 * it over in one BEGIN IMMEDIATE transaction, so two concurrent requests with one key never both get
 * "claimed" while the lock holds. complete and release act only while the row is still the caller's
 * claim (same request_id, in progress), so a request whose claim was taken over cannot overwrite
 * or drop the new owner's entry.
 */
export class SqliteIdempotency {
  readonly #entry: Statement<[string, string], EntryRow>;
  readonly #insert: Statement<[string, string, string, string, number, number]>;
  readonly #takeOver: Statement<[string, string, number, number, string, string]>;
  readonly #complete: Statement<[number, string, string, string, string, string]>;
  readonly #release: Statement<[string, string, string]>;
  readonly #claimTx: Database.Transaction<(input: ClaimInput) => IdempotencyClaim>;
  readonly #completeTx: Database.Transaction<(input: CompleteInput) => void>;
  readonly #releaseTx: Database.Transaction<(input: OwnerInput) => void>;

  constructor(db: Database.Database) {
    this.#entry = db.prepare(
      "SELECT request_hash, request_id, state, response_status, response_body, response_request_id, lock_until_ms, expires_at_ms " +
        "FROM idempotency_keys WHERE org_id = ? AND key = ?",
    );
    this.#insert = db.prepare(
      "INSERT INTO idempotency_keys (org_id, key, request_hash, request_id, state, lock_until_ms, expires_at_ms) VALUES (?, ?, ?, ?, 'in_progress', ?, ?)",
    );
    this.#takeOver = db.prepare(
      "UPDATE idempotency_keys SET request_hash = ?, request_id = ?, state = 'in_progress', response_status = NULL, response_body = NULL, " +
        "response_request_id = NULL, lock_until_ms = ?, expires_at_ms = ? WHERE org_id = ? AND key = ?",
    );
    this.#complete = db.prepare(
      "UPDATE idempotency_keys SET state = 'completed', response_status = ?, response_body = ?, response_request_id = ? " +
        "WHERE org_id = ? AND key = ? AND request_id = ? AND state = 'in_progress'",
    );
    this.#release = db.prepare("DELETE FROM idempotency_keys WHERE org_id = ? AND key = ? AND request_id = ? AND state = 'in_progress'");

    this.#claimTx = db.transaction((input: ClaimInput): IdempotencyClaim => {
      const row = this.#entry.get(input.orgId, input.key);
      if (!row) {
        this.#insert.run(input.orgId, input.key, input.requestHash, input.requestId, input.lockUntilMs, input.expiresAtMs);
        return { kind: "claimed" };
      }
      const expired = row.expires_at_ms <= input.nowMs;
      if (!expired && row.state === "completed") {
        if (row.request_hash !== input.requestHash) return { kind: "mismatch" };
        return { kind: "replay", response: { status: row.response_status!, body: row.response_body!, requestId: row.response_request_id! } };
      }
      if (!expired && row.lock_until_ms > input.nowMs) return { kind: "in_progress" };
      // An expired entry, or a claim whose lock passed (its process died or hung): a new claim.
      this.#takeOver.run(input.requestHash, input.requestId, input.lockUntilMs, input.expiresAtMs, input.orgId, input.key);
      return { kind: "claimed" };
    });
    this.#completeTx = db.transaction((input: CompleteInput): void => {
      const r = input.response;
      this.#complete.run(r.status, r.body, r.requestId, input.orgId, input.key, input.requestId);
    });
    this.#releaseTx = db.transaction((input: OwnerInput): void => {
      this.#release.run(input.orgId, input.key, input.requestId);
    });
  }

  claim(input: ClaimInput): IdempotencyClaim {
    checkText(input.orgId, "orgId");
    checkText(input.key, "key");
    checkText(input.requestHash, "requestHash");
    checkText(input.requestId, "requestId");
    checkEpochMs(input.nowMs, "nowMs");
    checkEpochMs(input.lockUntilMs, "lockUntilMs");
    checkEpochMs(input.expiresAtMs, "expiresAtMs");
    return this.#claimTx.immediate(input);
  }

  complete(input: CompleteInput): void {
    checkHttpStatus(input.response.status, "response.status");
    if (typeof input.response.body !== "string") throw new StoreInputError("response.body must be a string", "response.body");
    checkText(input.response.requestId, "response.requestId");
    this.#completeTx.immediate(input);
  }

  release(input: OwnerInput): void {
    this.#releaseTx.immediate(input);
  }
}
