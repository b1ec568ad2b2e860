import assert from "node:assert/strict";
import { after, describe, test } from "node:test";
import {
  type CallOptions,
  type ModelAnswerSet,
  type ModelCall,
  type ModelErrorKind,
  type ModelService,
  ModelServiceError,
  type TokenBound,
  type UpstreamModel,
} from "../../src/models/model-service.ts";
import {
  createModelRouter,
  type DeploymentInput,
  type HealthState,
  type RouterOptions,
  type RouterTimers,
} from "../../src/models/routing/index.ts";
import { openSystemOneHttpService } from "../../src/models/systemone-http/systemone-http-service.ts";
import { type FakeModelServer, startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { mulberry32 } from "../support/seeded-random.ts";
import { eventually, settlesBefore } from "../support/timer-race.ts";
import { flush, VirtualTime } from "../support/virtual-time.ts";

// ---------------------------------------------------------------------------------------------
// Fakes

/** What one decide call of a FakeService does. */
type Step =
  | "ok"
  | "hang" // until its deadline ("timeout") or its signal ("aborted"), like the real adapters
  | "hang-deaf" // ignores deadline and signal; settles only through release()
  | "manual" // settles through release()/failPending(), or its deadline/signal
  | { fail: ModelErrorKind; status?: number; afterMs?: number }
  | { okAfterMs: number };

type ListStep = "ok" | "hang" | { fail: ModelErrorKind };

const real: RouterTimers = { setTimeout: (fn, ms) => setTimeout(fn, ms), clearTimeout: (h) => clearTimeout(h as NodeJS.Timeout) };

class FakeService implements ModelService {
  readonly decides: Array<{ model: string; timeoutMs: number; at: number }> = [];
  lists = 0;
  closed = 0;
  running = 0;
  /** The step of the n-th call (0-based); the default answers. */
  script: (n: number) => Step = () => "ok";
  listStep: ListStep = "ok";
  models: UpstreamModel[];
  bound: TokenBound | null | undefined = undefined;
  readonly manual: Array<{ resolve: () => void; reject: (e: Error) => void }> = [];

  constructor(
    readonly name: string,
    private readonly time: VirtualTime | null,
    models?: UpstreamModel[],
  ) {
    this.models = models ?? [{ name: "up" }];
  }

  private get timers(): RouterTimers {
    return this.time ?? real;
  }

  private now(): number {
    return this.time ? this.time.now : performance.now();
  }

  always(step: Step): this {
    this.script = () => step;
    return this;
  }

  decide(call: ModelCall, options: CallOptions): Promise<ModelAnswerSet> {
    const n = this.decides.length;
    this.decides.push({ model: call.model, timeoutMs: options.timeoutMs, at: this.now() });
    const step = this.script(n);
    this.running++;
    const answer: ModelAnswerSet = { answers: { by: this.name }, usage: { input_tokens: 1, output_tokens: 0 }, latencyMs: 1 };
    const p = new Promise<ModelAnswerSet>((resolve, reject) => {
      const deaf = step === "hang-deaf";
      const timer = deaf
        ? undefined
        : this.timers.setTimeout(() => reject(new ModelServiceError("timeout", `${this.name} timed out`)), options.timeoutMs);
      const onAbort = () => reject(new ModelServiceError("aborted", `${this.name} aborted`));
      if (!deaf) options.signal?.addEventListener("abort", onAbort, { once: true });
      const done = () => {
        if (timer !== undefined) this.timers.clearTimeout(timer);
        options.signal?.removeEventListener("abort", onAbort);
      };
      const ok = () => {
        done();
        resolve(answer);
      };
      const fail = (e: Error) => {
        done();
        reject(e);
      };
      if (step === "ok") return ok();
      if (step === "hang") return;
      if (step === "hang-deaf" || step === "manual") return void this.manual.push({ resolve: ok, reject: fail });
      if ("okAfterMs" in step) return void this.timers.setTimeout(ok, step.okAfterMs);
      const error = new ModelServiceError(step.fail, `${this.name}: ${step.fail}${step.status ? ` ${step.status}` : ""}`, step.status);
      if (step.afterMs === undefined) return fail(error);
      this.timers.setTimeout(() => fail(error), step.afterMs);
    });
    const done = () => this.running--;
    p.then(done, done);
    return p;
  }

  /** Answers the oldest manual / deaf call. */
  release(): void {
    this.manual.shift()?.resolve();
  }

  async listModels(options: CallOptions): Promise<UpstreamModel[]> {
    this.lists++;
    const step = this.listStep;
    if (step === "ok") return structuredClone(this.models);
    if (step === "hang") {
      return new Promise((_, reject) =>
        options.signal?.addEventListener("abort", () => reject(new ModelServiceError("aborted", "list aborted")), { once: true }),
      );
    }
    throw new ModelServiceError(step.fail, `${this.name}: list ${step.fail}`);
  }

  get tokenBound(): ((call: ModelCall) => Promise<TokenBound | null>) | undefined {
    const bound = this.bound;
    return bound === undefined ? undefined : async () => bound;
  }

  async close(): Promise<void> {
    this.closed++;
  }
}

const CALL: ModelCall = { model: "public", state: { ticket: "x" }, questions: { q: { type: "noul" } } };

function by(answer: ModelAnswerSet): string {
  return (answer.answers as { by: string }).by;
}

function dep(service: FakeService, extra: Partial<DeploymentInput> = {}): DeploymentInput {
  return { name: service.name, service, upstreamName: "up", ...extra };
}

interface Recorded {
  attempts: Array<[string, string]>;
  health: Array<[string, HealthState]>;
  checks: Array<[string, string]>;
}

function recorder(): Recorded & { observer: NonNullable<RouterOptions["observer"]> } {
  const r: Recorded = { attempts: [], health: [], checks: [] };
  return {
    ...r,
    observer: {
      attempt: (d, outcome) => r.attempts.push([d, outcome]),
      healthChanged: (d, s) => r.health.push([d, s]),
      check: (d, outcome) => r.checks.push([d, outcome]),
    },
  };
}

/** A router on virtual time; random() = 0 draws the first candidate first (and keeps it on a load tie). */
function virtualRouter(time: VirtualTime, deployments: DeploymentInput[], options: RouterOptions = {}) {
  return createModelRouter("public", deployments, {
    nowMs: time.nowMs,
    timers: time,
    random: () => 0,
    healthCheckIntervalMs: null,
    ...options,
  });
}

async function rejection(p: Promise<unknown>): Promise<ModelServiceError> {
  try {
    await p;
  } catch (err) {
    assert.ok(err instanceof ModelServiceError, `expected a ModelServiceError, got ${String(err)}`);
    return err;
  }
  assert.fail("expected a rejection");
}

// ---------------------------------------------------------------------------------------------
// Balancing

describe("balancing", () => {
  test("spreads calls by weight (sequential calls, 4000 of them)", async () => {
    const services = [new FakeService("a", null), new FakeService("b", null), new FakeService("c", null)];
    const router = createModelRouter(
      "public",
      [dep(services[0]!, { weight: 1 }), dep(services[1]!, { weight: 2 }), dep(services[2]!, { weight: 5 })],
      {
        random: mulberry32(7),
        healthCheckIntervalMs: null,
      },
    );
    const n = 4000;
    for (let i = 0; i < n; i++) await router.decide(CALL, { timeoutMs: 1000 });
    const shares = services.map((s) => s.decides.length / n);
    assert.ok(Math.abs(shares[0]! - 1 / 8) < 0.025, `shares ${shares}`);
    assert.ok(Math.abs(shares[1]! - 2 / 8) < 0.025, `shares ${shares}`);
    assert.ok(Math.abs(shares[2]! - 5 / 8) < 0.025, `shares ${shares}`);
    assert.ok(
      services.every((s) => s.decides.every((d) => d.model === "up")),
      "call.model is the upstream name",
    );
    await router.close();
  });

  test("spreads calls in flight by weight too (steady load, 3000 calls of 20 ms)", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time).always({ okAfterMs: 20 });
    const b = new FakeService("b", time).always({ okAfterMs: 20 });
    const router = virtualRouter(time, [dep(a, { weight: 1 }), dep(b, { weight: 3 })], { random: mulberry32(3) });
    const calls: Promise<ModelAnswerSet>[] = [];
    let peakA = 0;
    let peakB = 0;
    for (let i = 0; i < 3000; i++) {
      calls.push(router.decide(CALL, { timeoutMs: 1000 }));
      await time.advance(1);
      peakA = Math.max(peakA, a.running);
      peakB = Math.max(peakB, b.running);
    }
    await time.advance(50);
    await Promise.all(calls);
    const shareA = a.decides.length / 3000;
    assert.ok(Math.abs(shareA - 0.25) < 0.05, `share of a ${shareA}`);
    assert.ok(peakB > peakA, `peaks a ${peakA} b ${peakB}`);
    await router.close();
  });

  test("power of two choices prefers the less loaded deployment", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time).always("ok");
    const b = new FakeService("b", time).always("hang");
    const router = virtualRouter(time, [dep(a), dep(b)], { random: mulberry32(11) });
    const hanging: Promise<unknown>[] = [];
    // Until b holds one call, calls may go to either; afterwards b (1 outstanding) always loses to a (0).
    for (let i = 0; i < 200; i++) {
      const p = router.decide(CALL, { timeoutMs: 10_000 });
      p.catch(() => {});
      hanging.push(p);
      await flush();
    }
    assert.equal(b.decides.length, 1);
    assert.equal(a.decides.length, 199);
    assert.deepEqual(
      router.health().deployments.map((d) => [d.name, d.outstanding]),
      [
        ["a", 0],
        ["b", 1],
      ],
    );
    await router.close();
  });

  test("equal weights and hanging calls: in-flight calls alternate (the less loaded always wins)", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time).always("hang");
    const b = new FakeService("b", time).always("hang");
    const c = new FakeService("c", time).always("hang");
    const router = virtualRouter(time, [dep(a), dep(b, { weight: 2 })], { random: mulberry32(5) });
    for (let i = 0; i < 30; i++) {
      router.decide(CALL, { timeoutMs: 10_000 }).catch(() => {});
      await flush();
    }
    // outstanding/weight stays level: b holds twice as many as a, give or take one.
    assert.ok(Math.abs(b.decides.length - 2 * a.decides.length) <= 2, `a ${a.decides.length} b ${b.decides.length}`);
    assert.equal(c.decides.length, 0);
    await router.close();
  });
});

