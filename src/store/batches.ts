import { errorResponse } from "../contract/errors.ts";
import { newRequestId } from "../domain/api-keys.ts";
import { ERROR_CATALOGUE } from "../domain/errors.ts";
import { IDEMPOTENCY_WINDOW_MS } from "../domain/idempotency.ts";
import { decodeCursor, encodeCursor, keysetPage } from "./admin-rows.ts";
import type { BatchLine, BatchRecord, BatchResult, ClaimedRequest } from "./batches/batch-rows.ts";
import { checkAmount, checkCount, checkEpochMs, checkHttpStatus, checkPageLimit, checkText } from "./input-checks.ts";
import type { DbRow } from "./schema/table.ts";
import { BATCH_FIELDS, batches } from "./schema/tables.ts";
import { execute, query, type SqlProgram, type SqlRunner } from "./sql-program.ts";
import { StoreConflictError, StoreInputError } from "./store-errors.ts";
import { badCursor } from "./usage-cursor.ts";

export type { BatchLine, BatchRecord, BatchResult, BatchStatus, ClaimedRequest } from "./batches/batch-rows.ts";

/**
 * The most request rows one statement or transaction ends or deletes (cancel, expiry, drop, purge): larger work is
 * done in several short transactions, so that SQLite's writer is never held long and no PostgreSQL statement nears
 * its statement_timeout.
 */
export const BATCH_ROWS_PER_CHUNK = 1000;

/** The most lines one addLines call writes, and the most UTF-8 bytes of their custom_ids and bodies. */
export const MAX_LINES_PER_CALL = 1000;
export const MAX_LINE_BYTES_PER_CALL = 8 * 1024 * 1024;

/** The most requests one finishRequests call finishes. */
export const MAX_FINISHES_PER_CALL = 64;

/** The most results one results() page holds. */
export const MAX_RESULTS_PAGE = 1000;

/** The most active batches one claim looks at, oldest first. */
const ACTIVE_BATCHES_SCANNED = 200;

/** The most lines one INSERT statement of addLines writes; more are written by several, in its one transaction. */
const LINES_PER_STATEMENT = 128;

export interface BeginBatchInput {
  id: string;
  orgId: string;
  keyId: string;
  model: string | null;
  nowMs: number;
  expiresAtMs: number;
}

export interface OpenBatchInput {
  batchId: string;
  /** The number of lines written: checked against the batch's count. */
  total: number;
  inputBytes: number;
  nowMs: number;
  /** The submission's Idempotency-Key and the SHA-256 of its whole body (known once the upload has been read). */
  idempotency: { key: string; requestHash: string } | null;
}

/**
 * `opened`: the batch is queued (completed at once when it has no line). `replayed`: a batch of the organization
 * created less than IDEMPOTENCY_WINDOW_MS ago has the key and the same hash: that batch, and the one being opened
 * was dropped (dropBatch). `mismatch`: the key was used with another body; the batch being opened was dropped.
 */
export type OpenBatchOutcome = { kind: "opened" | "replayed"; batch: BatchRecord } | { kind: "mismatch" };

export interface ClaimInput {
  instanceId: string;
  nowMs: number;
  leaseUntilMs: number;
  /** The most requests to claim. */
  limit: number;
  /**
   * The most claims an organization may hold at once (live leases of every instance). Exact in both dialects: on
   * PostgreSQL the claims of an organization's batches are serialized by an advisory lock per organization.
   */
  perOrgLimit?: number;
}

/** One claim of a request: its batch, its position and the request id it is claimed under. */
export interface ClaimRef {
  batchId: string;
  position: number;
  requestId: string;
}

function checkClaimRef(ref: ClaimRef): void {
  checkText(ref.batchId, "batchId");
  checkCount(ref.position, "position");
  checkText(ref.requestId, "requestId");
}

export interface FinishInput {
  batchId: string;
  position: number;
  /** The request's id (every claim of a request has the same): a finish naming another id changes nothing. */
  requestId: string;
  /** Succeeded when 200, failed otherwise. */
  status: number;
  /** JSON text of the answer. */
  body: string;
  costMicrousd: number;
  nowMs: number;
}

export interface PurgeInput {
  /** Ended batches whose end is before this are deleted, with their requests. */
  endedBeforeMs: number;
  /** Uploads not written to since before this (their process died) are deleted, with their lines. */
  untouchedBeforeMs: number;
  /** The most batches deleted, of each kind. */
  limit: number;
}

/** A repeated custom_id among a batch's lines. */
export class DuplicateCustomIdError extends StoreConflictError {
  constructor(
    readonly customId: string,
    /** 0-based positions among the batch's requests. */
    readonly position: number,
    readonly firstPosition: number,
  ) {
    super(`custom_id ${JSON.stringify(customId)} of request ${position} repeats request ${firstPosition} (0-based positions)`);
    this.name = "DuplicateCustomIdError";
  }
}

const BATCH_COLUMNS = batches.list(BATCH_FIELDS);
const SELECT_BATCHES = `SELECT ${BATCH_COLUMNS} FROM batches`;
const toBatch = (row: DbRow): BatchRecord => batches.fromRow(row, BATCH_FIELDS);

