import { createReadStream, createWriteStream } from "node:fs";
import { rename, rm } from "node:fs/promises";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { TSchema } from "@sinclair/typebox";
import { Batch, BatchList } from "../contract/batches.ts";
import type { FieldError } from "../contract/errors.ts";
import { keyIdOf } from "../domain/api-keys.ts";
import { ERROR_CATALOGUE } from "../domain/errors.ts";
import { answerProblem, answerValidator } from "./answer-schemas.ts";
import { CliError, UsageError } from "./command.ts";
import { gatewayUrl } from "./connection.ts";
import { describeAnswer, PROBE_PATH, probeGateway } from "./gateway-probe.ts";
import { safeText, type TextSink } from "./output.ts";

const EXAMPLE_URL = "http://127.0.0.1:8080";
const DEFAULT_TIMEOUT_MS = 30_000;

/** Where `tds batch` sends its requests: the gateway's URL (--url or TDS_URL) and the API key (TDS_API_KEY). */
export interface BatchApiTarget {
  url: string;
  apiKey: string;
  /** A gateway path the given URL ended in, left out of `url` (for a note). */
  droppedPath?: string;
  via: "--url" | "TDS_URL";
}

/** --url or TDS_URL, and TDS_API_KEY: environment only, never an option (it would show in `ps`). */
export function batchApiTarget(urlOption: string | undefined, env: Record<string, string | undefined>): BatchApiTarget {
  const fromEnv = env.TDS_URL?.trim() === "" ? undefined : env.TDS_URL;
  const via = urlOption !== undefined ? "--url" : fromEnv !== undefined ? "TDS_URL" : null;
  if (via === null) {
    throw new UsageError(
      `tds batch works through a gateway's API: set TDS_URL to the gateway's URL (or pass --url URL), such as ${EXAMPLE_URL}`,
    );
  }
  const text = urlOption ?? fromEnv!;
  if (text.trim() === "") throw new UsageError(`--url needs the gateway's URL, such as ${EXAMPLE_URL}`);
  const { url, droppedPath } = gatewayUrl(via, text);
  const apiKey = env.TDS_API_KEY?.trim() ?? "";
  if (apiKey === "") {
    throw new UsageError(
      "tds batch needs an API key of the organization the batches belong to: set TDS_API_KEY in the environment (never a command-line option; create one with: tds key create --org ORG)",
    );
  }
  if (keyIdOf(apiKey) === null) throw new UsageError("TDS_API_KEY is not an API key (tds_<key id>_<secret>, as tds key create prints it)");
  return { url, apiKey, via, ...(droppedPath === undefined ? {} : { droppedPath }) };
}

/** An error answer of the gateway: its status, `detail` and field errors (the submission's, each naming its line). */
export class BatchApiError extends CliError {
  constructor(
    message: string,
    readonly status: number,
    readonly detail: string,
    readonly fieldErrors: FieldError[],
  ) {
    super(message);
    this.name = "BatchApiError";
  }
}

/** The gateway could not be reached or answered with a server error (5xx, 429): worth asking again while waiting. */
export class TransientApiError extends CliError {
  constructor(message: string) {
    super(message);
    this.name = "TransientApiError";
  }
}

export interface SubmitInput {
  file: string;
  /** The file's size: sent as Content-Length, so that a gateway refuses one too large before it is sent. */
  bytes: number;
  model?: string;
  idempotencyKey: string;
}

type Sink = TextSink & { once?: (event: "drain", listener: () => void) => unknown };

/** The batch routes of the gateway's /v1 API with an API key; every failure is a CliError saying what happened. */
export class BatchApiClient {
  private readonly fetch: typeof fetch;

  constructor(
    private readonly target: { url: string; apiKey: string },
    fetchFn: typeof fetch = globalThis.fetch,
  ) {
    this.fetch = fetchFn;
  }

