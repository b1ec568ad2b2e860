/**
 * What a client is told about a failed model call (src/gateway/model-failure.ts) and what the log gets
 * (model-failure-report.ts): one fixed sentence per kind that never repeats itself nor carries the model service's
 * or the adapter's words, and a log reason that is bounded and escaped.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { ERROR_CATALOGUE, type ServiceError } from "../../src/domain/errors.ts";
import { answersMismatch, modelServiceFailure } from "../../src/gateway/model-failure.ts";
import { logSafe, MAX_LOGGED_REASON_CHARS, modelFailureReport } from "../../src/gateway/model-failure-report.ts";
import { type ModelErrorKind, ModelServiceError } from "../../src/models/model-service.ts";

/** Every kind (the compiler fails here when a kind is added and not listed), and the catalogue code it answers with. */
const KINDS: Record<ModelErrorKind, ServiceError["code"]> = {
  unavailable: "model_unavailable",
  timeout: "model_timeout",
  bad_status: "model_unavailable",
  overloaded: "model_unavailable",
  invalid_response: "model_invalid_response",
  context_rejected: "context_rejected",
  refused: "model_invalid_response",
  aborted: "model_unavailable",
  not_ready: "model_not_ready",
};

const ROUTES = [
  undefined,
  { deployment: "gpu-a", attempts: 1 },
  { deployment: "gpu-b", attempts: 3 },
  { deployment: null, attempts: 0 },
] as const;
const STATUSES = [undefined, 200, 401, 422, 429, 503] as const;
/** Notes as the engine and the router write them. */
const NOTES = [
  undefined,
  "the model is still loading (40%): downloading the model file",
  "state is 5000 tokens; the model's max_state is 4024",
  'question "q1": the state plus the question is 9000 tokens; the model\'s max_branch is 4096',
  'no healthy deployment of model "decider"; the next is tried again in 1.2 s',
  'every deployment of model "decider" is at its concurrency limit; no slot became free within the deadline (400 ms)',
];
/** What adapters used to repeat into the detail: the adapter's description and the upstream's words. */
const MESSAGE = "model service is unavailable while connecting: connection refused (ECONNREFUSED) at 10.1.2.3:8000";
const UPSTREAM = "psycopg2: postgres://admin:S3cret@10.1.2.3/prod";