// ---------------------------------------------------------------------------------------------
// Concurrency limits

describe("max concurrency", () => {
  test("a deployment at its maxConcurrency is skipped", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time).always("hang");
    const b = new FakeService("b", time).always("hang");
    const router = virtualRouter(time, [dep(a, { maxConcurrency: 2 }), dep(b)]);
    // Equal weights, hanging calls: a, b, a, b — then a is full and every further call goes to b.
    for (let i = 0; i < 10; i++) {
      router.decide(CALL, { timeoutMs: 10_000 }).catch(() => {});
      await flush();
    }
    assert.equal(a.decides.length, 2);
    assert.equal(b.decides.length, 8);
    await router.close();
  });

  test("when every deployment is full, calls wait FIFO for a slot, then fail with overloaded at their deadline", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time).always("manual");
    const b = new FakeService("b", time).always("manual");
    const router = virtualRouter(time, [dep(a, { maxConcurrency: 1 }), dep(b, { maxConcurrency: 1 })]);
    const first = router.decide(CALL, { timeoutMs: 1000 });
    const second = router.decide(CALL, { timeoutMs: 1000 });
    await flush();
    assert.equal(a.decides.length + b.decides.length, 2);
    const order: string[] = [];
    const third = router.decide(CALL, { timeoutMs: 500 }).then((r) => {
      order.push("third");
      return r;
    });
    await time.advance(10);
    const fourth = router.decide(CALL, { timeoutMs: 200 }).then((r) => {
      order.push("fourth");
      return r;
    });
    const fifth = router.decide(CALL, { timeoutMs: 1000 }).then((r) => {
      order.push("fifth");
      return r;
    });
    await time.advance(10);
    assert.equal(router.health().waiting, 3);
    // A slot frees at t=20: the oldest waiter (third) takes it.
    a.release();
    await time.advance(0);
    assert.equal(by(await first), "a");
    assert.equal(a.decides.length, 2, "third went to a");
    // fourth waits on, and fails at its own deadline (t=10+200), not later.
    let fourthAt: number | null = null;
    fourth.catch(() => (fourthAt = time.now));
    await time.advance(189);
    assert.equal(fourthAt, null);
    await time.advance(1);
    assert.equal(fourthAt, 210);
    const err = await rejection(fourth);
    assert.equal(err.kind, "overloaded");
    assert.match(err.message, /concurrency limit/);
    assert.deepEqual(err.route, { deployment: null, attempts: 0 });
    // fifth is still queued; it takes a's slot when third ends.
    a.release();
    assert.equal(by(await third), "a");
    await flush();
    assert.equal(a.decides.length, 3, "fifth went to a");
    a.release();
    b.release();
    assert.equal(by(await second), "b");
    assert.equal(by(await fifth), "a");
    assert.deepEqual(order, ["third", "fifth"]);
    await router.close();
  });

  test("a call aborted while waiting for a slot leaves the queue at once", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time).always("manual");
    const router = virtualRouter(time, [dep(a, { maxConcurrency: 1 })]);
    const first = router.decide(CALL, { timeoutMs: 1000 });
    const controller = new AbortController();
    const waiting = router.decide(CALL, { timeoutMs: 1000, signal: controller.signal });
    await time.advance(5);
    controller.abort();
    const err = await rejection(waiting);
    assert.equal(err.kind, "aborted");
    assert.equal(time.now, 5);
    assert.equal(router.health().waiting, 0);
    a.release();
    await first;
    await router.close();
  });

  test("waiting calls fail at once when the last usable deployment goes down, and are served by one that comes back", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time).always("manual");
    const b = new FakeService("b", time).always("ok");
    b.listStep = { fail: "unavailable" };
    const router = virtualRouter(time, [dep(a, { maxConcurrency: 1 }), dep(b)], {
      failureThreshold: 1,
      cooldownInitialMs: 10_000,
      maxAttempts: 1,
    });
    await router.checkNow(); // b cools down
    const first = router.decide(CALL, { timeoutMs: 1000 });
    const waiting = router.decide(CALL, { timeoutMs: 1000 });
    await time.advance(5);
    b.listStep = "ok";
    await router.checkNow(); // b is back: the waiter goes there
    assert.equal(by(await waiting), "b");

    b.listStep = { fail: "unavailable" };
    await router.checkNow();
    const queued = router.decide(CALL, { timeoutMs: 1000 });
    await time.advance(5);
    assert.equal(router.health().waiting, 1);
    // a's call fails: a cools down too, nothing is usable, the queued call fails at once.
    a.manual.shift()!.reject(new ModelServiceError("unavailable", "a: reset"));
    const err = await rejection(queued);
    assert.equal(err.kind, "unavailable");
    assert.match(err.message, /no healthy deployment/);
    assert.equal(time.now, 10);
    assert.equal((await rejection(first)).kind, "unavailable");
    await router.close();
  });

  test("fallback deployments do not take calls while the primaries are only full", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time).always("manual");
    const f = new FakeService("f", time).always("ok");
    const router = virtualRouter(time, [dep(a, { maxConcurrency: 1 }), dep(f, { fallback: true })]);
    const first = router.decide(CALL, { timeoutMs: 1000 });
    const second = router.decide(CALL, { timeoutMs: 1000 });
    await time.advance(1);
    assert.equal(f.decides.length, 0);
    a.release();
    await time.advance(0);
    a.release();
    assert.equal(by(await first), "a");
    assert.equal(by(await second), "a");
    await router.close();
  });
});