/** The holder of a deferred claim: no instance renews it, so any instance claims it again once its lease ends. */
export const DEFERRED = "deferred";

/** The statuses in which requests remain to claim or to finish; written as the partial index batches_active is. */
const ACTIVE = "status IN ('queued', 'running', 'cancelling')";
/** A request still to run or finish; written as the partial index batch_requests_open is. */
const OPEN_REQUEST = "state <> 'done'";

/** Up to `?` positions of batch `?` matching `condition`, in input order. */
const chunkOf = (condition: string) => `SELECT position FROM batch_requests WHERE batch_id = ? AND ${condition} ORDER BY position LIMIT ?`;

const SQL = {
  insertBatch: `INSERT INTO batches (id, org_id, key_id, model, status, created_at_ms, expires_at_ms, touched_at_ms)
    VALUES (?, ?, ?, ?, 'validating', ?, ?, ?)`,
  batchById: `${SELECT_BATCHES} WHERE id = ?`,
  /** A batch the API shows: the organization's own, and not an upload being read. */
  visibleBatch: `${SELECT_BATCHES} WHERE id = ? AND org_id = ? AND status <> 'validating'`,
  keyedBatch: `SELECT ${BATCH_COLUMNS}, request_hash FROM batches WHERE org_id = ? AND idempotency_key = ?`,
  forgetKey: "UPDATE batches SET idempotency_key = NULL, request_hash = NULL WHERE id = ?",
  positionOfCustomId: "SELECT position FROM batch_requests WHERE batch_id = ? AND custom_id = ?",
  touch: "UPDATE batches SET total = total + ?, touched_at_ms = ? WHERE id = ? AND status = 'validating'",
  open: `UPDATE batches SET status = ?, input_bytes = ?, idempotency_key = ?, request_hash = ?, ended_at_ms = ?
    WHERE id = ? AND status = 'validating'`,
  listFirst: `${SELECT_BATCHES} WHERE org_id = ? AND status <> 'validating' ORDER BY created_at_ms DESC, id DESC`,
  listAfter: `${SELECT_BATCHES} WHERE org_id = ? AND status <> 'validating' AND (created_at_ms, id) < (?, ?) ORDER BY created_at_ms DESC, id DESC`,
  activeBatches: `SELECT id, org_id, key_id, model, status, expires_at_ms FROM batches WHERE ${ACTIVE}
    ORDER BY created_at_ms, id LIMIT ${ACTIVE_BATCHES_SCANNED}`,
  liveClaimsByOrg: `SELECT b.org_id AS org_id, count(*) AS n FROM batch_requests r JOIN batches b ON b.id = r.batch_id
    WHERE r.state = 'claimed' AND r.lease_until_ms >= ? GROUP BY b.org_id`,
  /** Serializes the claims of the given organizations (a JSON array of ids), each lock taken once, in one order. */
  lockOrganizations: `SELECT pg_advisory_xact_lock(k) FROM (SELECT DISTINCT hashtextextended(o, 0) AS k
    FROM jsonb_array_elements_text(?::jsonb) AS t(o) ORDER BY k) AS keys`,
  startBatch: "UPDATE batches SET status = 'running', started_at_ms = ? WHERE id = ? AND status = 'queued'",
  renewClaims: "UPDATE batch_requests SET lease_until_ms = ? WHERE state = 'claimed' AND claimed_by = ?",
  releaseClaims: "UPDATE batch_requests SET lease_until_ms = 0 WHERE state = 'claimed' AND claimed_by = ?",
  releaseClaimsOfOthers: "UPDATE batch_requests SET lease_until_ms = 0 WHERE state = 'claimed' AND claimed_by <> ?",
  deferClaim: `UPDATE batch_requests SET claimed_by = '${DEFERRED}', lease_until_ms = ?
    WHERE batch_id = ? AND position = ? AND state = 'claimed' AND request_id = ?`,
  reissueClaim: "UPDATE batch_requests SET request_id = ? WHERE batch_id = ? AND position = ? AND state = 'claimed' AND request_id = ?",
  finishRow: `UPDATE batch_requests SET state = 'done', result_status = ?, result_body = ?, cost_microusd = ?, finished_at_ms = ?
    WHERE batch_id = ? AND position = ? AND state = 'claimed' AND request_id = ?`,
  /**
   * Up to `?` pending requests end without running (cancelled or expired): failed, nothing charged, no request id.
   * `state = 'pending'` is checked again on the rows themselves: one claimed meanwhile is left to its claim.
   */
  endPending: `UPDATE batch_requests SET state = 'done', result_status = ?, result_body = ?, cost_microusd = 0, finished_at_ms = ?
    WHERE batch_id = ? AND state = 'pending' AND position IN (${chunkOf(`${OPEN_REQUEST} AND state = 'pending'`)})`,
  /**
   * Adds finished requests to the batch's counts and cost; the batch ends with its last request: cancelled when it
   * was cancelling, expired when some request never ran (it expired), else completed. SET reads the old values.
   */
  countFinished: `UPDATE batches SET succeeded = succeeded + ?, failed = failed + ?, expired = expired + ?,
    cost_microusd = cost_microusd + ?,
    status = CASE WHEN succeeded + failed + ? < total THEN status
      WHEN status = 'cancelling' THEN 'cancelled'
      WHEN expired + ? > 0 THEN 'expired'
      ELSE 'completed' END,
    ended_at_ms = CASE WHEN succeeded + failed + ? < total THEN ended_at_ms ELSE ? END
    WHERE id = ?`,
  startCancelling: "UPDATE batches SET status = 'cancelling' WHERE id = ? AND status IN ('queued', 'running')",
  /** Batches with pending requests to end: cancels not finished (a process died between chunks) and ended windows. */
  dueToEnd: `SELECT id, status FROM batches WHERE ${ACTIVE} AND (status = 'cancelling' OR expires_at_ms <= ?)
    ORDER BY created_at_ms, id LIMIT ?`,
  results: `SELECT position, custom_id, request_id, result_status, result_body, cost_microusd FROM batch_requests
    WHERE batch_id = ? AND position > ? AND state = 'done' ORDER BY position LIMIT ?`,
  deleteRows: `DELETE FROM batch_requests WHERE batch_id = ? AND position IN (${chunkOf("position >= 0")})`,
  deleteBatch: "DELETE FROM batches WHERE id = ?",
  endedBefore: "SELECT id FROM batches WHERE ended_at_ms IS NOT NULL AND ended_at_ms < ? ORDER BY ended_at_ms LIMIT 1",
  untouchedBefore: "SELECT id FROM batches WHERE status = 'validating' AND touched_at_ms < ? ORDER BY touched_at_ms LIMIT 1",
  isEndedBefore: "SELECT id FROM batches WHERE id = ? AND ended_at_ms IS NOT NULL AND ended_at_ms < ?",
  isUntouchedBefore: "SELECT id FROM batches WHERE id = ? AND status = 'validating' AND touched_at_ms < ?",
  isValidating: "SELECT id FROM batches WHERE id = ? AND status = 'validating'",
};