/** A 4-word sequence that appears twice in `text`, or null. */
function repeatedPhrase(text: string): string | null {
  const words = text.toLowerCase().match(/[\p{L}\p{N}_'’-]+/gu) ?? [];
  const seen = new Set<string>();
  for (let i = 0; i + 4 <= words.length; i++) {
    const phrase = words.slice(i, i + 4).join(" ");
    if (seen.has(phrase)) return phrase;
    seen.add(phrase);
  }
  return null;
}

function* allDetails(): Generator<[label: string, detail: string]> {
  for (const [code, entry] of Object.entries(ERROR_CATALOGUE)) yield [`catalogue ${code}`, entry.detail];
  for (const kind of Object.keys(KINDS) as ModelErrorKind[]) {
    for (const route of ROUTES)
      for (const status of STATUSES)
        for (const note of NOTES)
          for (const requestId of [undefined, "req_01HXYZ"]) {
            const err = new ModelServiceError(kind, MESSAGE, status, {
              upstreamText: UPSTREAM,
              retryAfterSeconds: 7,
              ...(route ? { route } : {}),
              ...(note ? { note } : {}),
            });
            const label = `${kind} ${JSON.stringify({ route, status, note, requestId })}`;
            yield [label, modelServiceFailure(err, requestId ? { requestId } : {}).detail ?? ""];
          }
  }
  for (const route of ROUTES)
    yield [`answers mismatch ${JSON.stringify(route)}`, answersMismatch(route, { requestId: "req_1" }).detail ?? ""];
  yield ["unexpected", modelServiceFailure(new TypeError("x is undefined"), { requestId: "req_1" }).detail ?? ""];
}

describe("the messages of model failures", () => {
  test("no message of the catalogue or of a model failure repeats a phrase (no 4-word sequence twice)", () => {
    let count = 0;
    for (const [label, detail] of allDetails()) {
      count++;
      assert.equal(repeatedPhrase(detail), null, `${label}: ${detail}`);
    }
    assert.ok(count > 1000, `${count} messages checked`);
  });

  test("every kind answers with its code and its fixed words: never the adapter's message nor the upstream's text", () => {
    for (const [label, detail] of allDetails()) {
      assert.ok(!detail.includes("ECONNREFUSED") && !detail.includes("10.1.2.3") && !detail.includes("S3cret"), `${label}: ${detail}`);
    }
    for (const [kind, code] of Object.entries(KINDS) as [ModelErrorKind, ServiceError["code"]][]) {
      assert.equal(modelServiceFailure(new ModelServiceError(kind, MESSAGE)).code, code, kind);
    }
  });

  test("the wording: the deployment (and the attempts), the status class, the request, nothing charged", () => {
    const routed = (kind: ModelErrorKind, status?: number, details = {}) =>
      modelServiceFailure(new ModelServiceError(kind, MESSAGE, status, { route: { deployment: "gpu-a", attempts: 1 }, ...details }), {
        requestId: "req_1",
      });
    assert.equal(
      routed("bad_status", 503).detail,
      'The model service (deployment "gpu-a") answered HTTP 5xx; no credits were charged (request req_1).',
    );
    assert.equal(
      routed("timeout").detail,
      'The model service (deployment "gpu-a") did not answer in time; no credits were charged (request req_1).',
    );
    assert.equal(
      routed("unavailable").detail,
      'The model service (deployment "gpu-a") is unavailable; no credits were charged (request req_1).',
    );
    assert.equal(
      routed("invalid_response", 200).detail,
      'The model service (deployment "gpu-a") sent an answer that cannot be read (HTTP 2xx); no credits were charged (request req_1).',
    );
    assert.equal(
      routed("refused", 422).detail,
      'The model service (deployment "gpu-a") refused the request (HTTP 4xx); no credits were charged (request req_1).',
    );
    const overloaded = routed("overloaded", 429, { retryAfterSeconds: 7 });
    assert.equal(
      overloaded.detail,
      'The model service (deployment "gpu-a") is overloaded (HTTP 4xx); retry in 7 s; no credits were charged (request req_1).',
    );
    assert.equal(overloaded.extra.retryAfterMs, 7000, "the Retry-After is passed on");
    assert.equal(
      routed("context_rejected", 422).detail,
      'The request is longer than the context of the model (deployment "gpu-a"); shorten the state or the questions; no credits were charged (request req_1).',
    );
    assert.equal(
      routed("context_rejected", undefined, { note: "state is 5000 tokens; the model's max_state is 4024" }).detail,
      'The request is longer than the context of the model (deployment "gpu-a"): state is 5000 tokens; the model\'s max_state is 4024; ' +
        "shorten the state or the questions; no credits were charged (request req_1).",
    );
    assert.equal(
      routed("not_ready", undefined, { note: "the model is still loading (40%)." }).detail,
      'The model (deployment "gpu-a") is not ready: the model is still loading (40%); no credits were charged (request req_1).',
    );
    assert.equal(
      routed("aborted").detail,
      'The call to the model service (deployment "gpu-a") was stopped before it finished; no credits were charged (request req_1).',
    );
    const failover = new ModelServiceError("bad_status", MESSAGE, 502, { route: { deployment: "gpu-b", attempts: 3 } });
    assert.equal(
      modelServiceFailure(failover, { requestId: "req_2" }).detail?.startsWith(
        'The model service (deployment "gpu-b", after 3 attempts) answered HTTP 5xx;',
      ),
      true,
    );
    assert.equal(
      modelServiceFailure(new ModelServiceError("unavailable", MESSAGE)).detail,
      "The model service is unavailable.",
      "outside a decision: no request, no credits",
    );
  });

  test("the log's report: request, model, deployment, kind, status and the reason with the upstream's words", () => {
    const err = new ModelServiceError("bad_status", "model service answered HTTP 500", 500, {
      route: { deployment: "gpu-a", attempts: 2 },
      upstreamText: "boom\nFORGED\u001b[31m",
    });
    assert.deepEqual(modelFailureReport(err, { requestId: "req_1", model: "decider" }), {
      request_id: "req_1",
      model: "decider",
      deployment: "gpu-a",
      attempts: 2,
      failure: "bad_status",
      upstream_status: 500,
      reason: "model service answered HTTP 500: boom\\nFORGED\\u001b[31m",
    });
    assert.deepEqual(modelFailureReport("thrown string", { requestId: "req_2", model: "m" }), {
      request_id: "req_2",
      model: "m",
      deployment: null,
      attempts: 1,
      failure: "unexpected",
      reason: "thrown string",
    });
  });

  test("logSafe: control, line-separator and bidi characters and the backslash escaped, cut at the bound", () => {
    assert.equal(logSafe("a\nb\r\tc\\d\u0000\u007f\u0085\u2028\u202e", 100), "a\\nb\\r\\tc\\\\d\\u0000\\u007f\\u0085\\u2028\\u202e");
    assert.equal(logSafe("héllo 🙂", 100), "héllo 🙂");
    const long = logSafe(`${"🙂".repeat(MAX_LOGGED_REASON_CHARS)}\n`, MAX_LOGGED_REASON_CHARS);
    assert.equal(Array.from(long).length, MAX_LOGGED_REASON_CHARS);
    assert.ok(long.endsWith("🙂…"), "cut on a code point, marked");
  });
});
