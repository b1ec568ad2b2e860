import type { ServiceMode } from "../contract/decision.ts";
import type { Clock } from "../domain/clock.ts";
import type { ServiceError } from "../domain/errors.ts";
import type { Books } from "./books.ts";
import { failedCompletion } from "./completion.ts";
import type { DecisionContext } from "./decision-context.ts";

export interface FailureBeforeAdmission {
  /** The model the record names: the one requested, else the configured default (whose list may be what failed). */
  model: string;
  /** What the client is answered; its status and detail go into the record. */
  error: ServiceError;
  gatewayLatencyMs: number;
}

/**
 * Records a request that a model service failed before it could be admitted (its model could not be resolved: the
 * services did not answer their lists), so that the request id the client got leads to a usage record: an admission
 * without quota, reservation or Idempotency-Key claim (the request was not accepted: it uses up no preview quota and
 * reserves nothing), then its completion as `model_error` (failedCompletion: the error's status and detail) with nothing
 * charged and no deployment tried. Resolves to whether both steps committed (storage may be failing too); never throws.
 */
export async function recordFailureBeforeAdmission(
  books: Books,
  clock: Clock,
  mode: ServiceMode,
  ctx: DecisionContext,
  failure: FailureBeforeAdmission,
): Promise<boolean> {
  const { requestId } = ctx;
  const orgId = ctx.org.id;
  try {
    const admitted = await books.admit({
      requestId,
      orgId,
      keyId: ctx.keyId,
      source: ctx.source,
      model: failure.model,
      mode,
      nowMs: clock.nowMs(),
      idempotency: null,
      quota: null,
      reservation: null,
      keyBudget: null,
    });
    if (admitted.kind !== "admitted") return false;
    const { gatewayLatencyMs } = failure;
    const nothingTried = { deployment: null, attempts: 0, reserved: false, keyBudget: null, idempotencyKey: null };
    const completed = await books.complete(
      failedCompletion({ requestId, orgId, nowMs: clock.nowMs(), gatewayLatencyMs, ...nothingTried }, failure.error),
    );
    return completed.kind === "completed";
  } catch {
    return false;
  }
}