/** `INSERT … VALUES (…), (…)` of `count` lines. */
const insertLines = (count: number) =>
  `INSERT INTO batch_requests (batch_id, position, custom_id, body) VALUES ${Array(count).fill("(?, ?, ?, ?)").join(", ")}`;

/**
 * Claims up to `?` claimable requests of batch `?` in input order, in one statement: claimed requests whose lease
 * ended (any batch), and pending ones when the batch may start new requests (the boolean). A request keeps its id;
 * one claimed for the first time takes the k-th of the JSON array of new ids, k its rank among the claimed.
 * PostgreSQL locks the rows it takes and skips those another claim holds.
 */
function claimStatement(dialect: "sqlite" | "postgres"): string {
  const newId = dialect === "postgres" ? "(?::jsonb) ->> (c.k - 1)::int" : "json_extract(?, '$[' || (c.k - 1) || ']')";
  const lock = dialect === "postgres" ? " FOR UPDATE SKIP LOCKED" : "";
  return `UPDATE batch_requests AS r SET state = 'claimed', claimed_by = ?, lease_until_ms = ?,
      request_id = COALESCE(r.request_id, ${newId})
    FROM (SELECT picked_position, row_number() OVER (ORDER BY picked_position) AS k
      FROM (SELECT position AS picked_position FROM batch_requests
        WHERE batch_id = ? AND ${OPEN_REQUEST} AND ((state = 'claimed' AND lease_until_ms < ?) OR (state = 'pending' AND ?))
        ORDER BY position LIMIT ?${lock}) AS p) AS c
    WHERE r.batch_id = ? AND r.position = c.picked_position
    RETURNING position, custom_id, body, request_id`;
}

/** The result body of a request that never ran: the error body the API answers for the code. */
const neverRan = (code: "batch_cancelled" | "batch_expired") => ({
  status: ERROR_CATALOGUE[code].status,
  body: JSON.stringify(errorResponse(code)),
});
const CANCELLED = neverRan("batch_cancelled");
const EXPIRED = neverRan("batch_expired");

/** Adds finished requests (`expired` of the failed ones ended by the window) and their cost, ending the batch with its last. */
function* countFinished(
  batchId: string,
  counts: { succeeded: number; failed: number; expired: number; costMicrousd: number },
  nowMs: number,
): SqlProgram<void> {
  const finished = counts.succeeded + counts.failed;
  yield* execute(
    SQL.countFinished,
    counts.succeeded,
    counts.failed,
    counts.expired,
    counts.costMicrousd,
    finished,
    counts.expired,
    finished,
    nowMs,
    batchId,
  );
}

function* batchById(id: string): SqlProgram<BatchRecord | null> {
  const [row] = yield* query(SQL.batchById, id);
  return row ? toBatch(row) : null;
}