// ---------------------------------------------------------------------------------------------
// Failover

describe("failover", () => {
  const retryable: Array<{ fail: ModelErrorKind; status?: number }> = [
    { fail: "unavailable" },
    { fail: "timeout" },
    { fail: "bad_status", status: 503 },
    { fail: "bad_status", status: 500 },
    { fail: "bad_status", status: 404 },
    { fail: "overloaded", status: 429 },
    { fail: "overloaded", status: 529 },
    { fail: "not_ready" },
  ];
  for (const step of retryable) {
    test(`${step.fail}${step.status ? ` ${step.status}` : ""} is sent to another deployment`, async () => {
      const time = new VirtualTime();
      const a = new FakeService("a", time).always(step);
      const b = new FakeService("b", time).always("ok");
      const rec = recorder();
      const router = virtualRouter(time, [dep(a), dep(b)], { observer: rec.observer });
      const answer = await router.decide(CALL, { timeoutMs: 1000 });
      assert.equal(by(answer), "b");
      assert.deepEqual(answer.route, { deployment: "b", attempts: 2 });
      assert.deepEqual(rec.attempts, [
        ["a", step.fail],
        ["b", "ok"],
      ]);
      await router.close();
    });
  }

  for (const kind of ["invalid_response", "context_rejected", "aborted"] as const) {
    test(`${kind} is not retried`, async () => {
      const time = new VirtualTime();
      const a = new FakeService("a", time).always({ fail: kind, status: kind === "context_rejected" ? 422 : undefined });
      const b = new FakeService("b", time).always("ok");
      const router = virtualRouter(time, [dep(a), dep(b)]);
      const err = await rejection(router.decide(CALL, { timeoutMs: 1000 }));
      assert.equal(err.kind, kind);
      assert.deepEqual(err.route, { deployment: "a", attempts: 1 });
      if (kind === "context_rejected") assert.equal(err.upstreamStatus, 422);
      assert.equal(b.decides.length, 0);
      // These do not count against a: it answered (or the caller stopped).
      assert.equal(router.health().deployments[0]!.state, "healthy");
      await router.close();
    });
  }

  test("the caller's abort stops the call at once, with no further attempt", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time).always("hang-deaf");
    const b = new FakeService("b", time).always("ok");
    const router = virtualRouter(time, [dep(a), dep(b)]);
    const controller = new AbortController();
    const p = router.decide(CALL, { timeoutMs: 1000, signal: controller.signal });
    await time.advance(10);
    controller.abort();
    const err = await rejection(p);
    assert.equal(err.kind, "aborted");
    assert.equal(time.now, 10);
    assert.deepEqual(err.route, { deployment: "a", attempts: 1 });
    assert.equal(b.decides.length, 0);
    // A signal aborted before the call: nothing is tried.
    const err2 = await rejection(router.decide(CALL, { timeoutMs: 1000, signal: controller.signal }));
    assert.equal(err2.kind, "aborted");
    assert.deepEqual(err2.route, { deployment: null, attempts: 0 });
    a.release();
    await router.close();
  });

  test("at most maxAttempts attempts, preferring deployments not tried yet; the last failure is thrown with the route", async () => {
    const time = new VirtualTime();
    const services = ["a", "b", "c", "d"].map((n) => new FakeService(n, time).always({ fail: "bad_status", status: 502 }));
    const router = virtualRouter(
      time,
      services.map((s) => dep(s)),
      { maxAttempts: 3, random: mulberry32(1) },
    );
    const err = await rejection(router.decide(CALL, { timeoutMs: 1000 }));
    assert.equal(err.kind, "bad_status");
    assert.equal(err.upstreamStatus, 502);
    assert.equal(err.route?.attempts, 3);
    assert.match(err.message, /\(after 3 attempts\)$/);
    const tried = services.filter((s) => s.decides.length > 0);
    assert.equal(tried.length, 3, "three different deployments");
    assert.equal(err.route?.deployment, tried.find((s) => s.decides.length === 1 && s.name === err.route?.deployment)?.name);
    await router.close();
  });

  for (const kind of ["not_ready", "overloaded"] as const) {
    test(`after ${kind}, the same deployment is not tried again within the call`, async () => {
      const time = new VirtualTime();
      const a = new FakeService("a", time).always({ fail: kind });
      const single = virtualRouter(time, [dep(a)]);
      const err = await rejection(single.decide(CALL, { timeoutMs: 1000 }));
      assert.equal(err.kind, kind);
      assert.deepEqual(err.route, { deployment: "a", attempts: 1 });
      assert.equal(err.message, `a: ${kind}`, "the engine's own message, e.g. 'still loading (42%)'");
      const b = new FakeService("b", time).always({ fail: kind });
      const c = new FakeService("c", time).always({ fail: kind });
      const two = virtualRouter(time, [dep(b), dep(c)]);
      const err2 = await rejection(two.decide(CALL, { timeoutMs: 1000 }));
      assert.equal(err2.kind, kind);
      assert.deepEqual(err2.route, { deployment: "c", attempts: 2 });
      await single.close();
      await two.close();
    });
  }

  test("a call goes to each deployment at most once: with a single deployment, a failure is not retried", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time);
    a.script = (n) => (n < 1 ? { fail: "unavailable" } : "ok");
    const router = virtualRouter(time, [dep(a)]);
    const err = await rejection(router.decide(CALL, { timeoutMs: 1000 }));
    assert.equal(err.kind, "unavailable");
    assert.deepEqual(err.route, { deployment: "a", attempts: 1 });
    assert.equal(a.decides.length, 1);
    const answer = await router.decide(CALL, { timeoutMs: 1000 });
    assert.deepEqual(answer.route, { deployment: "a", attempts: 1 }, "the next call is answered");
    const b = new FakeService("b", time).always({ fail: "bad_status", status: 503 });
    const c = new FakeService("c", time).always({ fail: "bad_status", status: 503 });
    const two = virtualRouter(time, [dep(b), dep(c)], { maxAttempts: 5 });
    const err2 = await rejection(two.decide(CALL, { timeoutMs: 1000 }));
    assert.equal(err2.route?.attempts, 2, "two deployments: two attempts even with maxAttempts 5");
    assert.deepEqual([b.decides.length, c.decides.length], [1, 1]);
    await router.close();
    await two.close();
  });
});

