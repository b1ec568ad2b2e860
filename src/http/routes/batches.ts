import { createHash } from "node:crypto";
import { Readable } from "node:stream";
import { Type } from "@sinclair/typebox";
import type { FastifyInstance, FastifyRequest, onRequestHookHandler } from "fastify";
import { NdjsonTooLargeError, ndjsonLines } from "../../batches/ndjson-lines.ts";
import { type AcceptedLine, checkSubmission } from "../../batches/submission-check.ts";
import type { Config } from "../../config.ts";
import { Batch, BatchList, BatchListQuery, BatchRequestLine, BatchResultLine, CUSTOM_ID_MAX_LENGTH } from "../../contract/batches.ts";
import { CONTRACT_LIMITS } from "../../contract/decision.ts";
import type { FieldError } from "../../contract/errors.ts";
import { IdempotencyKeyHeader } from "../../contract/headers.ts";
import { newBatchId } from "../../domain/api-keys.ts";
import type { Clock } from "../../domain/clock.ts";
import { type ErrorCode, ServiceError } from "../../domain/errors.ts";
import type { DecisionPipeline } from "../../gateway/decision-pipeline.ts";
import { checkModelAllowed } from "../../gateway/key-controls.ts";
import type { ModelRegistry } from "../../gateway/model-registry.ts";
import { batchJson, batchResultLine } from "../../presentation/batch-json.ts";
import {
  type BatchLine,
  type BatchResult,
  type BatchStore,
  DuplicateCustomIdError,
  MAX_LINE_BYTES_PER_CALL,
  MAX_LINES_PER_CALL,
  MAX_RESULTS_PAGE,
} from "../../store/batches.ts";
import type { Store } from "../../store/store.ts";
import { authenticate, authOf } from "../auth.ts";
import { API_KEY_ERRORS, errorResponses } from "../error-responses.ts";
import { pageQuery } from "../query.ts";

export interface BatchRouteDeps {
  store: Store;
  config: Pick<Config, "batches" | "limits" | "models" | "modelServices">;
  registry: Pick<ModelRegistry, "resolve">;
  /** Its max_questions check, as POST /v1/systemone makes it. */
  pipeline: Pick<DecisionPipeline, "checkQuestionCount">;
  clock: Clock;
  /** The per-minute limit of decisions: a submission counts as one request. */
  rateLimit: onRequestHookHandler;
  /** The per-minute limit of reads (usage, organization). */
  readRateLimit: onRequestHookHandler;
  /** Told when a batch was queued (the runner looks for work at once). */
  onQueued?: () => void;
}

/** The media types of a submission; application/jsonl is another name for the same format. */
const NDJSON_TYPES = ["application/x-ndjson", "application/jsonl"];

const SUBMIT_ERRORS: ErrorCode[] = [
  ...API_KEY_ERRORS,
  "expired_api_key",
  "retired_api_key",
  "org_paused",
  "model_not_allowed",
  "rate_limited",
  "key_rate_limited",
  "body_too_large",
  "invalid_body",
  "invalid_query",
  "unsupported_media_type",
  "unknown_model",
  "idempotency_key_reused",
  "storage_unavailable",
];
const READ_ERRORS: ErrorCode[] = [...API_KEY_ERRORS, "rate_limited", "not_found", "storage_unavailable"];

const SubmitQuery = Type.Object(
  {
    model: Type.Optional(
      Type.String({
        minLength: 1,
        maxLength: CONTRACT_LIMITS.modelNameMaxLength,
        description: "The model of the batch's requests that name none (a name from GET /v1/models); absent: the configured model",
      }),
    ),
  },
  { additionalProperties: false },
);

const SubmitHeaders = Type.Object({
  "idempotency-key": IdempotencyKeyHeader(
    "Optional. The same key with the same body within 24 h answers the batch it created (Idempotent-Replayed: true) without a second batch",
  ),
});

const BatchParams = Type.Object({ id: Type.String({ minLength: 1, maxLength: 200, description: 'The batch id, "batch_…"' }) });

/**
 * What an Idempotency-Key of a submission stands for: its body (SHA-256) and its `?model=`, so that the same body
 * sent for another model is a different submission (422), not a replay.
 */
