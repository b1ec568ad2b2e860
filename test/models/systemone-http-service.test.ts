import assert from "node:assert/strict";
import { getEventListeners } from "node:events";
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { createServer as createNetServer } from "node:net";
import { after, before, describe, test } from "node:test";
import type { Question } from "../../src/contract/decision.ts";
import { checkAnswers } from "../../src/gateway/answer-check.ts";
import { type ModelErrorKind, type ModelService, ModelServiceError, type UpstreamModel } from "../../src/models/model-service.ts";
import { openSystemOneHttpService } from "../../src/models/systemone-http/systemone-http-service.ts";
import { type FakeModelServer, startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { settlesBefore } from "../support/timer-race.ts";

const API_KEY = "sk-test-SECRET-0123456789";

const questions: Record<string, Question> = {
  colour: { type: "choice", criteria: { red: "warm", green: "calm", blue: "cold" } },
  quality: { type: "score", criteria: ["poor", "fair", "good"] },
  ok: { type: "noul" },
};

function call(behavior?: string, state: Record<string, unknown> = { facts: ["x"] }) {
  return { model: "fake-small", state: behavior === undefined ? state : { ...state, fake_behavior: behavior }, questions };
}

/** Asserts the promise fails with a ModelServiceError of `kind` whose message never contains the API key. */
async function expectKind(
  promise: Promise<unknown>,
  kind: ModelErrorKind,
  check?: (err: ModelServiceError) => void,
): Promise<ModelServiceError> {
  try {
    await promise;
  } catch (err) {
    assert.ok(err instanceof ModelServiceError, `expected a ModelServiceError, got ${String(err)}`);
    assert.equal(err.kind, kind, `kind of "${err.message}"`);
    assert.ok(!err.message.includes(API_KEY), "message must not include the API key");
    assert.ok(!err.message.includes("SECRET"), "message must not include the API key");
    assert.ok(!(err.upstreamText ?? "").includes("SECRET"), "the upstream's words must not include the API key");
    check?.(err);
    return err;
  }
  assert.fail(`expected a ${kind} error`);
}

/** A port on which nothing listens (bound, then released). */
async function freePort(): Promise<number> {
  const s = createNetServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  const port = (s.address() as AddressInfo).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

/** A tiny custom upstream for shapes the fake does not produce. */
async function customUpstream(handler: Parameters<typeof createServer>[1]): Promise<{ url: string; close(): Promise<void> }> {
  const server: Server = createServer(handler);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((r) => {
        server.close(() => r());
        server.closeAllConnections();
      }),
  };
}

describe("systemone-http service against the fake model server", () => {
  let fake: FakeModelServer;
  let service: ModelService;
  before(async () => {
    fake = await startFakeModelServer({ apiKey: API_KEY });
    service = openSystemOneHttpService({ baseUrl: fake.url, apiKey: API_KEY, connections: 4 });
  });
  after(async () => {
    await service.close();
    await fake.close();
  });

  test("decide returns the upstream's answers and usage, and measures latency", async () => {
    const n = fake.received.length;
    const result = await service.decide(call(), { timeoutMs: 2000 });
    const checked = checkAnswers(questions, result.answers);
    assert.ok(checked.ok, checked.ok ? "" : checked.problem);
    assert.equal(result.usage.output_tokens, 3);
    assert.ok(Number.isInteger(result.usage.input_tokens) && result.usage.input_tokens >= 1);
    assert.ok(result.latencyMs >= 0 && result.latencyMs < 2000);
    assert.deepEqual(Object.keys(result).sort(), ["answers", "latencyMs", "usage"]);
    // The request body is exactly {state, questions, model}; the key is forwarded as a Bearer token.
    assert.deepEqual(fake.received[n], { ...call(), authorization: `Bearer ${API_KEY}` });
  });

  test("keeps connections alive between calls", async () => {
    const before = fake.connections.accepted;
    for (let i = 0; i < 5; i++) await service.decide(call(), { timeoutMs: 2000 });
    assert.ok(fake.connections.accepted - before <= 1, `opened ${fake.connections.accepted - before} connections for 5 sequential calls`);
  });

  test("answers are returned unchecked (the gateway checks them)", async () => {
    const result = await service.decide(call("missing-answer"), { timeoutMs: 2000 });
    assert.ok(!checkAnswers(questions, result.answers).ok);
  });

  test("tokens:IN:OUT are passed through", async () => {
    const result = await service.decide(call("tokens:77:0"), { timeoutMs: 2000 });
    assert.deepEqual(result.usage, { input_tokens: 77, output_tokens: 0 });
  });

  test("delay longer than timeoutMs → timeout, quickly", async () => {
    const t0 = performance.now();
    const decision = service.decide(call("delay:3000"), { timeoutMs: 150 });
    // Its deadline's timer is due long before this one (and the answer's, at 3 s, after it): an order no load changes.
    assert.ok(await settlesBefore(decision, 1000), "failed at its deadline, not when the answer came");
    await expectKind(decision, "timeout");
    const elapsed = performance.now() - t0;
    assert.ok(elapsed >= 140, `not before its deadline: ${elapsed} ms`);
  });

  test("delay shorter than timeoutMs → answer", async () => {
    const result = await service.decide(call("delay:30"), { timeoutMs: 1000 });
    assert.ok(result.latencyMs >= 25);
  });

  test("hang → timeout", async () => {
    const decision = service.decide(call("hang"), { timeoutMs: 150 });
    assert.ok(await settlesBefore(decision, 1000), "failed at its deadline");
    await expectKind(decision, "timeout", (err) => assert.match(err.message, /150 ms/));
  });

  test("the deadline covers the body too (headers sent, body stalls) → timeout", async () => {
    const decision = service.decide(call("hang-mid-body"), { timeoutMs: 150 });
    assert.ok(await settlesBefore(decision, 1000), "failed at its deadline");
    await expectKind(decision, "timeout");
  });

  test("a non-positive deadline fails at once with timeout", async () => {
    await expectKind(service.decide(call(), { timeoutMs: 0 }), "timeout");
  });

  test("our signal → aborted (before and during the call)", async () => {
    const pre = new AbortController();
    pre.abort();
    await expectKind(service.decide(call(), { timeoutMs: 2000, signal: pre.signal }), "aborted");

    const mid = new AbortController();
    setTimeout(() => mid.abort(new Error("client went away")), 50);
    const hanging = service.decide(call("hang"), { timeoutMs: 5000, signal: mid.signal });
    assert.ok(await settlesBefore(hanging, 1000), "failed when the signal fired, not at the deadline");
    await expectKind(hanging, "aborted");

    fake.setModelsBehavior("hang");
    try {
      const listAbort = new AbortController();
      setTimeout(() => listAbort.abort(), 50);
      await expectKind(service.listModels({ timeoutMs: 5000, signal: listAbort.signal }), "aborted");
    } finally {
      fake.setModelsBehavior(null);
    }
  });

  test("reset → unavailable", async () => {
    await expectKind(service.decide(call("reset"), { timeoutMs: 2000 }), "unavailable");
  });

  test("reset-mid-body → unavailable", async () => {
    await expectKind(service.decide(call("reset-mid-body"), { timeoutMs: 2000 }), "unavailable");
  });

  test("status:503 and other non-2xx → bad_status with the upstream status", async () => {
    for (const code of [500, 502, 503, 401, 403, 404, 418]) {
      await expectKind(service.decide(call(`status:${code}`), { timeoutMs: 2000 }), "bad_status", (err) => {
        assert.equal(err.upstreamStatus, code);
        assert.equal(err.message, `model service answered HTTP ${code}`);
        assert.equal(err.upstreamText, `fake status ${code}`);
      });
    }
  });

  test("status:429 and status:529 → overloaded, with the Retry-After", async () => {
    for (const code of [429, 529]) {
      await expectKind(service.decide(call(`status:${code}`), { timeoutMs: 2000 }), "overloaded", (err) => {
        assert.equal(err.upstreamStatus, code);
        assert.match(err.message, /retry after 7 s/);
        assert.equal(err.retryAfterSeconds, 7);
      });
    }
  });

  test("a 422 saying the context is exceeded, and any 413 → context_rejected; the upstream's words kept apart", async () => {
    await expectKind(service.decide(call("context-rejected"), { timeoutMs: 2000 }), "context_rejected", (err) => {
      assert.equal(err.upstreamStatus, 422);
      assert.equal(err.message, "model service rejected the request's context (HTTP 422)");
      assert.match(err.upstreamText ?? "", /^context length exceeded/);
    });
    await expectKind(service.decide(call("status:413"), { timeoutMs: 2000 }), "context_rejected", (err) => {
      assert.equal(err.upstreamStatus, 413);
      assert.equal(err.upstreamText, "fake status 413");
    });
  });

  test("a 400 or 422 about something else → refused (not retried elsewhere, not the client's context)", async () => {
    for (const code of [400, 422]) {
      await expectKind(service.decide(call(`status:${code}`), { timeoutMs: 2000 }), "refused", (err) => {
        assert.equal(err.upstreamStatus, code);
        assert.equal(err.message, `model service refused the request (HTTP ${code})`);
        assert.equal(err.upstreamText, `fake status ${code}`);
      });
    }
  });

  test("a real over-length request → context_rejected, the upstream's count in upstreamText", async () => {
    const big = { model: "fake-small", state: "word ".repeat(10_000), questions };
    await expectKind(service.decide(big, { timeoutMs: 2000 }), "context_rejected", (err) => {
      assert.match(err.upstreamText ?? "", /context length exceeded: \d+ tokens > 8192/);
    });
  });

  test("garbage, truncated-json, html → invalid_response", async () => {
    for (const b of ["garbage", "truncated-json", "html"]) {
      await expectKind(service.decide(call(b), { timeoutMs: 2000 }), "invalid_response", (err) => {
        assert.match(err.message, /not JSON/);
        assert.ok((err.upstreamText ?? "").length > 0, "the start of the body is kept for the log");
      });
    }
  });

  test("no-usage, zero-input-tokens and bad token numbers → invalid_response", async () => {
    await expectKind(service.decide(call("no-usage"), { timeoutMs: 2000 }), "invalid_response", (err) =>
      assert.match(err.message, /usage/),
    );
    await expectKind(service.decide(call("zero-input-tokens"), { timeoutMs: 2000 }), "invalid_response", (err) =>
      assert.match(err.message, /input_tokens is 0/),
    );
    await expectKind(service.decide(call("tokens:1.5:1"), { timeoutMs: 2000 }), "invalid_response");
    await expectKind(service.decide(call("tokens:3:-1"), { timeoutMs: 2000 }), "invalid_response", (err) =>
      assert.match(err.message, /output_tokens is -1/),
    );
  });

  test("the service still works after failures (pool recovers)", async () => {
    const result = await service.decide(call(), { timeoutMs: 2000 });
    assert.ok(checkAnswers(questions, result.answers).ok);
  });

  test("listModels parses the model list", async () => {
    assert.deepEqual(await service.listModels({ timeoutMs: 2000 }), [
      { name: "fake-small", context: { max_state: 4096, max_branch: 6144, strict: true } },
      { name: "fake-large" },
    ]);
  });

  test("a wrong API key → bad_status 401 without the key in the message", async () => {
    const wrong = openSystemOneHttpService({ baseUrl: fake.url, apiKey: "sk-wrong-SECRET" });
    try {
      await expectKind(wrong.listModels({ timeoutMs: 2000 }), "bad_status", (err) => {
        assert.equal(err.upstreamStatus, 401);
        assert.ok(!err.message.includes("sk-wrong"));
      });
    } finally {
      await wrong.close();
    }
  });
});

describe("systemone-http service: listModels shapes", () => {
  async function listWith(models: unknown): Promise<UpstreamModel[]> {
    const fake = await startFakeModelServer({ models: models as UpstreamModel[] });
    const service = openSystemOneHttpService({ baseUrl: fake.url });
    try {
      return await service.listModels({ timeoutMs: 2000 });
    } finally {
      await service.close();
      await fake.close();
    }
  }

  test("`id` is a fallback for `name`; invalid and unknown context fields are dropped", async () => {
    const models = await listWith([
      { id: "by-id", owned_by: "someone" },
      { name: "by-name", id: "ignored", context: { max_state: 0, max_branch: 2048, strict: "yes", extra: 1 } },
      { name: "bad-context", context: { max_state: 1.5, max_branch: -1, strict: null } },
      { name: "context-null", context: null },
      { name: "all-good", context: { max_state: 1, max_branch: 2, strict: false } },
    ]);
    assert.deepEqual(models, [
      { name: "by-id" },
      { name: "by-name", context: { max_branch: 2048 } },
      { name: "bad-context" },
      { name: "context-null" },
      { name: "all-good", context: { max_state: 1, max_branch: 2, strict: false } },
    ]);
  });

  test("an empty list is fine", async () => {
    assert.deepEqual(await listWith([]), []);
  });

  test("items without a name or id → invalid_response", async () => {
    await expectKind(listWith([{ name: "ok" }, { title: "no name" }]), "invalid_response", (err) =>
      assert.match(err.message, /models\[1\]/),
    );
    await expectKind(listWith([42]), "invalid_response");
    await expectKind(listWith([{ name: 7 }]), "invalid_response");
  });

  test("other envelopes → invalid_response", async () => {
    for (const body of ['{"data": []}', '{"models": {}}', "[]", "null", '"models"']) {
      const upstream = await customUpstream((_req, res) => {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(body);
      });
      const service = openSystemOneHttpService({ baseUrl: upstream.url });
      try {
        await expectKind(service.listModels({ timeoutMs: 2000 }), "invalid_response");
      } finally {
        await service.close();
        await upstream.close();
      }
    }
  });

  test("socket and status behaviours apply to GET /v1/models", async () => {
    const cases: Array<[string, ModelErrorKind]> = [
      ["status:503", "bad_status"],
      ["status:529", "overloaded"],
      ["reset", "unavailable"],
      ["reset-mid-body", "unavailable"],
      ["garbage", "invalid_response"],
      ["html", "invalid_response"],
      ["hang", "timeout"],
    ];
    for (const [behavior, kind] of cases) {
      const fake = await startFakeModelServer({ modelsBehavior: behavior });
      const service = openSystemOneHttpService({ baseUrl: fake.url });
      try {
        await expectKind(service.listModels({ timeoutMs: 150 }), kind);
      } finally {
        await service.close();
        await fake.close();
      }
    }
  });
});

describe("systemone-http service: transport edge cases", () => {
  test("a port with nothing listening → unavailable", async () => {
    const port = await freePort();
    const service = openSystemOneHttpService({ baseUrl: `http://127.0.0.1:${port}`, apiKey: API_KEY });
    try {
      await expectKind(service.decide(call(), { timeoutMs: 2000 }), "unavailable", (err) => assert.match(err.message, /refused/));
      await expectKind(service.listModels({ timeoutMs: 2000 }), "unavailable");
    } finally {
      await service.close();
    }
  });

  test("a response larger than maxResponseBytes → invalid_response", async () => {
    const fake = await startFakeModelServer();
    const service = openSystemOneHttpService({ baseUrl: fake.url, maxResponseBytes: 200 });
    try {
      await expectKind(service.decide(call(), { timeoutMs: 2000 }), "invalid_response", (err) =>
        assert.match(err.message, /larger than 200 bytes/),
      );
    } finally {
      await service.close();
      await fake.close();
    }
  });

  test("a chunked response growing past maxResponseBytes → invalid_response", async () => {
    const upstream = await customUpstream((_req, res) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.write('{"answers": {}, "padding": "');
      const timer = setInterval(() => res.write("x".repeat(1024)), 1);
      res.on("close", () => clearInterval(timer));
    });
    const service = openSystemOneHttpService({ baseUrl: upstream.url, maxResponseBytes: 16 * 1024 });
    try {
      await expectKind(service.decide(call(), { timeoutMs: 2000 }), "invalid_response");
    } finally {
      await service.close();
      await upstream.close();
    }
  });

  test("envelope shapes: not an object, answers not an object", async () => {
    const bodies = [
      "[1, 2]",
      '"text"',
      '{"answers": [], "usage": {"input_tokens": 1, "output_tokens": 0}}',
      '{"usage": {"input_tokens": 1, "output_tokens": 0}}',
      "",
    ];
    for (const body of bodies) {
      const upstream = await customUpstream((req, res) => {
        req.resume();
        res.writeHead(200, { "content-type": "application/json" });
        res.end(body);
      });
      const service = openSystemOneHttpService({ baseUrl: upstream.url });
      try {
        await expectKind(service.decide(call(), { timeoutMs: 2000 }), "invalid_response");
      } finally {
        await service.close();
        await upstream.close();
      }
    }
  });

  test("upstream error details: error/message fallbacks, truncation to 300 characters, key scrubbed, never in the message", async () => {
    const replies: Array<[number, string]> = [
      [422, JSON.stringify({ error: "prompt too long for this model" })],
      [400, JSON.stringify({ message: "bad request: state too big" })],
      [413, JSON.stringify({ detail: "y".repeat(2000) })],
      [422, JSON.stringify({ error: { message: "This model's maximum context length is 4096 tokens (nested, openai-style)" } })],
      [401, JSON.stringify({ detail: `invalid key Bearer ${API_KEY}` })],
      [422, "not json at all"],
      [422, ""],
      [400, JSON.stringify({ detail: [{ msg: "the request exceeds the available context size, try increasing it" }] })],
      [400, JSON.stringify({ error: "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 2048. Given: 3000" })],
      [500, JSON.stringify({ detail: "input length exceeds maximum context length" })],
    ];
    let i = 0;
    const upstream = await customUpstream((req, res) => {
      req.resume();
      const [status, body] = replies[i++]!;
      res.writeHead(status, { "content-type": "application/json" });
      res.end(body);
    });
    const service = openSystemOneHttpService({ baseUrl: upstream.url, apiKey: API_KEY });
    const opts = { timeoutMs: 2000 };
    try {
      await expectKind(service.decide(call(), opts), "context_rejected", (e) =>
        assert.equal(e.upstreamText, "prompt too long for this model"),
      );
      await expectKind(service.decide(call(), opts), "context_rejected", (e) => assert.equal(e.upstreamText, "bad request: state too big"));
      await expectKind(service.decide(call(), opts), "context_rejected", (e) => {
        assert.equal(Array.from(e.upstreamText ?? "").length, 300);
        assert.ok(e.upstreamText?.endsWith("y…"));
        assert.equal(e.message, "model service rejected the request's context (HTTP 413)");
      });
      await expectKind(service.decide(call(), opts), "context_rejected", (e) => assert.match(e.upstreamText ?? "", /openai-style/));
      await expectKind(service.decide(call(), opts), "bad_status", (e) => {
        assert.equal(e.upstreamText, "invalid key Bearer [redacted]");
        assert.equal(e.message, "model service answered HTTP 401");
      });
      await expectKind(service.decide(call(), opts), "refused", (e) => {
        assert.equal(e.message, "model service refused the request (HTTP 422)");
        assert.equal(e.upstreamText, "not json at all", "a body that is not JSON is kept as text");
      });
      await expectKind(service.decide(call(), opts), "refused", (e) => assert.equal(e.upstreamText, undefined));
      await expectKind(service.decide(call(), opts), "context_rejected");
      await expectKind(service.decide(call(), opts), "context_rejected");
      await expectKind(service.decide(call(), opts), "bad_status", (e) => assert.equal(e.upstreamStatus, 500, "only a 4xx is the context"));
    } finally {
      await service.close();
      await upstream.close();
    }
  });

  test("after close(), calls fail with unavailable", async () => {
    const fake = await startFakeModelServer();
    const service = openSystemOneHttpService({ baseUrl: fake.url });
    try {
      await service.close();
      await service.close(); // idempotent
      await expectKind(service.decide(call(), { timeoutMs: 500 }), "unavailable");
    } finally {
      await fake.close();
    }
  });

  test("a base URL with a path prefix is honoured", async () => {
    let seen = "";
    const upstream = await customUpstream((req, res) => {
      seen = req.url ?? "";
      res.writeHead(200, { "content-type": "application/json" });
      res.end('{"models": [{"name": "m"}]}');
    });
    const service = openSystemOneHttpService({ baseUrl: `${upstream.url}/inference/` });
    try {
      assert.deepEqual(await service.listModels({ timeoutMs: 2000 }), [{ name: "m" }]);
      assert.equal(seen, "/inference/v1/models");
    } finally {
      await service.close();
      await upstream.close();
    }
  });

  test("invalid options are rejected without echoing the key", () => {
    assert.throws(() => openSystemOneHttpService({ baseUrl: "not a url" }), TypeError);
    assert.throws(() => openSystemOneHttpService({ baseUrl: "ftp://example.com" }), TypeError);
    assert.throws(() => openSystemOneHttpService({ baseUrl: "http://user:pw@example.com" }), TypeError);
    assert.throws(
      () => openSystemOneHttpService({ baseUrl: "http://127.0.0.1:1", apiKey: "bad\nSECRET" }),
      (err: Error) => err instanceof TypeError && !err.message.includes("SECRET"),
    );
    assert.throws(() => openSystemOneHttpService({ baseUrl: "http://127.0.0.1:1", connections: 0 }), TypeError);
  });
});

