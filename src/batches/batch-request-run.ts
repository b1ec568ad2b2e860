import { createHash } from "node:crypto";
import type { DecisionRequest } from "../contract/decision.ts";
import { serviceErrorAnswer } from "../contract/errors.ts";
import { forwardedText, parseJsonText } from "../contract/json-text.ts";
import { newRequestId } from "../domain/api-keys.ts";
import type { Clock } from "../domain/clock.ts";
import { ServiceError } from "../domain/errors.ts";
import type { ApiKeyRecord, Organization } from "../domain/organizations.ts";
import type { DecisionPipeline } from "../gateway/decision-pipeline.ts";
import { keyRefusal } from "../gateway/key-controls.ts";
import type { DecisionTracer } from "../gateway/observer.ts";
import type { ClaimedRequest, ClaimRef, FinishInput } from "../store/batches.ts";
import type { Store } from "../store/store.ts";

/** How long a request whose decision is still held elsewhere (or whose storage failed) waits before it is claimed again. */
export const DEFER_MS = 5000;

/**
 * The Idempotency-Key every run of a batch request is admitted with: a run after a takeover replays the first. Its
 * space is a character no Idempotency-Key header may hold, so no client request can claim or poison it.
 */
export const batchIdempotencyKey = (batchId: string, position: number) => `batch ${batchId}:${position}`;

export interface BatchRequestRunDeps {
  store: Pick<Store, "batches" | "getUsage" | "classifyFailure">;
  pipeline: Pick<DecisionPipeline, "decide">;
  clock: Clock;
  /** The key a batch was submitted with, and its organization (cached by the caller); null when the key is gone. */
  keyOf: (keyId: string) => Promise<{ org: Organization; key: ApiKeyRecord } | null>;
  monotonicMs?: () => number;
  /** Fires when the server gives up on its work (shutdown): a request cut short is left to be run again. */
  signal?: AbortSignal;
  newRequestId?: () => string;
  onUnexpected?: (err: unknown, requestId: string) => void;
  /** Gives each run a trace of its own (a root span; the batch's id and the position in it as attributes). */
  tracer?: Pick<DecisionTracer, "root">;
  /** Writes a result (default: store.batches.finishRequest; the app groups them: FinishGroup). */
  finish?: (input: FinishInput) => Promise<boolean>;
}

/** What became of one claimed request. */
export type RunOutcome =
  | { kind: "finished"; status: number; costMicrousd: number; written: boolean }
  | { kind: "deferred"; reason: "held_elsewhere" | "storage" }
  | { kind: "left"; reason: "shutdown" | "claim_lost" }
  /** The store failed, or something unexpected did: the claim must be given back (BatchRunner retries that). */
  | { kind: "failed"; claim: ClaimRef; error: unknown };

/**
 * Runs one claimed batch request as an ordinary decision (source "batch", its own request id and usage record,
 * the same admission) and writes its result: the answer POST /v1/systemone would have given, once.
 *
 * A request claimed before (`takenOver`) may already have a record under its request id: in flight (its first run
 * is still held, or its process died and the sweep has yet to complete it) → deferred; failed (nothing charged) →
 * run again under a new request id; succeeded → run again under the same id and Idempotency-Key, which replays the
 * stored answer without a second charge.
 */
export class BatchRequestRun {
  readonly #monotonicMs: () => number;
  readonly #newRequestId: () => string;
  readonly #finish: (input: FinishInput) => Promise<boolean>;

  constructor(private readonly deps: BatchRequestRunDeps) {
    this.#finish = deps.finish ?? ((input) => deps.store.batches.finishRequest(input));
    this.#monotonicMs = deps.monotonicMs ?? (() => performance.now());
    this.#newRequestId = deps.newRequestId ?? newRequestId;
  }