// ---------------------------------------------------------------------------------------------
// The one deadline

describe("deadline", () => {
  test("a hanging deployment eats its attempt's time; no attempt starts after the deadline", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time).always("hang");
    const b = new FakeService("b", time).always("ok");
    const router = virtualRouter(time, [dep(a), dep(b)]);
    const p = router.decide(CALL, { timeoutMs: 100 });
    p.catch(() => {});
    await time.advance(100);
    const err = await rejection(p);
    assert.equal(err.kind, "timeout");
    assert.deepEqual(err.route, { deployment: "a", attempts: 1 });
    assert.equal(b.decides.length, 0);
    assert.equal(a.decides[0]!.timeoutMs, 100);
    await router.close();
  });

  test("each attempt gets the remaining time only", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time).always({ fail: "unavailable", afterMs: 60 });
    const b = new FakeService("b", time).always("hang");
    const c = new FakeService("c", time).always("ok");
    const router = virtualRouter(time, [dep(a), dep(b), dep(c)]);
    const p = router.decide(CALL, { timeoutMs: 100 });
    p.catch(() => {});
    await time.advance(100);
    const err = await rejection(p);
    assert.equal(err.kind, "timeout");
    assert.deepEqual(err.route, { deployment: "b", attempts: 2 });
    assert.equal(b.decides[0]!.at, 60);
    assert.equal(b.decides[0]!.timeoutMs, 40);
    assert.equal(c.decides.length, 0, "no attempt after the deadline");
    assert.equal(time.now, 100);
    // An answer after a failover reports the whole routed call's time.
    b.always({ okAfterMs: 15 });
    const answered = router.decide(CALL, { timeoutMs: 100 });
    await time.advance(100);
    const answer = await answered;
    assert.equal(answer.latencyMs, 75);
    assert.deepEqual(answer.route, { deployment: "b", attempts: 2 });
    await router.close();
  });

  test("a deployment that ignores its deadline and signal cannot hold the call past the deadline", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time).always("hang-deaf");
    const router = virtualRouter(time, [dep(a)]);
    let settledAt: number | null = null;
    const p = router.decide(CALL, { timeoutMs: 100 }).finally(() => (settledAt = time.now));
    p.catch(() => {});
    await time.advance(150);
    assert.equal(settledAt, 100);
    assert.equal((await rejection(p)).kind, "timeout");
    // Its slot stays taken until the service call settles.
    assert.equal(router.health().deployments[0]!.outstanding, 1);
    a.release();
    await flush();
    assert.equal(router.health().deployments[0]!.outstanding, 0);
    await router.close();
  });

  test("attemptTimeoutMs: a hanging deployment is left after it while another is left to try; the last attempt gets all the time left", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time).always("hang");
    const b = new FakeService("b", time).always({ okAfterMs: 10 });
    const router = virtualRouter(time, [dep(a), dep(b)], { attemptTimeoutMs: 30 });
    const p = router.decide(CALL, { timeoutMs: 100 });
    await time.advance(100);
    const answer = await p;
    assert.deepEqual(answer.route, { deployment: "b", attempts: 2 });
    assert.equal(answer.latencyMs, 40);
    assert.equal(a.decides[0]!.timeoutMs, 30);
    assert.equal(b.decides[0]!.timeoutMs, 70, "the last possible attempt: all the time left");
    const single = virtualRouter(time, [dep(new FakeService("c", time).always("hang"))], { attemptTimeoutMs: 30 });
    const q = single.decide(CALL, { timeoutMs: 100 });
    q.catch(() => {});
    await time.advance(100);
    const err = await rejection(q);
    assert.equal(err.kind, "timeout");
    assert.match(err.message, /within 100 ms/, "one deployment: the whole deadline");
    await router.close();
    await single.close();
  });

  test("a timeoutMs of 0 fails at once", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time);
    const router = virtualRouter(time, [dep(a)]);
    const err = await rejection(router.decide(CALL, { timeoutMs: 0 }));
    assert.equal(err.kind, "timeout");
    assert.equal(a.decides.length, 0);
    await router.close();
  });
});