/**
 * Records the timers started with one of `delays` (a deadline's) and whether each was cleared. The adapter calls the
 * global setTimeout / clearTimeout, so wrapping them sees its timers; others (node:http's, undici's) use other delays.
 */
function watchTimers(delays: number[]): { started: number; uncleared: number; restore(): void } {
  const realSet = globalThis.setTimeout;
  const realClear = globalThis.clearTimeout;
  const open = new Set<unknown>();
  const watch = { started: 0, uncleared: 0, restore };
  globalThis.setTimeout = ((fn: (...a: unknown[]) => void, ms?: number, ...args: unknown[]) => {
    const timer = realSet(fn, ms, ...args);
    if (ms !== undefined && delays.includes(ms)) {
      watch.started++;
      open.add(timer);
      watch.uncleared = open.size;
    }
    return timer;
  }) as unknown as typeof setTimeout;
  globalThis.clearTimeout = ((timer: Parameters<typeof clearTimeout>[0]) => {
    open.delete(timer);
    watch.uncleared = open.size;
    realClear(timer);
  }) as typeof clearTimeout;
  function restore(): void {
    globalThis.setTimeout = realSet;
    globalThis.clearTimeout = realClear;
  }
  return watch;
}

const abortListeners = (signal: AbortSignal) => getEventListeners(signal, "abort").length;

