import { type Static, Type } from "@sinclair/typebox";
import { DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT } from "../domain/paging.ts";
import { ServiceMode } from "./decision.ts";

export const UsageOutcome = Type.Union(
  [
    Type.Literal("in_flight"),
    Type.Literal("succeeded"),
    Type.Literal("model_error"),
    Type.Literal("context_rejected"),
    Type.Literal("reservation_expired"),
    Type.Literal("gateway_error"),
  ],
  {
    description:
      "in_flight (accepted, still running: the only outcome that changes, once), succeeded (200), model_error (502, or 503 while the model loads), " +
      "context_rejected (422), reservation_expired (409), gateway_error (accepted but not finished by the gateway: storage unavailable, an " +
      "internal error, or a stop; nothing charged)",
  },
);

/** One accepted decision request, as GET /v1/usage… and `tds usage --json` show it. */
export const UsageRecordJson = Type.Object(
  {
    request_id: Type.String(),
    created_at: Type.String({ description: "ISO-8601 time the request was accepted" }),
    completed_at: Type.Union([Type.String(), Type.Null()], {
      description: "ISO-8601 time the final outcome was recorded; null while in flight",
    }),
    key_id: Type.String({ description: "Id of the API key used (never the key)" }),
    source: Type.Union([Type.Literal("api"), Type.Literal("playground"), Type.Literal("batch")], {
      description:
        "api: a decision request; playground: a request sent with x-tds-source: playground (the console's Playground); " +
        "batch: a request of a batch submission",
    }),
    model: Type.String(),
    service_mode: ServiceMode,
    outcome: UsageOutcome,
    http_status: Type.Union([Type.Integer(), Type.Null()], {
      description: "Status the client was answered with; null while in flight, and for a request completed by the expiry sweep",
    }),
    input_tokens: Type.Integer({ minimum: 0 }),
    output_tokens: Type.Integer({ minimum: 0 }),
    cost_microusd: Type.Integer({ minimum: 0 }),
    cost_usd: Type.String(),
    latency_ms: Type.Union([Type.Number({ minimum: 0 }), Type.Null()], { description: "Model call time; null when no answer arrived" }),
    gateway_latency_ms: Type.Number({ minimum: 0 }),
    over_reservation: Type.Boolean({ description: "The model reported more tokens than reserved; the reservation was charged" }),
    error: Type.Union([Type.String(), Type.Null()]),
    deployment: Type.Union([Type.String(), Type.Null()], {
      description: "The deployment (model service) that answered, or the last one tried; null while in flight or when none was tried",
    }),
    attempts: Type.Integer({
      minimum: 0,
      description: "Model service attempts (more than 1 after a failover to another deployment); 0 while in flight",
    }),
  },
  { additionalProperties: false, title: "UsageRecord" },
);

export const UsagePageJson = Type.Object(
  {
    data: Type.Array(UsageRecordJson, { description: "Newest first" }),
    next_cursor: Type.Union([Type.String(), Type.Null()], { description: "Pass as ?cursor= for the next page; null on the last" }),
  },
  { additionalProperties: false, title: "UsagePage" },
);

/** `limit` of every listing (usage records, organizations, audit entries). */
export const PageLimit = Type.Optional(
  Type.String({ pattern: "^[0-9]{1,3}$", description: `1 to ${MAX_PAGE_LIMIT}, default ${DEFAULT_PAGE_LIMIT}` }),
);

export const UsageListQuery = Type.Object(
  {
    from: Type.Optional(Type.String({ description: "ISO-8601 time, inclusive" })),
    to: Type.Optional(Type.String({ description: "ISO-8601 time, exclusive" })),
    outcome: Type.Optional(UsageOutcome),
    cursor: Type.Optional(Type.String({ maxLength: 500 })),
    limit: PageLimit,
  },
  { additionalProperties: false },
);

export type UsageRecordJson = Static<typeof UsageRecordJson>;
export type UsagePageJson = Static<typeof UsagePageJson>;
export type UsageListQuery = Static<typeof UsageListQuery>;