// ---------------------------------------------------------------------------------------------
// Health

describe("passive health", () => {
  test("failureThreshold failures → cooldown; backoff grows per failed probe; a good probe → healthy", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time).always({ fail: "unavailable" });
    const b = new FakeService("b", time).always("ok");
    const rec = recorder();
    const router = virtualRouter(time, [dep(a), dep(b)], {
      observer: rec.observer,
      failureThreshold: 3,
      cooldownInitialMs: 1000,
      cooldownMaxMs: 3000,
    });
    const state = () => router.health().deployments[0]!;
    for (let i = 0; i < 3; i++) assert.equal(by(await router.decide(CALL, { timeoutMs: 500 })), "b");
    assert.equal(a.decides.length, 3);
    assert.equal(state().state, "cooling_down");
    assert.equal(state().retryInMs, 1000);
    for (let i = 0; i < 5; i++) await router.decide(CALL, { timeoutMs: 500 });
    assert.equal(a.decides.length, 3, "no calls during the cooldown");

    await time.advance(1000);
    assert.equal(state().state, "probing");
    await router.decide(CALL, { timeoutMs: 500 }); // the probe fails (and the call goes on to b)
    assert.equal(a.decides.length, 4);
    assert.equal(state().state, "cooling_down");
    assert.equal(state().retryInMs, 2000);
    await time.advance(2000);
    await router.decide(CALL, { timeoutMs: 500 });
    assert.equal(state().retryInMs, 3000, "capped at cooldownMaxMs");

    a.always("ok");
    await time.advance(3000);
    assert.equal(by(await router.decide(CALL, { timeoutMs: 500 })), "a", "the probe");
    assert.equal(state().state, "healthy");
    assert.deepEqual(
      rec.health.filter(([d]) => d === "a").map(([, s]) => s),
      ["cooling_down", "probing", "cooling_down", "probing", "cooling_down", "probing", "healthy"],
    );
    await router.close();
  });

  test("one probe at a time: other calls avoid a deployment whose probe is running", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time).always({ fail: "unavailable" });
    const b = new FakeService("b", time).always("ok");
    const router = virtualRouter(time, [dep(a), dep(b)], { failureThreshold: 1, cooldownInitialMs: 100 });
    await router.decide(CALL, { timeoutMs: 500 });
    await time.advance(100);
    a.always("manual");
    const probe = router.decide(CALL, { timeoutMs: 500 });
    await flush();
    assert.equal(a.decides.length, 2);
    for (let i = 0; i < 5; i++) assert.equal(by(await router.decide(CALL, { timeoutMs: 500 })), "b");
    a.release();
    assert.equal(by(await probe), "a");
    assert.equal(router.health().deployments[0]!.state, "healthy");
    await router.close();
  });

  test("calls that started before a cooldown neither end nor extend it", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time);
    a.script = (n) => (n < 3 ? { fail: "unavailable", afterMs: 10 } : { okAfterMs: 20 });
    const router = virtualRouter(time, [dep(a)], { failureThreshold: 3, cooldownInitialMs: 1000, maxAttempts: 1 });
    const calls = [0, 1, 2, 3].map(() => router.decide(CALL, { timeoutMs: 500 }).catch((e: ModelServiceError) => e.kind));
    await time.advance(30);
    assert.equal(router.health().deployments[0]!.state, "cooling_down");
    assert.deepEqual(
      (await Promise.all(calls)).slice(0, 4).map((r) => (typeof r === "string" ? r : by(r))),
      ["unavailable", "unavailable", "unavailable", "a"],
    );
    assert.equal(router.health().deployments[0]!.state, "cooling_down", "the late success did not end the cooldown");
    await router.close();
  });
});