/** The batch submissions of a Store (`store.batches`), written once for both databases by `Batches` (its methods say what each does). */
export interface BatchStore {
  beginBatch(input: BeginBatchInput): Promise<BatchRecord>;
  findIdempotentBatch(orgId: string, key: string, nowMs: number): Promise<{ batch: BatchRecord; requestHash: string } | null>;
  addLines(batchId: string, lines: readonly BatchLine[], nowMs: number): Promise<void>;
  openBatch(input: OpenBatchInput): Promise<OpenBatchOutcome>;
  dropBatch(batchId: string): Promise<boolean>;
  getBatch(orgId: string, id: string): Promise<BatchRecord | null>;
  listBatches(orgId: string, page: { limit: number; cursor?: string }): Promise<{ batches: BatchRecord[]; nextCursor: string | null }>;
  claimRequests(input: ClaimInput): Promise<ClaimedRequest[]>;
  renewClaims(instanceId: string, leaseUntilMs: number): Promise<number>;
  releaseClaims(instanceId: string): Promise<number>;
  releaseClaimsOfOthers(instanceId: string): Promise<number>;
  deferClaim(input: ClaimRef & { untilMs: number }): Promise<boolean>;
  reissueClaim(input: ClaimRef & { newRequestId: string }): Promise<boolean>;
  finishRequest(input: FinishInput): Promise<boolean>;
  finishRequests(inputs: readonly FinishInput[]): Promise<boolean[]>;
  cancelBatch(orgId: string, id: string, nowMs: number): Promise<BatchRecord | null>;
  expireBatches(nowMs: number, limit?: number): Promise<number>;
  results(orgId: string, id: string, page: { afterPosition: number; limit: number }): Promise<BatchResult[] | null>;
  purgeBatches(input: PurgeInput): Promise<number>;
}

export interface BatchesOptions {
  /** The id of a request at its first claim (default: the API's newRequestId). */
  newRequestId?: () => string;
}

/**
 * Batch submissions and their requests, written once for both databases. Every transaction is short and touches a
 * bounded number of rows: addLines at most MAX_LINES_PER_CALL, claims at most their limit, and the work on a whole
 * batch (cancel, expiry, drop, purge) goes in transactions of BATCH_ROWS_PER_CHUNK rows, its status set first.
 *
 * A request gets its request id at its first claim and keeps it when another instance takes it over after the lease
 * ended: the runner runs it with the Idempotency-Key `batch <batch id>:<position>`, so a re-run replays the first and
 * both holders of a request hold the same decision. Whichever finishes first writes the result.
 */
export class Batches implements BatchStore {
  readonly #claim: string;
  readonly #postgres: boolean;
  readonly #newRequestId: () => string;

  constructor(
    private readonly db: SqlRunner,
    dialect: "sqlite" | "postgres",
    options: BatchesOptions = {},
  ) {
    this.#claim = claimStatement(dialect);
    this.#postgres = dialect === "postgres";
    this.#newRequestId = options.newRequestId ?? newRequestId;
  }

  /** Creates a `validating` batch: its lines are added by addLines, then it is opened (or dropped). */
  async beginBatch(input: BeginBatchInput): Promise<BatchRecord> {
    for (const field of ["id", "orgId", "keyId"] as const) checkText(input[field], field);
    if (input.model !== null) checkText(input.model, "model");
    checkEpochMs(input.nowMs, "nowMs");
    checkEpochMs(input.expiresAtMs, "expiresAtMs");
    if (input.expiresAtMs <= input.nowMs) throw new StoreInputError("expiresAtMs must be after nowMs", "expiresAtMs");
    if (!this.db.holds(input.id, input.orgId, input.keyId, input.model ?? ""))
      throw new StoreInputError("ids must not contain U+0000", "id");
    try {
      return await this.db.write(function* () {
        const { id, orgId, keyId, model, nowMs, expiresAtMs } = input;
        yield* execute(SQL.insertBatch, id, orgId, keyId, model, nowMs, expiresAtMs, nowMs);
        return (yield* batchById(id))!;
      });
    } catch (err) {
      const violation = this.db.violation(err);
      if (violation?.kind === "foreign_key") throw new StoreInputError(`No organization with id ${JSON.stringify(input.orgId)}`, "orgId");
      if (violation?.kind === "unique") throw new StoreConflictError(`A batch with id ${JSON.stringify(input.id)} already exists`);
      throw err;
    }
  }

  /** The organization's batch opened with this Idempotency-Key less than the window ago, with its body's hash. */
  async findIdempotentBatch(orgId: string, key: string, nowMs: number): Promise<{ batch: BatchRecord; requestHash: string } | null> {
    if (!this.db.holds(orgId, key)) return null;
    const [row] = await this.db.read(() => query(SQL.keyedBatch, orgId, key));
    if (!row || (row.created_at_ms as number) <= nowMs - IDEMPOTENCY_WINDOW_MS) return null;
    return { batch: toBatch(row), requestHash: row.request_hash as string };
  }

