import { type Static, Type } from "@sinclair/typebox";
import { DecisionRequest } from "./decision.ts";
import { boundDecisionRequest } from "./decision-bound.ts";
import { PageLimit } from "./usage.ts";
import { MAX_FIELD_ERRORS } from "./validation.ts";

/** custom_id: 1 to 64 characters (code points, as the schema counts them). */
export const CUSTOM_ID_MAX_LENGTH = 64;

/**
 * One line of a batch submission (application/x-ndjson): a decision request, checked exactly as POST /v1/systemone
 * checks its body (the same field schemas, unknown fields rejected), plus the client's `custom_id`.
 */
export const BatchRequestLine = Type.Object(
  {
    custom_id: Type.String({
      minLength: 1,
      maxLength: CUSTOM_ID_MAX_LENGTH,
      description: "The client's name for this request, 1 to 64 characters, unique within the batch; repeated on its result line",
    }),
    ...DecisionRequest.properties,
  },
  { additionalProperties: false, title: "BatchRequestLine" },
);

type JsonObject = Record<string, unknown>;

/**
 * A line cut down as boundDecisionRequest cuts a decision request (see there), `custom_id` kept whatever the number of
 * unknown fields beside it: the schema's work stays bounded and its first field errors are those of the whole line.
 */
export function boundBatchRequestLine(line: unknown, keepUnknown: number = MAX_FIELD_ERRORS): { body: unknown; omitted: number } {
  if (line === null || typeof line !== "object" || Array.isArray(line) || !Object.hasOwn(line, "custom_id")) {
    return boundDecisionRequest(line, keepUnknown);
  }
  const object = line as JsonObject;
  // A null prototype: "__proto__" stays an ordinary field, as JSON.parse made it.
  const request: JsonObject = Object.create(null);
  for (const key of Object.keys(object)) if (key !== "custom_id") request[key] = object[key];
  const cut = boundDecisionRequest(request, keepUnknown);
  // `request` and any copy boundDecisionRequest made are this function's own objects.
  (cut.body as JsonObject).custom_id = object.custom_id;
  return cut;
}

export const BatchStatus = Type.Union(
  [
    Type.Literal("queued"),
    Type.Literal("running"),
    Type.Literal("completed"),
    Type.Literal("cancelling"),
    Type.Literal("cancelled"),
    Type.Literal("expired"),
  ],
  {
    description:
      "queued (accepted, no request started yet), running, completed (every request has its result), cancelling (cancel asked, " +
      "requests already running finish), cancelled, expired (the completion window ended; requests not run got a batch_expired result)",
  },
);

export const BatchRequestCounts = Type.Object(
  {
    total: Type.Integer({ minimum: 0, description: "Requests in the batch" }),
    succeeded: Type.Integer({ minimum: 0, description: "Requests answered 200" }),
    failed: Type.Integer({ minimum: 0, description: "Requests ended with an error result (cancelled and expired ones included)" }),
  },
  { additionalProperties: false, title: "BatchRequestCounts" },
);

const Timestamp = (description: string) => Type.Union([Type.String(), Type.Null()], { description });

export const Batch = Type.Object(
  {
    id: Type.String({ description: 'The batch id, "batch_…"' }),
    object: Type.Literal("batch"),
    status: BatchStatus,
    model: Type.Union([Type.String(), Type.Null()], {
      description: "The model of requests that name none; null selects the configured model when each request runs",
    }),
    created_at: Type.String({ description: "ISO-8601 time the submission was accepted" }),
    started_at: Timestamp("ISO-8601 time the first request started; null before"),
    ended_at: Timestamp("ISO-8601 time the batch completed, was cancelled or expired; null before"),
    expires_at: Type.String({ description: "ISO-8601 end of the completion window: requests not started by then end with batch_expired" }),
    request_counts: BatchRequestCounts,
    cost_microusd: Type.Integer({ minimum: 0, description: "Charges of the requests finished so far; 1 USD = 1,000,000 microUSD" }),
    cost_usd: Type.String({ description: "Exact decimal USD string of cost_microusd" }),
  },
  { additionalProperties: false, title: "Batch" },
);

export const BatchList = Type.Object(
  {
    data: Type.Array(Batch, { description: "The organization's batches, newest first" }),
    next_cursor: Type.Union([Type.String(), Type.Null()], { description: "Pass as ?cursor= for the next page; null on the last" }),
  },
  { additionalProperties: false, title: "BatchList" },
);

export const BatchListQuery = Type.Object(
  {
    cursor: Type.Optional(Type.String({ maxLength: 500 })),
    limit: PageLimit,
  },
  { additionalProperties: false },
);

/** One line of GET /v1/batches/{id}/results (application/x-ndjson). */
export const BatchResultLine = Type.Object(
  {
    custom_id: Type.String({ description: "The custom_id of the request's input line" }),
    request_id: Type.Union([Type.String(), Type.Null()], {
      description:
        "The request's id, as in its usage record; null for a request that never ran (cancelled or expired before it started: no usage record, no charge)",
    }),
    status: Type.Integer({ minimum: 100, maximum: 599, description: "The HTTP status POST /v1/systemone would have answered" }),
    body: Type.Object(
      {},
      {
        additionalProperties: true,
        description: "The DecisionResponse (status 200) or the error body (ErrorResponse) the API would have answered",
      },
    ),
  },
  { additionalProperties: false, title: "BatchResultLine" },
);

export type BatchRequestLine = Static<typeof BatchRequestLine>;
export type BatchStatus = Static<typeof BatchStatus>;
export type BatchRequestCounts = Static<typeof BatchRequestCounts>;
export type Batch = Static<typeof Batch>;
export type BatchList = Static<typeof BatchList>;
export type BatchListQuery = Static<typeof BatchListQuery>;
export type BatchResultLine = Static<typeof BatchResultLine>;