describe("systemone-http service: what an exchange holds is released", () => {
  test("the deadline's timer and the listener on the caller's signal are released however the exchange ends", async () => {
    const fake = await startFakeModelServer();
    const service = openSystemOneHttpService({ baseUrl: fake.url, connections: 2 });
    const small = openSystemOneHttpService({ baseUrl: fake.url, maxResponseBytes: 200 });
    // One signal shared by every call, as the gateway's shutdown signal is.
    const shared = new AbortController().signal;
    const long = { timeoutMs: 4321, signal: shared };
    const short = { timeoutMs: 151, signal: shared };
    const timers = watchTimers([4321, 151]);
    try {
      await service.decide(call(), long);
      assert.equal(abortListeners(shared), 0, "after an answer");
      await expectKind(service.decide(call("status:503"), long), "bad_status");
      assert.equal(abortListeners(shared), 0, "after a non-2xx status");
      await expectKind(service.decide(call("garbage"), long), "invalid_response");
      await expectKind(service.decide(call("reset"), long), "unavailable");
      await expectKind(service.decide(call("reset-mid-body"), long), "unavailable");
      assert.equal(abortListeners(shared), 0, "after network errors");
      await expectKind(small.decide(call(), long), "invalid_response");
      assert.equal(abortListeners(shared), 0, "after a body over the limit");

      const hanging = service.decide(call("hang"), short);
      assert.equal(abortListeners(shared), 1, "one listener while the call runs");
      await expectKind(hanging, "timeout");
      await expectKind(service.decide(call("hang-mid-body"), short), "timeout");
      assert.equal(abortListeners(shared), 0, "after timeouts");

      const own = new AbortController();
      setTimeout(() => own.abort(), 30);
      await expectKind(service.decide(call("hang-mid-body"), { timeoutMs: 4321, signal: own.signal }), "aborted");
      assert.equal(abortListeners(own.signal), 0, "after the caller's abort");
      await expectKind(service.decide(call(), { timeoutMs: 4321, signal: own.signal }), "aborted");
      await expectKind(service.listModels({ timeoutMs: 4321, signal: own.signal }), "aborted");

      assert.equal(timers.started, 9, "one deadline timer per started exchange, none for one aborted before it started");
      assert.equal(timers.uncleared, 0, "every deadline timer cleared");
    } finally {
      timers.restore();
      await service.close();
      await small.close();
      await fake.close();
    }
  });

  test("after a timed-out, aborted or over-limit exchange the next call is served (an unfinished body's connection is closed)", async () => {
    const okBody = JSON.stringify({ answers: { ok: { type: "noul", noul: 0.5 } }, usage: { input_tokens: 1, output_tokens: 1 } });
    let reply = "ok";
    const sockets: unknown[] = [];
    const upstream = await customUpstream((req: IncomingMessage, res) => {
      req.resume();
      sockets.push(req.socket);
      if (reply === "ok") {
        res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(okBody) });
        res.end(okBody);
      } else if (reply === "stall-body") {
        res.writeHead(200, { "content-type": "application/json", "content-length": 1000 });
        res.write('{"answers": {');
      } else if (reply === "endless") {
        res.writeHead(200, { "content-type": "application/json" });
        const timer = setInterval(() => res.write("x".repeat(1024)), 1);
        res.on("close", () => clearInterval(timer));
      } else if (reply === "declared-big") {
        res.writeHead(200, { "content-type": "application/json", "content-length": 5000 });
        res.end("x".repeat(5000));
      } else if (reply === "big-error") {
        res.writeHead(500, { "content-type": "application/json" });
        res.end(JSON.stringify({ detail: "z".repeat(70_000) }));
      }
    });
    const service = openSystemOneHttpService({ baseUrl: upstream.url, connections: 1, maxResponseBytes: 2000 });
    try {
      await service.decide(call(), { timeoutMs: 2000 });
      const cases: Array<[string, ModelErrorKind, () => { timeoutMs: number; signal?: AbortSignal }]> = [
        ["stall-body", "timeout", () => ({ timeoutMs: 150 })],
        ["stall-body", "aborted", () => ({ timeoutMs: 5000, signal: AbortSignal.timeout(50) })],
        ["endless", "invalid_response", () => ({ timeoutMs: 5000 })],
        ["declared-big", "invalid_response", () => ({ timeoutMs: 5000 })],
        ["big-error", "bad_status", () => ({ timeoutMs: 5000 })],
      ];
      for (const [behaviour, kind, options] of cases) {
        reply = behaviour;
        const served = sockets.length;
        await expectKind(service.decide(call(), options()), kind, (err) => assert.equal(err.upstreamText, undefined));
        assert.equal(sockets.length, served + 1, `the "${behaviour}" call was sent`);
        const bad = sockets.at(-1);
        reply = "ok";
        // One connection in the pool: a connection kept with the rest of a body on it would hold the next call up.
        const next = service.decide(call(), { timeoutMs: 5000 });
        assert.ok(await settlesBefore(next, 1000), `the call after "${behaviour}" was answered`);
        await next;
        // A body cut off unfinished leaves its connection unusable: it must have been closed. (A body over the limit that
        // arrived whole may leave it reusable.)
        if (behaviour === "stall-body" || behaviour === "endless") {
          assert.notEqual(sockets.at(-1), bad, `the call after "${behaviour}" came on a new connection`);
        }
      }
    } finally {
      // Upstream first: it drops every connection, so that close() does not wait on a body a regression left running.
      await upstream.close();
      await service.close();
    }
  });

  test("a response that is not HTTP/1.1 (a bad status line, a bad header) is invalid_response, not unavailable", async () => {
    for (const reply of ["HTTP/1.1 abc\r\n\r\n", "HTTP/1.1 200 OK\r\nbad header line\r\n\r\n"]) {
      const server = createNetServer((socket) => socket.once("data", () => socket.end(reply)));
      await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
      const service = openSystemOneHttpService({ baseUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}` });
      try {
        await expectKind(service.decide(call(), { timeoutMs: 2000 }), "invalid_response", (err) =>
          assert.match(err.message, /malformed HTTP response/),
        );
      } finally {
        await service.close();
        await new Promise<void>((r) => server.close(() => r()));
      }
    }
  });

  test("a call given up while it waits for a pooled connection fails when one takes it, is never sent, and costs no other call", async () => {
    const fake = await startFakeModelServer();
    const service = openSystemOneHttpService({ baseUrl: fake.url, connections: 1 });
    try {
      const busy = service.decide(call("hang"), { timeoutMs: 700 });
      const queued = service.decide(call(), { timeoutMs: 150 });
      const signal = AbortSignal.timeout(50);
      const abortedInQueue = service.decide(call(), { timeoutMs: 5000, signal });
      // Held until the busy connection is free (its caller's router answers at the deadline on its own): settling
      // earlier would leave the request queued in the pool, where each one given up would later close a connection.
      assert.equal(await settlesBefore(queued, 300), false, "still waiting while the connection is busy");
      await expectKind(busy, "timeout");
      await expectKind(queued, "timeout", (err) => assert.match(err.message, /150 ms/));
      await expectKind(abortedInQueue, "aborted");
      assert.equal(abortListeners(signal), 0);
      const before = fake.calls.decide;
      await service.decide(call(), { timeoutMs: 2000 });
      assert.equal(fake.calls.decide, before + 1, "the calls given up were never sent");
    } finally {
      await service.close();
      await fake.close();
    }
  });

  test("body limit boundaries, 1xx responses, repeated headers, a non-2xx body cut short", async () => {
    const okBody = JSON.stringify({ answers: { ok: { type: "noul", noul: 0.5 } }, usage: { input_tokens: 1, output_tokens: 1 } });
    const size = Buffer.byteLength(okBody);
    let reply = "";
    const upstream = await customUpstream((req, res) => {
      req.resume();
      if (reply === "declared") {
        res.writeHead(200, { "content-type": "application/json", "content-length": size });
        res.end(okBody);
      } else if (reply === "chunked") {
        res.writeHead(200, { "content-type": "application/json" });
        res.write(okBody.slice(0, 10));
        res.end(okBody.slice(10));
      } else if (reply === "early-hints") {
        res.writeEarlyHints({ link: "</style.css>; rel=preload; as=style" });
        res.writeHead(200, { "content-type": "application/json" });
        res.end(okBody);
      } else if (reply === "two-retry-after") {
        res.setHeader("retry-after", ["4", "9"]);
        res.writeHead(429, { "content-type": "text/plain" });
        res.end("busy");
      } else if (reply === "error-stalls") {
        res.writeHead(503, { "content-type": "application/json", "content-length": 100 });
        res.write('{"detail": "par');
      }
    });
    const exact = openSystemOneHttpService({ baseUrl: upstream.url, maxResponseBytes: size });
    const oneLess = openSystemOneHttpService({ baseUrl: upstream.url, maxResponseBytes: size - 1 });
    try {
      for (const r of ["declared", "chunked"]) {
        reply = r;
        assert.deepEqual((await exact.decide(call(), { timeoutMs: 2000 })).usage, { input_tokens: 1, output_tokens: 1 });
        await expectKind(oneLess.decide(call(), { timeoutMs: 2000 }), "invalid_response", (err) =>
          assert.equal(err.message, `model service response is larger than ${size - 1} bytes`),
        );
      }
      reply = "early-hints";
      assert.deepEqual((await exact.decide(call(), { timeoutMs: 2000 })).usage, { input_tokens: 1, output_tokens: 1 });
      reply = "two-retry-after";
      await expectKind(exact.decide(call(), { timeoutMs: 2000 }), "overloaded", (err) => {
        assert.equal(err.retryAfterSeconds, 4);
        assert.equal(err.upstreamText, "busy");
      });
      // Headers came but the body stalls: at the deadline the status alone answers; a caller's abort wins over it.
      reply = "error-stalls";
      const stalled = exact.decide(call(), { timeoutMs: 150 });
      assert.ok(await settlesBefore(stalled, 1000), "failed at its deadline");
      await expectKind(stalled, "bad_status", (err) => {
        assert.equal(err.message, "model service answered HTTP 503");
        assert.equal(err.upstreamText, undefined);
      });
      await expectKind(exact.decide(call(), { timeoutMs: 5000, signal: AbortSignal.timeout(50) }), "aborted");
    } finally {
      await exact.close();
      await oneLess.close();
      await upstream.close();
    }
  });
});