  /**
   * Writes lines of a validating batch in one transaction and counts them in its total; `nowMs` is its last write
   * (the purge deletes uploads untouched for long). At most MAX_LINES_PER_CALL lines of at most
   * MAX_LINE_BYTES_PER_CALL bytes (custom_ids and bodies, UTF-8): the caller splits larger uploads. A custom_id
   * already used in the batch (or twice in `lines`) is a DuplicateCustomIdError and nothing of `lines` is written.
   */
  async addLines(batchId: string, lines: readonly BatchLine[], nowMs: number): Promise<void> {
    checkText(batchId, "batchId");
    checkEpochMs(nowMs, "nowMs");
    if (lines.length > MAX_LINES_PER_CALL)
      throw new StoreInputError(`lines: at most ${MAX_LINES_PER_CALL} a call, not ${lines.length}`, "lines");
    const seen = new Map<string, number>();
    let bytes = 0;
    for (const { position, customId, body } of lines) {
      checkCount(position, "position");
      checkText(customId, "customId");
      if (typeof body !== "string") throw new StoreInputError("body must be JSON text", "body");
      if (!this.db.holds(customId, body)) throw new StoreInputError("custom_id and body must not contain U+0000", "customId");
      bytes += Buffer.byteLength(customId) + Buffer.byteLength(body);
      const first = seen.get(customId);
      if (first !== undefined) throw new DuplicateCustomIdError(customId, position, first);
      seen.set(customId, position);
    }
    if (bytes > MAX_LINE_BYTES_PER_CALL)
      throw new StoreInputError(`lines: at most ${MAX_LINE_BYTES_PER_CALL} bytes a call, not ${bytes}`, "lines");
    try {
      await this.db.write(function* () {
        if ((yield* execute(SQL.touch, lines.length, nowMs, batchId)) === 0)
          throw new StoreConflictError(`Batch ${JSON.stringify(batchId)} is not being uploaded`);
        for (let i = 0; i < lines.length; ) {
          const count = Math.min(LINES_PER_STATEMENT, 2 ** Math.floor(Math.log2(lines.length - i)));
          const params = lines.slice(i, i + count).flatMap((l) => [batchId, l.position, l.customId, l.body]);
          yield* execute(insertLines(count), ...params);
          i += count;
        }
      });
    } catch (err) {
      if (this.db.violation(err)?.kind !== "unique") throw err;
      for (const { position, customId } of lines) {
        const [row] = await this.db.read(() => query(SQL.positionOfCustomId, batchId, customId));
        if (row) throw new DuplicateCustomIdError(customId, position, row.position as number);
      }
      throw new StoreConflictError(`A request of batch ${JSON.stringify(batchId)} was written twice`);
    }
  }

  /**
   * Opens a validating batch (`queued`), or answers the batch its Idempotency-Key already names (see
   * OpenBatchOutcome; the validating batch is then dropped).
   */
  async openBatch(input: OpenBatchInput): Promise<OpenBatchOutcome> {
    checkText(input.batchId, "batchId");
    checkCount(input.total, "total");
    checkCount(input.inputBytes, "inputBytes");
    checkEpochMs(input.nowMs, "nowMs");
    const { idempotency } = input;
    if (idempotency !== null) {
      checkText(idempotency.key, "idempotency.key");
      checkText(idempotency.requestHash, "idempotency.requestHash");
      if (!this.db.holds(idempotency.key)) throw new StoreInputError("idempotency.key must not contain U+0000", "idempotency.key");
    }
    const program = function* (): SqlProgram<OpenBatchOutcome> {
      const batch = yield* batchById(input.batchId);
      if (batch?.status !== "validating") throw new StoreConflictError(`Batch ${JSON.stringify(input.batchId)} is not being uploaded`);
      if (idempotency !== null) {
        const [keyed] = yield* query(SQL.keyedBatch, batch.orgId, idempotency.key);
        if (keyed && (keyed.created_at_ms as number) > input.nowMs - IDEMPOTENCY_WINDOW_MS) {
          return keyed.request_hash === idempotency.requestHash ? { kind: "replayed", batch: toBatch(keyed) } : { kind: "mismatch" };
        }
        // A key older than the window may name a new batch.
        if (keyed) yield* execute(SQL.forgetKey, keyed.id);
      }
      if (batch.total !== input.total) throw new StoreInputError(`total is ${input.total} but the batch has ${batch.total} lines`, "total");
      const empty = input.total === 0;
      yield* execute(
        SQL.open,
        empty ? "completed" : "queued",
        input.inputBytes,
        idempotency?.key ?? null,
        idempotency?.requestHash ?? null,
        empty ? input.nowMs : null,
        batch.id,
      );
      return { kind: "opened", batch: (yield* batchById(batch.id))! };
    };
    let outcome: OpenBatchOutcome;
    try {
      outcome = await this.db.write(program);
    } catch (err) {
      // Another submission with the key was opened after this one looked: this one answers as a replay of it.
      if (idempotency === null || this.db.violation(err)?.kind !== "unique") throw err;
      outcome = await this.db.write(program);
    }
    if (outcome.kind !== "opened") await this.dropBatch(input.batchId);
    return outcome;
  }

  /**
   * Deletes a validating batch and its lines (an upload refused, failed or replayed), BATCH_ROWS_PER_CHUNK lines a
   * transaction, the batch row with the last; false when there is no validating batch of that id.
   */
  async dropBatch(batchId: string): Promise<boolean> {
    if (!this.db.holds(batchId)) return false;
    return this.#deleteInChunks(batchId, SQL.isValidating, []);
  }

