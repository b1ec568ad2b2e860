import type pg from "pg";
import type { IdempotencyClaim } from "../store.ts";
import { StoreInputError } from "../store-errors.ts";
import type { ClaimInput, CompleteInput, EntryRow, OwnerInput } from "../idempotency-rows.ts";
import { checkEpochMs, checkHttpStatus, checkText } from "../input-checks.ts";
import { hasNul, transaction, withClient } from "./postgres-connection.ts";

/** A claim finds the row gone (its owner released it) at most this often in a row before giving up. */
const CLAIM_ATTEMPTS = 5;

/**
 * Idempotency keys in PostgreSQL, one row per (organization, key), with the same answers as SqliteIdempotency.
 * A claim first tries `INSERT … ON CONFLICT DO NOTHING` (a new key: claimed); otherwise it locks the existing
 * row with `SELECT … FOR UPDATE` and decides on it, taking it over when its lock passed or it expired. Two
 * concurrent claims of one key therefore serialize on the row (or on the insert), and never both get
 * "claimed" while the lock holds. complete and release are single statements that act only while the row is
 * still the caller's claim (same request_id, in progress).
 */
export class PostgresIdempotency {
  readonly #pool: pg.Pool;

  constructor(pool: pg.Pool) {
    this.#pool = pool;
  }

  async claim(input: ClaimInput): Promise<IdempotencyClaim> {
    checkText(input.orgId, "orgId");
    checkText(input.key, "key");
    checkText(input.requestHash, "requestHash");
    checkText(input.requestId, "requestId");
    checkEpochMs(input.nowMs, "nowMs");
    checkEpochMs(input.lockUntilMs, "lockUntilMs");
    checkEpochMs(input.expiresAtMs, "expiresAtMs");
    return transaction(this.#pool, async (c): Promise<IdempotencyClaim> => {
      for (let attempt = 1; ; attempt++) {
        const inserted = await c.query(
          "INSERT INTO idempotency_keys (org_id, key, request_hash, request_id, state, lock_until_ms, expires_at_ms) " +
            "VALUES ($1, $2, $3, $4, 'in_progress', $5, $6) ON CONFLICT (org_id, key) DO NOTHING",
          [input.orgId, input.key, input.requestHash, input.requestId, input.lockUntilMs, input.expiresAtMs],
        );
        if (inserted.rowCount === 1) return { kind: "claimed" };
        const row = (
          await c.query<EntryRow>(
            "SELECT request_hash, request_id, state, response_status, response_body, response_request_id, lock_until_ms, expires_at_ms " +
              "FROM idempotency_keys WHERE org_id = $1 AND key = $2 FOR UPDATE",
            [input.orgId, input.key],
          )
        ).rows[0];
        if (!row) {
          // Released between the insert and the select: try the insert again.
          if (attempt < CLAIM_ATTEMPTS) continue;
          throw new Error(`The idempotency key kept changing while it was being claimed (${CLAIM_ATTEMPTS} attempts)`);
        }
        const expired = row.expires_at_ms <= input.nowMs;
        if (!expired && row.state === "completed") {
          if (row.request_hash !== input.requestHash) return { kind: "mismatch" };
          return { kind: "replay", response: { status: row.response_status!, body: row.response_body!, requestId: row.response_request_id! } };
        }
        if (!expired && row.lock_until_ms > input.nowMs) return { kind: "in_progress" };
        // An expired entry, or a claim whose lock passed (its process died or hung): a new claim.
        await c.query(
          "UPDATE idempotency_keys SET request_hash = $1, request_id = $2, state = 'in_progress', response_status = NULL, response_body = NULL, " +
            "response_request_id = NULL, lock_until_ms = $3, expires_at_ms = $4 WHERE org_id = $5 AND key = $6",
          [input.requestHash, input.requestId, input.lockUntilMs, input.expiresAtMs, input.orgId, input.key],
        );
        return { kind: "claimed" };
      }
    });
  }

  async complete(input: CompleteInput): Promise<void> {
    checkHttpStatus(input.response.status, "response.status");
    if (typeof input.response.body !== "string") throw new StoreInputError("response.body must be a string", "response.body");
    checkText(input.response.requestId, "response.requestId");
    // No claim is held under text with U+0000: nothing to complete.
    if (hasNul(input.orgId, input.key, input.requestId)) return;
    const r = input.response;
    await withClient(this.#pool, (c) =>
      c.query(
        "UPDATE idempotency_keys SET state = 'completed', response_status = $1, response_body = $2, response_request_id = $3 " +
          "WHERE org_id = $4 AND key = $5 AND request_id = $6 AND state = 'in_progress'",
        [r.status, r.body, r.requestId, input.orgId, input.key, input.requestId],
      ),
    );
  }

  async release(input: OwnerInput): Promise<void> {
    if (hasNul(input.orgId, input.key, input.requestId)) return;
    await withClient(this.#pool, (c) =>
      c.query("DELETE FROM idempotency_keys WHERE org_id = $1 AND key = $2 AND request_id = $3 AND state = 'in_progress'", [
        input.orgId,
        input.key,
        input.requestId,
      ]),
    );
  }
}
