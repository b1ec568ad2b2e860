import type { DecisionRequest } from "../contract/decision.ts";
import type { Store, StoredResponse } from "../store/store.ts";
import type { Clock } from "./clock.ts";
import type { DecisionContext, DecisionPipeline } from "./decision-pipeline.ts";
import { GatewayError } from "./errors.ts";

export const IDEMPOTENCY_WINDOW_MS = 24 * 60 * 60 * 1000;

export interface IdempotencyRequest {
  key: string;
  /** sha256 of the request body bytes. */
  requestHash: string;
}

export interface DecisionReply {
  status: 200;
  /** JSON text of the DecisionResponse, byte-for-byte the same on a replay. */
  body: string;
  requestId: string;
  replayed: boolean;
}

/**
 * Safe retries: with an Idempotency-Key, the first request's 200 response is kept for 24 hours and
 * replayed for the same key and body, never charged or counted again. A failed request drops
 * its claim, so a retry runs anew (nothing was charged for it).
 */
export class IdempotentDecisions {
  constructor(
    private readonly pipeline: DecisionPipeline,
    private readonly store: Store,
    private readonly clock: Clock,
    /** How long a claim blocks other attempts if its process dies: beyond any model call. */
    private readonly lockMs: number,
  ) {}

  async handle(ctx: DecisionContext, request: DecisionRequest, idempotency: IdempotencyRequest | null): Promise<DecisionReply> {
    if (!idempotency) {
      const body = await this.pipeline.decide(ctx, request);
      return { status: 200, body: JSON.stringify(body), requestId: ctx.requestId, replayed: false };
    }
    const now = this.clock.nowMs();
    const owner = { orgId: ctx.org.id, key: idempotency.key, requestId: ctx.requestId };
    const claim = await this.store.claimIdempotencyKey({
      ...owner,
      requestHash: idempotency.requestHash,
      nowMs: now,
      lockUntilMs: now + this.lockMs,
      expiresAtMs: now + IDEMPOTENCY_WINDOW_MS,
    });
    switch (claim.kind) {
      case "replay":
        return { status: 200, body: claim.response.body, requestId: claim.response.requestId, replayed: true };
      case "mismatch":
        throw new GatewayError("idempotency_key_reused");
      case "in_progress":
        throw new GatewayError("idempotency_in_progress");
      case "claimed":
        break;
    }
    let response: StoredResponse;
    try {
      const body = await this.pipeline.decide(ctx, request);
      response = { status: 200, body: JSON.stringify(body), requestId: ctx.requestId };
    } catch (err) {
      await this.store.releaseIdempotencyKey(owner);
      throw err;
    }
    await this.store.completeIdempotencyKey({ ...owner, response });
    return { status: 200, body: response.body, requestId: response.requestId, replayed: false };
  }
}