  /**
   * Deletes batch `id` while `stillSql` (its parameters: the id, then `stillParams`) finds it: its rows in chunks,
   * then the batch row in the transaction of the last chunk. True when the batch row was deleted.
   */
  async #deleteInChunks(id: string, stillSql: string, stillParams: unknown[]): Promise<boolean> {
    for (;;) {
      const outcome = await this.db.write(function* () {
        if ((yield* query(stillSql, id, ...stillParams)).length === 0) return "gone" as const;
        const deleted = yield* execute(SQL.deleteRows, id, id, BATCH_ROWS_PER_CHUNK);
        if (deleted === BATCH_ROWS_PER_CHUNK) return "more" as const;
        yield* execute(SQL.deleteBatch, id);
        return "deleted" as const;
      });
      if (outcome !== "more") return outcome === "deleted";
    }
  }

  /** The organization's batch; null for another organization's, an unknown id or an upload being read. */
  async getBatch(orgId: string, id: string): Promise<BatchRecord | null> {
    if (!this.db.holds(orgId, id)) return null;
    const [row] = await this.db.read(() => query(SQL.visibleBatch, id, orgId));
    return row ? toBatch(row) : null;
  }

  /** The organization's batches, newest first. */
  async listBatches(
    orgId: string,
    page: { limit: number; cursor?: string },
  ): Promise<{ batches: BatchRecord[]; nextCursor: string | null }> {
    checkPageLimit(page.limit);
    const after = page.cursor === undefined ? undefined : decodeCursor("batch", page.cursor);
    if (after && !this.db.holds(after.id)) throw badCursor();
    if (!this.db.holds(orgId)) return { batches: [], nextCursor: null };
    const [sql, params] = after ? [SQL.listAfter, [orgId, after.position, after.id]] : [SQL.listFirst, [orgId]];
    const cursorOf = (last: BatchRecord) => encodeCursor("batch", last.createdAtMs, last.id);
    const { items, nextCursor } = await this.db.read(() => keysetPage(sql, params, page.limit, toBatch, cursorOf));
    return { batches: items, nextCursor };
  }

  /**
   * Claims up to `limit` requests for `instanceId` until `leaseUntilMs`: oldest batch first (of the
   * ACTIVE_BATCHES_SCANNED oldest active ones), then in input order. Claimable: pending requests of queued or running
   * batches whose completion window has not ended, and claimed requests of any unfinished batch whose lease ended
   * (their instance died: the takeover replays or finishes them). A queued batch becomes running.
   */
  async claimRequests(input: ClaimInput): Promise<ClaimedRequest[]> {
    checkText(input.instanceId, "instanceId");
    checkEpochMs(input.nowMs, "nowMs");
    checkEpochMs(input.leaseUntilMs, "leaseUntilMs");
    checkCount(input.limit, "limit");
    if (input.perOrgLimit !== undefined) checkCount(input.perOrgLimit, "perOrgLimit");
    if (!this.db.holds(input.instanceId)) throw new StoreInputError("instanceId must not contain U+0000", "instanceId");
    if (input.limit === 0) return [];
    const claim = this.#claim;
    const postgres = this.#postgres;
    const newId = this.#newRequestId;
    return this.db.write(function* () {
      const active = yield* query(SQL.activeBatches);
      if (active.length === 0) return [];
      let held: Map<string, number> | null = null;
      if (input.perOrgLimit !== undefined) {
        if (postgres) yield* query(SQL.lockOrganizations, JSON.stringify([...new Set(active.map((b) => b.org_id))]));
        held = new Map((yield* query(SQL.liveClaimsByOrg, input.nowMs)).map((r) => [r.org_id as string, Number(r.n)]));
      }
      const claimed: ClaimedRequest[] = [];
      for (const batch of active) {
        const orgId = batch.org_id as string;
        let room = input.limit - claimed.length;
        if (room <= 0) break;
        if (held && input.perOrgLimit !== undefined) room = Math.min(room, input.perOrgLimit - (held.get(orgId) ?? 0));
        if (room <= 0) continue;
        const startsNew = batch.status !== "cancelling" && (batch.expires_at_ms as number) > input.nowMs;
        const ids = Array.from({ length: room }, newId);
        const rows = yield* query(
          claim,
          input.instanceId,
          input.leaseUntilMs,
          JSON.stringify(ids),
          batch.id,
          input.nowMs,
          startsNew,
          room,
          batch.id,
        );
        rows.sort((a, b) => (a.position as number) - (b.position as number));
        // The k-th row in input order was offered the k-th new id: one that kept an older id was claimed before.
        for (const [k, row] of rows.entries()) {
          claimed.push({
            batchId: batch.id as string,
            position: row.position as number,
            orgId,
            keyId: batch.key_id as string,
            model: batch.model as string | null,
            customId: row.custom_id as string,
            body: row.body as string,
            requestId: row.request_id as string,
            leaseUntilMs: input.leaseUntilMs,
            takenOver: row.request_id !== ids[k],
          });
        }
        if (rows.length > 0 && batch.status === "queued") yield* execute(SQL.startBatch, input.nowMs, batch.id);
        held?.set(orgId, (held.get(orgId) ?? 0) + rows.length);
      }
      return claimed;
    });
  }

  /** Extends the leases of the instance's claims; the number of claims it holds. */
  async renewClaims(instanceId: string, leaseUntilMs: number): Promise<number> {
    checkEpochMs(leaseUntilMs, "leaseUntilMs");
    if (!this.db.holds(instanceId)) return 0;
    return this.db.write(() => execute(SQL.renewClaims, leaseUntilMs, instanceId));
  }

  /** Ends the leases of the instance's claims (it stops): any instance takes them over at once. */
  async releaseClaims(instanceId: string): Promise<number> {
    if (!this.db.holds(instanceId)) return 0;
    return this.db.write(() => execute(SQL.releaseClaims, instanceId));
  }

  /**
   * Ends the leases of claims held by any other instance (at the start of the one process serving a SQLite file:
   * the claims of the processes before it are taken over at once); the number of claims.
   */
  async releaseClaimsOfOthers(instanceId: string): Promise<number> {
    checkText(instanceId, "instanceId");
    if (!this.db.holds(instanceId)) return 0;
    return this.db.write(() => execute(SQL.releaseClaimsOfOthers, instanceId));
  }

  /**
   * Gives a claimed request back until `untilMs` (its decision is still held elsewhere, or storage failed): no
   * instance renews it, and it is claimed again, with its request id, once that time has passed. False when it is
   * no longer claimed under `requestId`.
   */
  async deferClaim(input: ClaimRef & { untilMs: number }): Promise<boolean> {
    checkClaimRef(input);
    checkEpochMs(input.untilMs, "untilMs");
    if (!this.db.holds(input.batchId, input.requestId)) return false;
    const { batchId, position, requestId, untilMs } = input;
    return (await this.db.write(() => execute(SQL.deferClaim, untilMs, batchId, position, requestId))) === 1;
  }

  /**
   * Gives a claimed request a new request id, for a run after an earlier run of it failed (it was recorded, nothing
   * charged): a finish under the old id changes nothing afterwards. False when it is no longer claimed under `requestId`.
   */
  async reissueClaim(input: ClaimRef & { newRequestId: string }): Promise<boolean> {
    checkClaimRef(input);
    checkText(input.newRequestId, "newRequestId");
    if (!this.db.holds(input.batchId, input.requestId, input.newRequestId)) return false;
    const { batchId, position, requestId, newRequestId } = input;
    return (await this.db.write(() => execute(SQL.reissueClaim, newRequestId, batchId, position, requestId))) === 1;
  }

  /**
   * Writes the result of a claimed request (succeeded when its status is 200) and adds it to its batch's counts and
   * cost, ending the batch with its last request. Once: false (nothing changed) when the request already has its
   * result or is not claimed under `requestId`. The instance holding the claim is not checked: after a takeover both
   * holders run the same decision (one request id, one Idempotency-Key), so the first finish is the result.
   */
  async finishRequest(input: FinishInput): Promise<boolean> {
    const [written] = await this.finishRequests([input]);
    return written!;
  }

  /**
   * finishRequest of up to MAX_FINISHES_PER_CALL requests in one transaction (each batch's counts updated once);
   * whether each was written, in the order given.
   */
  async finishRequests(inputs: readonly FinishInput[]): Promise<boolean[]> {
    if (inputs.length > MAX_FINISHES_PER_CALL)
      throw new StoreInputError(`at most ${MAX_FINISHES_PER_CALL} finishes a call, not ${inputs.length}`, "inputs");
    for (const input of inputs) {
      checkText(input.batchId, "batchId");
      checkCount(input.position, "position");
      checkText(input.requestId, "requestId");
      checkHttpStatus(input.status, "status");
      checkText(input.body, "body");
      checkAmount(input.costMicrousd, "costMicrousd");
      checkEpochMs(input.nowMs, "nowMs");
      if (!this.db.holds(input.batchId, input.requestId, input.body)) throw new StoreInputError("text must not contain U+0000", "body");
    }
    if (inputs.length === 0) return [];
    return this.db.write(function* () {
      const written: boolean[] = [];
      const counts = new Map<string, { succeeded: number; failed: number; expired: number; costMicrousd: number; nowMs: number }>();
      for (const { batchId, position, requestId, status, body, costMicrousd, nowMs } of inputs) {
        const changed = yield* execute(SQL.finishRow, status, body, costMicrousd, nowMs, batchId, position, requestId);
        written.push(changed > 0);
        if (changed === 0) continue;
        const count = counts.get(batchId) ?? { succeeded: 0, failed: 0, expired: 0, costMicrousd: 0, nowMs };
        if (status === 200) count.succeeded++;
        else count.failed++;
        count.costMicrousd += costMicrousd;
        count.nowMs = Math.max(count.nowMs, nowMs);
        counts.set(batchId, count);
      }
      for (const [batchId, count] of counts) yield* countFinished(batchId, count, count.nowMs);
      return written;
    });
  }

  /**
   * Cancels the organization's batch: it becomes `cancelling` (nothing new starts), then its pending requests end
   * with a batch_cancelled result (failed, never run nor charged), BATCH_ROWS_PER_CHUNK a transaction; claimed ones
   * run to their end, and the batch is `cancelled` with the last request to end. A cancel of a `cancelling` batch
   * ends what an interrupted cancel left pending; an ended batch is answered as it is; null when there is no such batch.
   */
  async cancelBatch(orgId: string, id: string, nowMs: number): Promise<BatchRecord | null> {
    checkEpochMs(nowMs, "nowMs");
    if (!this.db.holds(orgId, id)) return null;
    const batch = await this.db.write(function* () {
      const [row] = yield* query(SQL.visibleBatch, id, orgId);
      if (row) yield* execute(SQL.startCancelling, id);
      return row ? toBatch(row) : null;
    });
    if (batch === null) return null;
    if (batch.status !== "queued" && batch.status !== "running" && batch.status !== "cancelling") return batch;
    await this.#endPending(id, "cancelling", CANCELLED, nowMs);
    return this.db.read(() => batchById(id));
  }

  /**
   * Ends the pending requests of batch `id` with `result` while its status is `cancelling` (a cancel) or it is
   * queued or running past its window (expiry): BATCH_ROWS_PER_CHUNK a transaction, until none is left. The number ended.
   */
  async #endPending(id: string, kind: "cancelling" | "expired", result: { status: number; body: string }, nowMs: number): Promise<number> {
    let total = 0;
    for (;;) {
      const ended = await this.db.write(function* () {
        const batch = yield* batchById(id);
        const due =
          kind === "cancelling"
            ? batch?.status === "cancelling"
            : (batch?.status === "queued" || batch?.status === "running") && batch.expiresAtMs <= nowMs;
        if (!due) return 0;
        const count = yield* execute(SQL.endPending, result.status, result.body, nowMs, id, id, BATCH_ROWS_PER_CHUNK);
        const expired = kind === "expired" ? count : 0;
        if (count > 0) yield* countFinished(id, { succeeded: 0, failed: count, expired, costMicrousd: 0 }, nowMs);
        return count;
      });
      total += ended;
      if (ended === 0) return total;
    }
  }

  /**
   * Ends the pending requests of up to `limit` batches, oldest first: of queued and running batches whose completion
   * window ended at `nowMs`, with a batch_expired result (such a batch is `expired` once no request of it runs: at
   * once, or with the last to finish), and of `cancelling` batches whose cancel was interrupted, with a
   * batch_cancelled one. BATCH_ROWS_PER_CHUNK requests a transaction; the number of requests ended.
   */
  async expireBatches(nowMs: number, limit = ACTIVE_BATCHES_SCANNED): Promise<number> {
    checkEpochMs(nowMs, "nowMs");
    checkCount(limit, "limit");
    const due = await this.db.read(() => query(SQL.dueToEnd, nowMs, limit));
    let ended = 0;
    for (const { id, status } of due) {
      ended +=
        status === "cancelling"
          ? await this.#endPending(id as string, "cancelling", CANCELLED, nowMs)
          : await this.#endPending(id as string, "expired", EXPIRED, nowMs);
    }
    return ended;
  }

  /**
   * The finished requests of the organization's batch after position `afterPosition` (-1: from the first), in input
   * order, at most `limit` (1 to MAX_RESULTS_PAGE).
   */
  async results(orgId: string, id: string, page: { afterPosition: number; limit: number }): Promise<BatchResult[] | null> {
    if (!Number.isSafeInteger(page.afterPosition) || page.afterPosition < -1)
      throw new StoreInputError("afterPosition must be a whole number, -1 or more", "afterPosition");
    if (!Number.isInteger(page.limit) || page.limit < 1 || page.limit > MAX_RESULTS_PAGE)
      throw new StoreInputError(`limit must be a whole number from 1 to ${MAX_RESULTS_PAGE}`, "limit");
    if (!this.db.holds(orgId, id)) return null;
    return this.db.read(function* () {
      if ((yield* query(SQL.visibleBatch, id, orgId)).length === 0) return null;
      const rows = yield* query(SQL.results, id, page.afterPosition, page.limit);
      return rows.map((r) => ({
        position: r.position as number,
        customId: r.custom_id as string,
        requestId: r.request_id as string | null,
        status: r.result_status as number,
        body: r.result_body as string,
        costMicrousd: r.cost_microusd as number,
      }));
    });
  }

  /**
   * Deletes up to `limit` ended batches past their retention and up to `limit` uploads untouched since before
   * `untouchedBeforeMs`, each with its requests in chunks (see dropBatch); the number of batches deleted.
   */
  async purgeBatches(input: PurgeInput): Promise<number> {
    checkEpochMs(input.endedBeforeMs, "endedBeforeMs");
    checkEpochMs(input.untouchedBeforeMs, "untouchedBeforeMs");
    checkCount(input.limit, "limit");
    let deleted = 0;
    const kinds = [
      { next: SQL.endedBefore, still: SQL.isEndedBefore, beforeMs: input.endedBeforeMs },
      { next: SQL.untouchedBefore, still: SQL.isUntouchedBefore, beforeMs: input.untouchedBeforeMs },
    ];
    for (const { next, still, beforeMs } of kinds) {
      for (let n = 0; n < input.limit; n++) {
        const [row] = await this.db.read(() => query(next, beforeMs));
        if (!row) break;
        if (await this.#deleteInChunks(row.id as string, still, [beforeMs])) deleted++;
      }
    }
    return deleted;
  }
}
