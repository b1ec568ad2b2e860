import { Type } from "@sinclair/typebox";
import type { FastifyInstance, onRequestHookHandler } from "fastify";
import { DecisionRequest, DecisionResponse } from "../../contract/decision.ts";
import { boundDecisionRequest } from "../../contract/decision-bound.ts";
import { IdempotencyKeyHeader } from "../../contract/headers.ts";
import { forwardedText } from "../../contract/json-text.ts";
import { compileBoundedSchema, compileSchema } from "../../contract/validation.ts";
import type { ErrorCode } from "../../domain/errors.ts";
import type { UsageSource } from "../../domain/usage-records.ts";
import type { DecisionPipeline } from "../../gateway/decision-pipeline.ts";
import type { Store } from "../../store/store.ts";
import { authenticate, authOf } from "../auth.ts";
import { API_KEY_ERRORS, errorResponses } from "../error-responses.ts";
import type { InFlight } from "../in-flight.ts";

/** Every catalogue code a decision request can be answered with. */
const DECISION_ERRORS: ErrorCode[] = [
  ...API_KEY_ERRORS,
  "expired_api_key",
  "retired_api_key",
  "insufficient_credits",
  "key_budget_exhausted",
  "org_paused",
  "model_not_allowed",
  "reservation_expired",
  "idempotency_in_progress",
  "idempotency_response_not_kept",
  "body_too_large",
  "token_bound_over_reserve",
  "invalid_body",
  "invalid_json",
  "unknown_model",
  "context_rejected",
  "idempotency_key_reused",
  "rate_limited",
  "key_rate_limited",
  "preview_quota_org",
  "model_unavailable",
  "model_timeout",
  "model_invalid_response",
  "model_not_configured",
  "model_not_ready",
  "storage_unavailable",
];

const DecisionHeaders = Type.Object({
  "idempotency-key": IdempotencyKeyHeader(
    "Optional. The same key with the same body within 24 h replays the first 200 response (Idempotent-Replayed: true) without a second charge",
  ),
  "x-tds-source": Type.Optional(
    Type.String({ description: '"playground" marks Playground requests; they share every quota with the API' }),
  ),
});

/** Playground requests identify themselves; they share every quota with the API. */
function sourceOf(header: string | string[] | undefined): UsageSource {
  return header === "playground" ? "playground" : "api";
}

export function decisionRoutes(
  app: FastifyInstance,
  deps: { store: Store; pipeline: DecisionPipeline; maxRequestBytes: number; inFlight: InFlight; rateLimit: onRequestHookHandler },
) {
  app.post<{ Body: DecisionRequest; Headers: { "idempotency-key"?: string; "x-tds-source"?: string } }>(
    "/v1/systemone",
    {
      bodyLimit: deps.maxRequestBytes,
      onRequest: [authenticate(deps.store, { rejectPaused: true }), deps.rateLimit],
      // After the body is parsed, before the schema: more than max_questions questions → one 422, no per-question validation.
      preValidation: async (request) => deps.pipeline.checkQuestionCount(request.body),
      // The schema sees the body cut to a bounded size (decision-bound.ts): unknown fields past the 50th of an object and
      // options past the 256th are counted, not walked, so that no shape of a 1 MiB body makes validation costly.
      validatorCompiler: ({ schema, httpPart }) =>
        httpPart === "body" ? compileBoundedSchema(schema as never, boundDecisionRequest) : compileSchema(schema as never),
      // The error handler builds the field errors from error.validation; Fastify's default text of every error is not needed.
      schemaErrorFormatter: () => new Error("Request body does not match the contract."),
      schema: {
        operationId: "createDecision",
        summary: "Answer typed questions about one state",
        security: [{ bearer: [] }],
        headers: DecisionHeaders,
        body: DecisionRequest,
        response: { 200: DecisionResponse, ...errorResponses(...DECISION_ERRORS) },
      },
    },
    async (request, reply) => {
      const auth = authOf(request);
      const key = request.headers["idempotency-key"];
      const result = await deps.inFlight.track(
        deps.pipeline.decide(
          {
            requestId: request.id,
            org: auth.org,
            keyId: auth.keyId,
            key: auth.key,
            source: sourceOf(request.headers["x-tds-source"]),
            startedAt: request.startedAt,
            signal: deps.inFlight.signal,
          },
          request.body,
          key !== undefined && request.bodySha256 ? { key, requestHash: request.bodySha256 } : null,
          forwardedText(request.jsonMembers),
        ),
      );
      if (result.replayed) {
        reply.header("x-service-request-id", result.requestId);
        reply.header("x-typesafe-request-id", result.requestId);
        reply.header("idempotent-replayed", "true");
      }
      return reply
        .code(result.status)
        .type("application/json; charset=utf-8")
        .serializer((text: string) => text)
        .send(result.body);
    },
  );
}