describe("active health checks", () => {
  test("a failed check starts a cooldown, a good one ends it; close() stops the checks", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time);
    const b = new FakeService("b", time);
    a.listStep = { fail: "unavailable" };
    const rec = recorder();
    const router = virtualRouter(time, [dep(a), dep(b)], {
      observer: rec.observer,
      healthCheckIntervalMs: 1000,
      checkTimeoutMs: 100,
      cooldownInitialMs: 60_000,
      cooldownMaxMs: 60_000,
    });
    assert.equal(a.lists, 0, "no checks before start()");
    router.start();
    router.start(); // idempotent
    await flush();
    assert.equal(a.lists, 1);
    assert.equal(router.health().deployments[0]!.state, "cooling_down");
    for (let i = 0; i < 4; i++) assert.equal(by(await router.decide(CALL, { timeoutMs: 500 })), "b");

    a.listStep = "ok";
    await time.advance(1000);
    assert.equal(a.lists, 2);
    assert.equal(router.health().deployments[0]!.state, "healthy", "a good check ends even a long cooldown");

    // A check that hangs fails at checkTimeoutMs.
    b.listStep = "hang";
    await time.advance(1000);
    assert.equal(router.health().deployments[1]!.state, "healthy");
    await time.advance(100);
    assert.equal(router.health().deployments[1]!.state, "cooling_down");
    assert.deepEqual(rec.checks.slice(-2), [
      ["a", "ok"],
      ["b", "timeout"],
    ]);

    await router.close();
    const lists = a.lists;
    await time.advance(10_000);
    assert.equal(a.lists, lists, "no checks after close()");
    assert.equal(time.timerCount, 0, "no timers left");
  });

  test("checkNow runs one round; an engine still loading cools down and its not_ready is reported", async () => {
    const time = new VirtualTime();
    const engine = new FakeService("engine", time).always({ fail: "not_ready" });
    engine.listStep = { fail: "not_ready" };
    const router = virtualRouter(time, [dep(engine)]);
    await router.checkNow();
    assert.equal(router.health().usable, false);
    const err = await rejection(router.decide(CALL, { timeoutMs: 1000 }));
    assert.equal(err.kind, "not_ready", "one loading engine: the gateway's 503 'still loading'");
    assert.match(err.message, /engine: list not_ready/);
    assert.equal(engine.decides.length, 0);
    await router.close();
  });
});

// ---------------------------------------------------------------------------------------------
// Fallback, all down