  /** POST /v1/batches with the file streamed as the body (never read whole). `replayed`: the key's earlier batch. */
  async submit(input: SubmitInput): Promise<{ batch: Batch; replayed: boolean }> {
    const path = `/v1/batches${input.model === undefined ? "" : `?model=${encodeURIComponent(input.model)}`}`;
    const file = createReadStream(input.file);
    let response: Response;
    try {
      response = await this.fetch(`${this.target.url}${path}`, {
        method: "POST",
        headers: {
          ...this.headers("application/json"),
          "content-type": "application/x-ndjson",
          "content-length": String(input.bytes),
          "idempotency-key": input.idempotencyKey,
        },
        body: Readable.toWeb(file) as ReadableStream<Uint8Array>,
        duplex: "half",
      } as RequestInit);
    } catch (err) {
      file.destroy();
      throw this.unreachable(err, "POST", path);
    }
    const batch = await this.json<Batch>(response, Batch, "POST", path);
    return { batch, replayed: response.headers.get("idempotent-replayed") === "true" };
  }

  /** The gateway's max_batch_bytes (GET /api/config, which needs no key); null when it does not say. */
  async maxBatchBytes(): Promise<number | null> {
    try {
      const response = await this.fetch(`${this.target.url}${PROBE_PATH}`, {
        headers: { accept: "application/json" },
        signal: AbortSignal.timeout(DEFAULT_TIMEOUT_MS),
      });
      const body = (await response.json()) as { limits?: { max_batch_bytes?: unknown } };
      const max = body?.limits?.max_batch_bytes;
      return response.ok && Number.isSafeInteger(max) ? (max as number) : null;
    } catch {
      return null;
    }
  }

  getBatch(id: string): Promise<Batch> {
    return this.call<Batch>("GET", `/v1/batches/${encodeURIComponent(id)}`, Batch);
  }

  listBatches(page: { limit: number; cursor?: string }): Promise<BatchList> {
    const query = new URLSearchParams({ limit: String(page.limit), ...(page.cursor === undefined ? {} : { cursor: page.cursor }) });
    return this.call<BatchList>("GET", `/v1/batches?${query}`, BatchList);
  }

  cancelBatch(id: string): Promise<Batch> {
    return this.call<Batch>("POST", `/v1/batches/${encodeURIComponent(id)}/cancel`, Batch);
  }

  /** Streams the results (NDJSON) into `file`: written as FILE.partial and renamed once whole, so FILE is never cut short. */
  async resultsToFile(id: string, file: string): Promise<void> {
    const body = await this.resultsBody(id);
    const partial = `${file}.partial`;
    try {
      await pipeline(body, createWriteStream(partial));
      await rename(partial, file);
    } catch (err) {
      await rm(partial, { force: true });
      throw this.interrupted(err, file);
    }
  }

  /** Streams the results (NDJSON) into `sink` (stdout), waiting for it to drain when it is a stream that asks to. */
  async resultsToSink(id: string, sink: Sink): Promise<void> {
    const body = await this.resultsBody(id);
    try {
      for await (const chunk of body) {
        const written = sink.write(Buffer.from(chunk as Uint8Array).toString("utf8"));
        if (written === false && typeof sink.once === "function") await new Promise<void>((resolve) => sink.once!("drain", resolve));
      }
    } catch (err) {
      throw this.interrupted(err, "stdout");
    }
  }

  private async resultsBody(id: string): Promise<Readable> {
    const path = `/v1/batches/${encodeURIComponent(id)}/results`;
    const response = await this.send("GET", path, "application/x-ndjson");
    if (!response.ok) throw await this.failure(response, "GET", path);
    if (response.body === null) return Readable.from([]);
    // The stream keeps its bytes as they come: a multi-byte character split between chunks stays whole in a file.
    return Readable.fromWeb(response.body as import("node:stream/web").ReadableStream<Uint8Array>);
  }

  private headers(accept: string): Record<string, string> {
    return { authorization: `Bearer ${this.target.apiKey}`, accept, "x-tds-client": "cli" };
  }