function submissionHash(model: string | null, bodySha256: string): string {
  return model === null ? bodySha256 : createHash("sha256").update(`${model}\n${bodySha256}`).digest("hex");
}

function batchNotFound(id: string): ServiceError {
  return new ServiceError("not_found", `No batch with id ${JSON.stringify(id)} in this organization.`);
}

/** The charset parameter of a Content-Type, lowercased; null when there is none. */
function charsetOf(contentType: string | undefined): string | null {
  const match = /;\s*charset\s*=\s*"?([^";\s]*)"?/i.exec(contentType ?? "");
  return match ? match[1]!.toLowerCase() : null;
}

/**
 * The chunks of the request body. Stopping early (a limit passed) leaves the request undestroyed, so that the answer
 * can still be sent on its connection.
 */
async function* chunksOf(body: Readable | undefined): AsyncGenerator<Uint8Array> {
  if (body === undefined) return;
  for await (const chunk of body.iterator({ destroyOnReturn: false })) yield chunk as Uint8Array;
}

/**
 * The lines of a submission written to its validating batch in calls within the store's limits (MAX_LINES_PER_CALL
 * lines, MAX_LINE_BYTES_PER_CALL bytes); in memory: at most one call's lines.
 */
class LineWriter {
  private lines: BatchLine[] = [];
  /** The input line number of each buffered line. */
  private inputLines: number[] = [];
  private bytes = 0;

  constructor(
    private readonly batches: BatchStore,
    private readonly batchId: string,
    private readonly clock: Clock,
  ) {}

  async add(line: AcceptedLine): Promise<void> {
    const bytes = Buffer.byteLength(line.customId) + Buffer.byteLength(line.text);
    if (this.lines.length >= MAX_LINES_PER_CALL || this.bytes + bytes > MAX_LINE_BYTES_PER_CALL) await this.flush();
    this.lines.push({ position: line.position, customId: line.customId, body: line.text });
    this.inputLines.push(line.line);
    this.bytes += bytes;
  }

  async flush(): Promise<void> {
    if (this.lines.length === 0) return;
    try {
      await this.batches.addLines(this.batchId, this.lines, this.clock.nowMs());
    } catch (err) {
      if (!(err instanceof DuplicateCustomIdError)) throw err;
      const at = this.lines.findIndex((l) => l.position === err.position);
      const field = at < 0 ? "custom_id" : `line ${this.inputLines[at]}: custom_id`;
      const message = `repeats the custom_id of request ${err.firstPosition + 1}: custom_ids must be unique within a batch`;
      throw new ServiceError("invalid_body", undefined, { errors: [{ field, message }] });
    }
    this.lines = [];
    this.inputLines = [];
    this.bytes = 0;
  }
}

function invalidSubmission(errors: FieldError[], moreErrors: number): ServiceError {
  const first = errors[0];
  const summary = first ? `${first.field}: ${first.message}` : "";
  const more = errors.length - 1 + moreErrors;
  const detail =
    `Invalid batch: ${summary}` +
    (more > 0 ? ` (and ${more} more${moreErrors > 0 ? `; the first ${errors.length} are listed` : ""})` : "") +
    ". Nothing was queued.";
  return new ServiceError("invalid_body", detail, { errors });
}