describe("fallback and all down", () => {
  test("a fallback is used only while no primary is usable, and left as soon as one is", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time).always("ok");
    const b = new FakeService("b", time).always("ok");
    const f = new FakeService("f", time).always("ok");
    const router = virtualRouter(time, [dep(a), dep(b), dep(f, { fallback: true, weight: 1000 })], {
      failureThreshold: 1,
      cooldownInitialMs: 500,
      random: mulberry32(9),
    });
    for (let i = 0; i < 100; i++) await router.decide(CALL, { timeoutMs: 500 });
    assert.equal(f.decides.length, 0);

    a.always({ fail: "unavailable" });
    b.always({ fail: "bad_status", status: 503 });
    const answer = await router.decide(CALL, { timeoutMs: 500 });
    assert.equal(by(answer), "f");
    assert.equal(answer.route?.attempts, 3);
    assert.equal(router.health().usable, true);
    for (let i = 0; i < 10; i++) assert.deepEqual((await router.decide(CALL, { timeoutMs: 500 })).route, { deployment: "f", attempts: 1 });

    a.always("ok");
    await time.advance(500);
    const fCalls = f.decides.length;
    for (let i = 0; i < 20; i++) assert.notEqual(by(await router.decide(CALL, { timeoutMs: 500 })), "f");
    assert.equal(f.decides.length, fCalls);
    await router.close();
  });

  test("a call that has tried every primary goes on to a fallback, even before the primaries cool down", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time).always({ fail: "unavailable" });
    const b = new FakeService("b", time).always({ fail: "bad_status", status: 503 });
    const f = new FakeService("f", time).always("ok");
    const router = virtualRouter(time, [dep(a), dep(b), dep(f, { fallback: true })], { failureThreshold: 100 });
    const answer = await router.decide(CALL, { timeoutMs: 500 });
    assert.deepEqual(answer.route, { deployment: "f", attempts: 3 });
    assert.deepEqual([a.decides.length, b.decides.length], [1, 1]);
    const short = virtualRouter(time, [dep(a), dep(b), dep(f, { fallback: true })], { failureThreshold: 100, maxAttempts: 2 });
    const err = await rejection(short.decide(CALL, { timeoutMs: 500 }));
    assert.deepEqual(err.route?.attempts, 2, "maxAttempts still bounds the call");
    assert.equal(f.decides.length, 1);
    await router.close();
    await short.close();
  });

  test("all down: decide fails at once (not at its deadline) with unavailable naming the model", async () => {
    const a = new FakeService("a", null).always({ fail: "unavailable" });
    const b = new FakeService("b", null).always({ fail: "bad_status", status: 503 });
    const router = createModelRouter("public", [dep(a), dep(b)], { failureThreshold: 1, healthCheckIntervalMs: null });
    await rejection(router.decide(CALL, { timeoutMs: 30_000 }));
    assert.equal(router.health().usable, false);
    const call = router.decide(CALL, { timeoutMs: 30_000 });
    assert.ok(await settlesBefore(call, 10_000), "failed before a timer far shorter than its deadline");
    const err = await rejection(call);
    assert.equal(err.kind, "unavailable");
    assert.match(err.message, /^no healthy deployment of model "public"; the next is tried again in \d+\.\d s; last failure: /);
    assert.deepEqual(err.route, { deployment: null, attempts: 0 });
    assert.equal(a.decides.length + b.decides.length, 2);
    await router.close();
  });

  test("all down mid-call: the call ends with its last failure and the route", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time).always({ fail: "bad_status", status: 503 });
    const router = virtualRouter(time, [dep(a)], { failureThreshold: 1 });
    const err = await rejection(router.decide(CALL, { timeoutMs: 1000 }));
    assert.equal(err.kind, "bad_status");
    assert.equal(err.upstreamStatus, 503);
    assert.equal(err.message, "a: bad_status 503");
    assert.deepEqual(err.route, { deployment: "a", attempts: 1 });
    // The next call tries nothing.
    const next = await rejection(router.decide(CALL, { timeoutMs: 1000 }));
    assert.equal(next.kind, "unavailable");
    assert.match(next.message, /no healthy deployment of model "public".*last failure: a: bad_status 503/);
    assert.deepEqual(next.route, { deployment: null, attempts: 0 });
    await router.close();
  });
});

// ---------------------------------------------------------------------------------------------
// listModels, tokenBound, close

describe("listModels, tokenBound, close", () => {
  test("listModels: one entry, the smallest context; failing or non-listing deployments skipped; cached", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time, [
      { name: "up", context: { max_state: 4096, max_branch: 6144, strict: false } },
      { name: "other" },
    ]);
    const b = new FakeService("b", time, [{ name: "up", context: { max_state: 2048, strict: true } }]);
    const c = new FakeService("c", time, [{ name: "something-else", context: { max_state: 10 } }]);
    const d = new FakeService("d", time);
    d.listStep = { fail: "unavailable" };
    const router = virtualRouter(time, [dep(a), dep(b), dep(c), dep(d)], { listCacheMs: 1000 });
    const expected = [{ name: "public", context: { max_state: 2048, max_branch: 6144, strict: true } }];
    assert.deepEqual(await router.listModels({ timeoutMs: 1000 }), expected);
    assert.deepEqual(await router.listModels({ timeoutMs: 1000 }), expected);
    assert.equal(a.lists, 1, "cached");
    await time.advance(1000);
    // b goes down: its last known limits still hold.
    b.listStep = { fail: "unavailable" };
    assert.deepEqual(await router.listModels({ timeoutMs: 1000 }), expected);
    assert.equal(a.lists, 2);

    a.listStep = { fail: "timeout" };
    await time.advance(1000);
    const err = await rejection(router.listModels({ timeoutMs: 1000 }));
    assert.equal(err.kind, "unavailable");
    assert.match(err.message, /no deployment of model "public" answered its model list/);
    await router.close();
  });

  test("listModels without any context; and not_ready when every deployment is loading", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time);
    const router = virtualRouter(time, [dep(a)]);
    assert.deepEqual(await router.listModels({ timeoutMs: 1000 }), [{ name: "public" }]);
    const e = new FakeService("e", time);
    e.listStep = { fail: "not_ready" };
    const loading = virtualRouter(time, [dep(e)]);
    assert.equal((await rejection(loading.listModels({ timeoutMs: 1000 }))).kind, "not_ready");
    await router.close();
    await loading.close();
  });

  test("tokenBound: the largest over deployments when all count; null when one cannot", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time);
    const b = new FakeService("b", time);
    a.bound = { input: 100, output: 3 };
    b.bound = { input: 90, output: 5 };
    const router = virtualRouter(time, [dep(a), dep(b)]);
    assert.deepEqual(await router.tokenBound!(CALL), { input: 100, output: 5 });
    b.bound = null;
    assert.equal(await router.tokenBound!(CALL), null);
    b.bound = undefined;
    assert.equal(await router.tokenBound!(CALL), null);
    await router.close();
  });

  test("close(): services are closed only when the router owns them (each once); later calls fail", async () => {
    const time = new VirtualTime();
    const shared = new FakeService("shared", time);
    const notOwned = virtualRouter(time, [dep(shared)]);
    await notOwned.close();
    assert.equal(shared.closed, 0);
    const owned = virtualRouter(
      time,
      [
        { name: "x", service: shared, upstreamName: "up" },
        { name: "y", service: shared, upstreamName: "up2" },
      ],
      { ownsServices: true },
    );
    await owned.close();
    await owned.close();
    assert.equal(shared.closed, 1);
    const err = await rejection(owned.decide(CALL, { timeoutMs: 100 }));
    assert.equal(err.kind, "unavailable");
    assert.match(err.message, /closed/);
    assert.equal(owned.health().usable, false);
  });

  test("close() ends the waits of queued calls", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time).always("manual");
    const router = virtualRouter(time, [dep(a, { maxConcurrency: 1 })]);
    const first = router.decide(CALL, { timeoutMs: 1000 });
    const queued = router.decide(CALL, { timeoutMs: 1000 });
    await flush();
    await router.close();
    assert.match((await rejection(queued)).message, /closed/);
    a.release();
    await first;
  });

  test("an observer that throws does not break routing", async () => {
    const time = new VirtualTime();
    const a = new FakeService("a", time);
    const boom = () => {
      throw new Error("observer bug");
    };
    const router = virtualRouter(time, [dep(a)], { observer: { attempt: boom, healthChanged: boom } });
    assert.equal(by(await router.decide(CALL, { timeoutMs: 100 })), "a");
    await router.close();
  });
});