  /**
   * The answer's headers within DEFAULT_TIMEOUT_MS; its body is not timed (a large batch's results stream for longer).
   */
  private async send(method: "GET" | "POST", path: string, accept = "application/json"): Promise<Response> {
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(new Error(`no answer within ${DEFAULT_TIMEOUT_MS} ms`)), DEFAULT_TIMEOUT_MS);
    try {
      return await this.fetch(`${this.target.url}${path}`, { method, headers: this.headers(accept), signal: controller.signal });
    } catch (err) {
      throw this.unreachable(err, method, path);
    } finally {
      clearTimeout(timer);
    }
  }

  private async call<T>(method: "GET" | "POST", path: string, schema: TSchema): Promise<T> {
    return this.json<T>(await this.send(method, path), schema, method, path);
  }

  private async json<T>(response: Response, schema: TSchema, method: string, path: string): Promise<T> {
    if (!response.ok) throw await this.failure(response, method, path);
    let text: string;
    try {
      text = await response.text();
    } catch (err) {
      throw this.unreachable(err, method, path);
    }
    let body: unknown;
    try {
      body = JSON.parse(text);
    } catch {
      throw this.unexpected(method, path, "not JSON");
    }
    const validate = answerValidator(schema);
    if (!validate(body)) throw this.unexpected(method, path, answerProblem(validate));
    return body as T;
  }

  private unreachable(err: unknown, method: string, path: string): CliError {
    const error = err as Error & { cause?: { message?: string; code?: string } };
    if (error.name === "TimeoutError" || error.name === "AbortError")
      return new TransientApiError(
        `the gateway at ${this.target.url} did not answer ${method} ${pathOnly(path)} within ${DEFAULT_TIMEOUT_MS / 1000} s`,
      );
    const reason = error.cause?.message ?? error.message ?? String(err);
    return new TransientApiError(`cannot reach the gateway at ${this.target.url}: ${safeText(reason)}`);
  }

  private interrupted(err: unknown, where: string): CliError {
    const error = err as Error & { cause?: { message?: string } };
    const reason = safeText(error.cause?.message ?? error.message ?? String(err));
    return new CliError(`the results did not arrive whole (${reason}); nothing is lost: run tds batch results again (${safeText(where)})`);
  }

  private unexpected(method: string, path: string, problem: string): CliError {
    return new CliError(
      `the gateway at ${this.target.url} answered ${method} ${pathOnly(path)} unexpectedly (${safeText(problem)}); is it a Typed Decision Service of this version?`,
    );
  }

  /** An error answer ({detail, errors?}) as a message that says what to do. */
  private async failure(response: Response, method: string, path: string): Promise<CliError> {
    const text = await response.text().catch(() => "");
    let detail = `${response.status} ${response.statusText}`.trim();
    let fieldErrors: FieldError[] = [];
    try {
      const body = JSON.parse(text) as { detail?: unknown; errors?: unknown };
      if (typeof body.detail === "string") detail = body.detail;
      if (Array.isArray(body.errors)) {
        fieldErrors = body.errors
          .filter((e): e is FieldError => typeof e?.field === "string" && typeof e?.message === "string")
          .map((e) => ({ field: safeText(e.field), message: safeText(e.message) }));
      }
    } catch {
      // Not the gateway's JSON (a proxy's error page, say): the status line says what happened.
    }
    detail = safeText(detail);
    const status = response.status;
    if (status === 401)
      return new BatchApiError(
        `the gateway at ${this.target.url} refused the API key (${detail}); TDS_API_KEY must be an active API key of this gateway`,
        status,
        detail,
        fieldErrors,
      );
    if (status === 404 && detail === ERROR_CATALOGUE.route_not_found.detail) {
      const probe = await probeGateway(this.target.url, this.fetch);
      if (probe.kind === "other")
        return new CliError(
          `${this.target.url} is not a Typed Decision Service gateway (${method} ${pathOnly(path)} answered ${describeAnswer(status, response.headers.get("content-type"), text)}; GET ${PROBE_PATH} answered ${probe.seen})`,
        );
      return new CliError(
        `the gateway at ${this.target.url} does not serve batches (${method} ${pathOnly(path)}: ${detail}); is it of this version?`,
      );
    }
    if (status === 404) return new BatchApiError(`${detail} See: tds batch list`, status, detail, fieldErrors);
    if (status >= 500 || status === 429) return new TransientApiError(`the gateway at ${this.target.url} answered ${status}: ${detail}`);
    return new BatchApiError(`the gateway at ${this.target.url} answered ${status}: ${detail}`, status, detail, fieldErrors);
  }
}

function pathOnly(path: string): string {
  return path.split("?")[0]!;
}