/** Batch submissions (/v1/batches): every lookup is scoped to the key's organization. */
export function batchRoutes(app: FastifyInstance, deps: BatchRouteDeps) {
  const { store, config, clock } = deps;
  const readAuth = [authenticate(store, { rejectPaused: false }), deps.readRateLimit];
  // A line is stored with its custom_id in one addLines call: it must fit one (max_request_bytes may be larger).
  const maxLineBytes = Math.min(config.limits.maxRequestBytes, MAX_LINE_BYTES_PER_CALL - 4 * CUSTOM_ID_MAX_LENGTH);
  /** The model of ?model=: known (422 otherwise) and one the key may use (403), an alias as the model it names. */
  async function checkModel(model: string, allowed: string[] | null): Promise<void> {
    checkModelAllowed(allowed, await resolvedName(model), model);
  }

  async function resolvedName(model: string): Promise<string> {
    try {
      return (await deps.registry.resolve(model)).name;
    } catch (err) {
      if (err instanceof ServiceError && err.code === "unknown_model") {
        throw new ServiceError("unknown_model", err.detail, {
          errors: [{ field: "query.model", message: err.extra.errors?.[0]?.message ?? "unknown model" }],
        });
      }
      // Nothing offered now (no model configured, a model service's list not had): the requests are answered when
      // they run, as decisions would be.
      return model;
    }
  }

  // The submission is read as a stream, in a scope of its own: no other route takes NDJSON, and no JSON body is
  // buffered here.
  app.register(async (scope) => {
    scope.removeAllContentTypeParsers();
    scope.addContentTypeParser(NDJSON_TYPES, (request, payload, done) => {
      const charset = charsetOf(request.headers["content-type"]);
      if (charset !== null && charset !== "utf-8" && charset !== "utf8")
        return done(
          new ServiceError("unsupported_media_type", `Batch submissions must be UTF-8; Content-Type declares charset=${charset}.`),
          undefined,
        );
      if (Number(request.headers["content-length"]) > config.batches.maxBytes)
        return done(new NdjsonTooLargeError(config.batches.maxBytes), undefined);
      done(null, payload);
    });
    scope.addContentTypeParser("*", (_request, _payload, done) =>
      done(new ServiceError("unsupported_media_type", "Content-Type must be application/x-ndjson: one JSON request a line."), undefined),
    );

    scope.post<{ Querystring: { model?: string }; Headers: { "idempotency-key"?: string } }>(
      "/v1/batches",
      {
        onRequest: [authenticate(store, { rejectPaused: true }), deps.rateLimit],
        schema: {
          operationId: "submitBatch",
          summary: "Submit a batch of decision requests (NDJSON, one request a line), run later within the completion window",
          description:
            "Every line is checked as POST /v1/systemone checks a body, plus a custom_id unique within the batch; any invalid line " +
            "refuses the whole batch (422, the problems named by line) and nothing is queued. The body may hold at most " +
            "max_batch_bytes, each line at most max_request_bytes (413), and at most max_batch_requests lines.",
          security: [{ bearer: [] }],
          querystring: SubmitQuery,
          headers: SubmitHeaders,
          streamedBody: { mediaType: "application/x-ndjson", schema: BatchRequestLine, description: "One BatchRequestLine a line" },
          response: { 202: Batch, ...errorResponses(...SUBMIT_ERRORS) },
        },
      },
      async (request, reply) => {
        const auth = authOf(request);
        const model = request.query.model ?? null;
        if (model !== null) await checkModel(model, auth.key.models);
        const body = request.body as Readable | undefined;
        const nowMs = clock.nowMs();
        const batch = await store.batches.beginBatch({
          id: newBatchId(),
          orgId: auth.org.id,
          keyId: auth.keyId,
          model,
          nowMs,
          expiresAtMs: nowMs + config.batches.completionWindowMs,
        });
        let opened = false;
        try {
          const writer = new LineWriter(store.batches, batch.id, clock);
          const lines = ndjsonLines(chunksOf(body), { maxLineBytes, maxTotalBytes: config.batches.maxBytes });
          const check = await checkSubmission(lines, {
            maxRequests: config.batches.maxRequests,
            checkQuestionCount: (line) => deps.pipeline.checkQuestionCount(line),
            accept: (line) => writer.add(line),
          });
          if (check.errors.length > 0) throw invalidSubmission(check.errors, check.moreErrors);
          await writer.flush();
          const key = request.headers["idempotency-key"];
          const outcome = await store.batches.openBatch({
            batchId: batch.id,
            total: check.accepted,
            inputBytes: check.bytes,
            nowMs: clock.nowMs(),
            idempotency: key === undefined ? null : { key, requestHash: submissionHash(model, check.sha256) },
          });
          // The store drops the batch itself when the key answers another one.
          opened = true;
          if (outcome.kind === "mismatch") throw new ServiceError("idempotency_key_reused");
          if (outcome.kind === "replayed") reply.header("idempotent-replayed", "true");
          else deps.onQueued?.();
          return reply.code(202).send(batchJson(outcome.batch));
        } finally {
          if (!opened) await dropUpload(request, batch.id, body);
        }
      },
    );
  });

  /** Drops a refused or failed upload and lets the rest of its body pass unread, so that the answer reaches the client. */
  async function dropUpload(request: FastifyRequest, batchId: string, body: Readable | undefined): Promise<void> {
    if (body && !body.destroyed && !body.readableEnded) body.resume();
    try {
      await store.batches.dropBatch(batchId);
    } catch (err) {
      request.log.warn({ err, batch_id: batchId }, "a refused batch upload could not be dropped; the purge deletes it later");
    }
  }

  app.get<{ Querystring: BatchListQuery }>(
    "/v1/batches",
    {
      onRequest: readAuth,
      schema: {
        operationId: "listBatches",
        summary: "The organization's batches, newest first, with cursor paging",
        security: [{ bearer: [] }],
        querystring: BatchListQuery,
        response: { 200: BatchList, ...errorResponses(...API_KEY_ERRORS, "rate_limited", "invalid_query", "storage_unavailable") },
      },
    },
    async (request) => {
      const page = await store.batches.listBatches(authOf(request).org.id, pageQuery(request.query));
      return { data: page.batches.map(batchJson), next_cursor: page.nextCursor };
    },
  );

  app.get<{ Params: { id: string } }>(
    "/v1/batches/:id",
    {
      onRequest: readAuth,
      schema: {
        operationId: "getBatch",
        summary: "One batch: its status, request counts and cost so far (404 for another organization's batch)",
        security: [{ bearer: [] }],
        params: BatchParams,
        response: { 200: Batch, ...errorResponses(...READ_ERRORS) },
      },
    },
    async (request) => {
      const batch = await store.batches.getBatch(authOf(request).org.id, request.params.id);
      if (!batch) throw batchNotFound(request.params.id);
      return batchJson(batch);
    },
  );

  app.get<{ Params: { id: string } }>(
    "/v1/batches/:id/results",
    {
      onRequest: readAuth,
      schema: {
        operationId: "getBatchResults",
        summary: "The results of a batch's finished requests, in input order (NDJSON, one BatchResultLine a line)",
        description:
          "Before the batch ends, the requests finished so far; once it has ended, exactly one line per request. Each body is the " +
          "answer POST /v1/systemone would have given.",
        security: [{ bearer: [] }],
        params: BatchParams,
        response: { 200: { content: { "application/x-ndjson": { schema: BatchResultLine } } }, ...errorResponses(...READ_ERRORS) },
      },
    },
    async (request, reply) => {
      const orgId = authOf(request).org.id;
      const { id } = request.params;
      const first = await store.batches.results(orgId, id, { afterPosition: -1, limit: MAX_RESULTS_PAGE });
      if (first === null) throw batchNotFound(id);
      async function* pages(): AsyncGenerator<string> {
        let page: BatchResult[] = first!;
        for (;;) {
          if (page.length > 0) yield page.map(batchResultLine).join("");
          if (page.length < MAX_RESULTS_PAGE) return;
          // A batch deleted meanwhile (its retention ended) ends the listing.
          page =
            (await store.batches.results(orgId, id, { afterPosition: page[page.length - 1]!.position, limit: MAX_RESULTS_PAGE })) ?? [];
        }
      }
      return reply.type("application/x-ndjson; charset=utf-8").send(Readable.from(pages(), { objectMode: false }));
    },
  );

  app.post<{ Params: { id: string } }>(
    "/v1/batches/:id/cancel",
    {
      onRequest: readAuth,
      schema: {
        operationId: "cancelBatch",
        summary: "Cancel a batch: requests not started end with batch_cancelled (never run nor charged), running ones finish",
        security: [{ bearer: [] }],
        params: BatchParams,
        response: { 200: Batch, ...errorResponses(...READ_ERRORS) },
      },
    },
    async (request) => {
      const batch = await store.batches.cancelBatch(authOf(request).org.id, request.params.id, clock.nowMs());
      if (!batch) throw batchNotFound(request.params.id);
      return batchJson(batch);
    },
  );
}