// ---------------------------------------------------------------------------------------------
// Real HTTP model servers

describe("three real HTTP model servers", () => {
  const servers: FakeModelServer[] = [];
  after(async () => {
    await Promise.all(servers.map((s) => s.close()));
  });

  test("one server closed mid-way: no call fails; it gets traffic again after it restarts on the same port", async () => {
    const started = await Promise.all([0, 1, 2].map(() => startFakeModelServer()));
    servers.push(...started);
    const names = ["gpu-a", "gpu-b", "gpu-c"];
    const services = started.map((s) => openSystemOneHttpService({ baseUrl: s.url }));
    const rec = recorder();
    const router = createModelRouter(
      "public",
      started.map((_, i) => ({ name: names[i]!, service: services[i]!, upstreamName: "fake-small" })),
      {
        cooldownInitialMs: 50,
        cooldownMaxMs: 200,
        healthCheckIntervalMs: 100,
        checkTimeoutMs: 10_000, // generous: a busy machine must not fail a check of a healthy server
        observer: rec.observer,
        ownsServices: true,
      },
    );
    assert.deepEqual(await router.listModels({ timeoutMs: 5000 }), [
      { name: "public", context: { max_state: 4096, max_branch: 6144, strict: true } },
    ]);
    router.start();

    const call: ModelCall = { model: "public", state: { ticket: "charged twice" }, questions: { refund: { type: "noul" } } };
    let failures = 0;
    const errors: string[] = [];
    const servedBy: Record<string, number> = {};
    let phase: "before" | "down" | "after" = "before";
    const servedAfterRestart: Record<string, number> = {};
    let stop = false;
    const worker = async () => {
      while (!stop) {
        try {
          const answer = await router.decide(call, { timeoutMs: 30_000 });
          const d = answer.route!.deployment;
          servedBy[d] = (servedBy[d] ?? 0) + 1;
          if (phase === "after") servedAfterRestart[d] = (servedAfterRestart[d] ?? 0) + 1;
        } catch (err) {
          failures++;
          errors.push(String(err));
        }
      }
    };
    const workers = Array.from({ length: 8 }, worker);
    // Each phase lasts until what it is for has happened (counted), not for a time.
    const served = () => Object.values(servedBy).reduce((a, b) => a + b, 0);
    await eventually("calls served by every deployment", () => (names.every((n) => (servedBy[n] ?? 0) >= 10) ? true : undefined));
    const victim = started[1]!;
    const port = victim.port;
    victim.setBehavior("delay:30"); // so that calls are in flight on it when it goes
    const before = victim.calls.decide;
    await eventually("calls in flight on the victim", () => (victim.calls.decide >= before + 4 ? true : undefined));
    await victim.close();
    phase = "down";
    await eventually("the closed server taken out", () => (router.health().deployments[1]!.state !== "healthy" ? true : undefined));
    const servedWhileDown = served();
    await eventually("calls served while it is down", () => (served() >= servedWhileDown + 20 ? true : undefined));
    const revived = await startFakeModelServer({ port });
    servers.push(revived);
    phase = "after";
    await eventually("the restarted server back in use", () =>
      (servedAfterRestart["gpu-b"] ?? 0) > 0 && router.health().deployments[1]!.state === "healthy" ? true : undefined,
    );
    stop = true;
    await Promise.all(workers);

    assert.equal(failures, 0, errors.slice(0, 5).join("\n"));
    assert.ok(revived.calls.decide > 0, "traffic went to the restarted server");
    assert.ok((servedAfterRestart["gpu-b"] ?? 0) > 0, JSON.stringify(servedAfterRestart));
    assert.equal(router.health().deployments[1]!.state, "healthy");
    assert.ok(
      rec.attempts.some(([d, o]) => d === "gpu-b" && o === "unavailable"),
      "gpu-b failed while it was down",
    );
    assert.ok(rec.health.some(([d, s]) => d === "gpu-b" && s === "cooling_down"));
    await router.close();
  });
});