  run(claim: ClaimedRequest): Promise<RunOutcome> {
    if (!this.deps.tracer) return this.#run(claim);
    const attributes = { "tds.batch_id": claim.batchId, "tds.batch_position": claim.position, "tds.request_id": claim.requestId };
    return this.deps.tracer.root("batch request", attributes, () => this.#run(claim));
  }

  async #run(claim: ClaimedRequest): Promise<RunOutcome> {
    const startedAt = this.#monotonicMs();
    let requestId = claim.requestId;
    try {
      if (claim.takenOver) {
        const record = await this.deps.store.getUsage(claim.orgId, requestId);
        if (record?.outcome === "in_flight") return await this.#defer(claim, "held_elsewhere");
        if (record && record.outcome !== "succeeded") {
          const fresh = this.#newRequestId();
          const reissued = await this.deps.store.batches.reissueClaim({ ...claimRef(claim), newRequestId: fresh });
          if (!reissued) return { kind: "left", reason: "claim_lost" };
          requestId = fresh;
        }
      }
      const answer = await this.#answer(claim, requestId, startedAt);
      if (answer === "defer") return await this.#defer({ ...claim, requestId }, "held_elsewhere");
      if (answer === "storage") return await this.#defer({ ...claim, requestId }, "storage");
      if (answer === "shutdown") return { kind: "left", reason: "shutdown" };
      const written = await this.#finish({
        ...claimRef(claim),
        requestId,
        status: answer.status,
        body: answer.body,
        costMicrousd: answer.costMicrousd,
        nowMs: this.deps.clock.nowMs(),
      });
      return { kind: "finished", status: answer.status, costMicrousd: answer.costMicrousd, written };
    } catch (err) {
      // Run again later (a decision that was made is replayed then).
      return { kind: "failed", claim: { ...claimRef(claim), requestId }, error: err };
    }
  }

  /** The answer of the request's decision, or what to do instead of writing one. */
  async #answer(
    claim: ClaimedRequest,
    requestId: string,
    startedAt: number,
  ): Promise<{ status: number; body: string; costMicrousd: number } | "defer" | "storage" | "shutdown"> {
    const parsed = parseJsonText(claim.body);
    if ("problem" in parsed) throw new Error(`batch ${claim.batchId} request ${claim.position}: stored line ${parsed.problem}`);
    const { custom_id: _customId, ...line } = parsed.body as Record<string, unknown>;
    const request = { ...line, ...(line.model === undefined && claim.model !== null ? { model: claim.model } : {}) } as DecisionRequest;
    try {
      const found = await this.deps.keyOf(claim.keyId);
      if (found === null) throw new ServiceError("invalid_api_key");
      const refusal = keyRefusal(found.key, this.deps.clock.nowMs());
      if (refusal) throw refusal;
      if (found.org.paused) throw new ServiceError("org_paused");
      const reply = await this.deps.pipeline.decide(
        {
          requestId,
          org: found.org,
          keyId: claim.keyId,
          key: found.key,
          source: "batch",
          startedAt,
          ...(this.deps.signal ? { signal: this.deps.signal } : {}),
        },
        request,
        { key: batchIdempotencyKey(claim.batchId, claim.position), requestHash: sha256(claim.body) },
        forwardedText(parsed.members),
      );
      return { status: reply.status, body: reply.body, costMicrousd: costOf(reply.body) };
    } catch (err) {
      if (this.deps.signal?.aborted) return "shutdown";
      if (err instanceof ServiceError) {
        if (err.code === "idempotency_in_progress") return "defer";
        if (err.code === "storage_unavailable") return "storage";
        const answer = serviceErrorAnswer(err);
        // Its first run succeeded and was charged, but the answer was too large to keep for a replay.
        const costMicrousd =
          err.code === "idempotency_response_not_kept" ? ((await this.deps.store.getUsage(claim.orgId, requestId))?.costMicrousd ?? 0) : 0;
        return { status: answer.status, body: JSON.stringify(answer.body), costMicrousd };
      }
      if (this.deps.store.classifyFailure(err) !== "other") return "storage";
      this.deps.onUnexpected?.(err, requestId);
      return { status: 500, body: JSON.stringify(serviceErrorAnswer(new ServiceError("internal")).body), costMicrousd: 0 };
    }
  }

  async #defer(claim: ClaimedRequest, reason: "held_elsewhere" | "storage"): Promise<RunOutcome> {
    const untilMs = this.deps.clock.nowMs() + DEFER_MS;
    await this.deps.store.batches.deferClaim({ ...claimRef(claim), untilMs });
    return { kind: "deferred", reason };
  }
}

const claimRef = (claim: ClaimedRequest): ClaimRef => ({ batchId: claim.batchId, position: claim.position, requestId: claim.requestId });

const sha256 = (text: string) => createHash("sha256").update(text).digest("hex");

/** The charge of a DecisionResponse (JSON text): its usage.cost_microusd. */
function costOf(body: string): number {
  const cost = (JSON.parse(body) as { usage?: { cost_microusd?: unknown } }).usage?.cost_microusd;
  return typeof cost === "number" && Number.isSafeInteger(cost) && cost >= 0 ? cost : 0;
}
