import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { type ModelService, ModelServiceError } from "../../src/models/model-service.ts";
import { drawByWeight, pickPowerOfTwo } from "../../src/models/routing/balancer.ts";
import { smallestContext } from "../../src/models/routing/context.ts";
import { normalizeDeployments } from "../../src/models/routing/deployment.ts";
import { cooldownMs, HealthTracker } from "../../src/models/routing/health.ts";
import { attemptOutcome, healthOutcome, isRetryable, withRoute } from "../../src/models/routing/outcomes.ts";
import type { HealthState } from "../../src/models/routing/types.ts";
import { type AcquireFailure, WaitQueue } from "../../src/models/routing/wait-queue.ts";
import { mulberry32 } from "../support/seeded-random.ts";
import { VirtualTime } from "../support/virtual-time.ts";

describe("balancer", () => {
  test("drawByWeight draws ∝ weight and never the excluded one", () => {
    const items = [
      { id: "a", weight: 1, outstanding: 0 },
      { id: "b", weight: 3, outstanding: 0 },
      { id: "c", weight: 6, outstanding: 0 },
    ];
    const random = mulberry32(1);
    const counts: Record<string, number> = { a: 0, b: 0, c: 0 };
    const n = 20_000;
    for (let i = 0; i < n; i++) counts[drawByWeight(items, random)!.id]!++;
    assert.ok(Math.abs(counts.a! / n - 0.1) < 0.015, JSON.stringify(counts));
    assert.ok(Math.abs(counts.b! / n - 0.3) < 0.015, JSON.stringify(counts));
    assert.ok(Math.abs(counts.c! / n - 0.6) < 0.015, JSON.stringify(counts));
    for (let i = 0; i < 1000; i++) assert.notEqual(drawByWeight(items, random, items[2])!.id, "c");
    assert.equal(drawByWeight([items[0]!], random, items[0]), undefined);
    // A random() at the very top end still draws a candidate.
    assert.equal(drawByWeight(items, () => 0.9999999999999999)!.id, "c");
  });

  test("pickPowerOfTwo takes the lower outstanding/weight; the first drawn on a tie", () => {
    const a = { weight: 1, outstanding: 2 };
    const b = { weight: 1, outstanding: 1 };
    // random 0 draws a first, then b.
    assert.equal(
      pickPowerOfTwo([a, b], () => 0),
      b,
    );
    // b is heavier: 3/4 < 2/1.
    const heavy = { weight: 4, outstanding: 3 };
    assert.equal(
      pickPowerOfTwo([a, heavy], () => 0),
      heavy,
    );
    const idle1 = { weight: 1, outstanding: 0 };
    const idle2 = { weight: 1, outstanding: 0 };
    assert.equal(
      pickPowerOfTwo([idle1, idle2], () => 0),
      idle1,
    );
    assert.equal(
      pickPowerOfTwo([idle1], () => 0.5),
      idle1,
    );
    assert.throws(() => pickPowerOfTwo([], () => 0), RangeError);
  });
});

describe("health tracker", () => {
  const config = { failureThreshold: 3, cooldownInitialMs: 100, cooldownMaxMs: 350 };
  const fail = new ModelServiceError("unavailable", "refused");

  function tracker() {
    const changes: HealthState[] = [];
    return { t: new HealthTracker(config, (s) => changes.push(s)), changes };
  }

  test("cooldownMs doubles up to the maximum", () => {
    assert.deepEqual(
      [0, 1, 2, 3, 10, 5000].map((l) => cooldownMs(l, config)),
      [100, 200, 350, 350, 350, 350],
    );
  });

  test("threshold consecutive failures start a cooldown; a success in between resets the count", () => {
    const { t, changes } = tracker();
    for (let i = 0; i < 2; i++) t.end(t.begin(0), "failure", 0, fail);
    t.end(t.begin(0), "success", 0);
    for (let i = 0; i < 2; i++) t.end(t.begin(0), "failure", 0, fail);
    assert.equal(t.state(0), "healthy");
    t.end(t.begin(0), "failure", 10, fail);
    assert.equal(t.state(10), "cooling_down");
    assert.equal(t.retryInMs(10), 100);
    assert.equal(t.open(109), false);
    assert.equal(t.lastFailure, fail);
    assert.equal(t.state(110), "probing");
    assert.deepEqual(changes, ["cooling_down", "probing"]);
  });

  test("one probe at a time; a failed probe → the next, longer cooldown; a good probe → healthy", () => {
    const { t, changes } = tracker();
    for (let i = 0; i < 3; i++) t.end(t.begin(0), "failure", 0, fail);
    assert.equal(t.open(100), true);
    const probe = t.begin(100);
    assert.equal(probe.probe, true);
    assert.equal(t.open(100), false, "no second call while the probe runs");
    t.end(probe, "failure", 150, fail);
    assert.equal(t.state(150), "cooling_down");
    assert.equal(t.retryInMs(150), 200);
    const probe2 = t.begin(350);
    t.end(probe2, "failure", 350, fail);
    assert.equal(t.retryInMs(350), 350, "capped at cooldownMaxMs");
    const probe3 = t.begin(700);
    t.end(probe3, "neutral", 700); // an aborted probe: the next call probes again
    assert.equal(t.state(700), "probing");
    assert.equal(t.open(700), true);
    const probe4 = t.begin(700);
    t.end(probe4, "success", 710);
    assert.equal(t.state(710), "healthy");
    assert.equal(t.lastFailure, null);
    // Back to the first cooldown length after a recovery.
    for (let i = 0; i < 3; i++) t.end(t.begin(710), "failure", 710, fail);
    assert.equal(t.retryInMs(710), 100);
    assert.deepEqual(changes, ["cooling_down", "probing", "cooling_down", "probing", "cooling_down", "probing", "healthy", "cooling_down"]);
  });

  test("calls that started before a state change do not count after it", () => {
    const { t } = tracker();
    const old = [t.begin(0), t.begin(0), t.begin(0), t.begin(0), t.begin(0)];
    for (const ticket of old.slice(0, 3)) t.end(ticket, "failure", 0, fail);
    assert.equal(t.state(0), "cooling_down");
    t.end(old[3]!, "success", 1); // a late success does not end the cooldown
    t.end(old[4]!, "failure", 1, fail); // a late failure does not extend it
    assert.equal(t.state(1), "cooling_down");
    assert.equal(t.retryInMs(1), 99);
  });

  test("active checks: a failure starts a cooldown (once), a success ends it", () => {
    const { t, changes } = tracker();
    t.check(false, 0, fail);
    assert.equal(t.state(0), "cooling_down");
    t.check(false, 50, fail); // already cooling down: unchanged
    assert.equal(t.retryInMs(50), 50);
    t.check(true, 60);
    assert.equal(t.state(60), "healthy");
    // A check success while a probe runs makes it healthy; the probe's later result is ignored.
    for (let i = 0; i < 3; i++) t.end(t.begin(60), "failure", 60, fail);
    const probe = t.begin(200);
    t.check(true, 210);
    t.end(probe, "failure", 220, fail);
    assert.equal(t.state(220), "healthy");
    assert.deepEqual(changes, ["cooling_down", "healthy", "cooling_down", "probing", "healthy"]);
  });
});

describe("context, outcomes, deployments", () => {
  test("smallestContext takes the smallest limits given and strict if any is strict", () => {
    assert.deepEqual(
      smallestContext([
        { max_state: 4096, max_branch: 6144, strict: false },
        undefined,
        { max_state: 2048, strict: true },
        { max_branch: 8000 },
      ]),
      { max_state: 2048, max_branch: 6144, strict: true },
    );
    assert.deepEqual(smallestContext([{ strict: false }, { max_branch: 10 }]), { max_branch: 10, strict: false });
    assert.equal(smallestContext([undefined, {}]), undefined);
  });

  test("what is retried and what counts against a deployment", () => {
    const cases: Array<[ModelServiceError | Error, boolean, string]> = [
      [new ModelServiceError("unavailable", "x"), true, "failure"],
      [new ModelServiceError("timeout", "x"), true, "failure"],
      [new ModelServiceError("bad_status", "x", 503), true, "failure"],
      [new ModelServiceError("bad_status", "x", 401), true, "failure"],
      [new ModelServiceError("overloaded", "x", 429), true, "failure"],
      [new ModelServiceError("not_ready", "x"), true, "failure"],
      [new ModelServiceError("invalid_response", "x"), false, "success"],
      [new ModelServiceError("context_rejected", "x", 422), false, "success"],
      [new ModelServiceError("refused", "x", 422), false, "success"],
      [new ModelServiceError("aborted", "x"), false, "neutral"],
      [new TypeError("bug"), false, "neutral"],
    ];
    for (const [err, retryable, health] of cases) {
      assert.equal(isRetryable(err), retryable, err.message);
      assert.equal(healthOutcome(err), health, err.message);
    }
    assert.equal(healthOutcome(null), "success");
    assert.equal(attemptOutcome(null), "ok");
    assert.equal(attemptOutcome(new TypeError("bug")), "invalid_response");
    assert.equal(attemptOutcome(new ModelServiceError("overloaded", "x")), "overloaded");
  });

  test("withRoute copies kind, status, message and the upstream's words, and adds the route", () => {
    const routed = withRoute(
      new ModelServiceError("bad_status", "HTTP 503", 503, { upstreamText: "db down", retryAfterSeconds: 2 }),
      "gpu-b",
      3,
    );
    assert.equal(routed.kind, "bad_status");
    assert.equal(routed.upstreamStatus, 503);
    assert.equal(routed.upstreamText, "db down");
    assert.equal(routed.retryAfterSeconds, 2);
    assert.equal(routed.message, "HTTP 503 (after 3 attempts)");
    assert.deepEqual(routed.route, { deployment: "gpu-b", attempts: 3 });
    assert.equal(withRoute(new ModelServiceError("timeout", "late"), null, 0).message, "late");
    assert.equal(new ModelServiceError("timeout", "x").route, undefined);
  });

  test("normalizeDeployments fills defaults and rejects bad lists", () => {
    const service = { decide: async () => ({}), listModels: async () => [], close: async () => {} } as unknown as ModelService;
    assert.deepEqual(normalizeDeployments("m", [{ name: "a", service, upstreamName: "up" }]), [
      { name: "a", service, upstreamName: "up", weight: 1, maxConcurrency: null, fallback: false },
    ]);
    assert.throws(() => normalizeDeployments("m", []), /at least one deployment/);
    assert.throws(
      () =>
        normalizeDeployments("m", [
          { name: "a", service, upstreamName: "u" },
          { name: "a", service, upstreamName: "u" },
        ]),
      /used twice/,
    );
    assert.throws(() => normalizeDeployments("m", [{ name: "a", service, upstreamName: "u", weight: 0 }]), /weight/);
    assert.throws(() => normalizeDeployments("m", [{ name: "a", service, upstreamName: "u", weight: Infinity }]), /weight/);
    assert.throws(() => normalizeDeployments("m", [{ name: "a", service, upstreamName: "u", maxConcurrency: 0 }]), /maxConcurrency/);
    assert.throws(() => normalizeDeployments("m", [{ name: "a", service, upstreamName: "" }]), /upstreamName/);
  });
});

describe("wait queue", () => {
  test("serves waiters first in, first out; a deadline ends a wait with busy; an abort with aborted", async () => {
    const time = new VirtualTime();
    const queue = new WaitQueue<string>(time, time.nowMs);
    let slots = 0;
    const grant = (name: string) => () => {
      if (slots <= 0) return null;
      slots--;
      return { lease: name };
    };
    const order: string[] = [];
    const settle = (p: Promise<string>, name: string) =>
      p.then(
        (l) => order.push(`${l}`),
        (e: AcquireFailure) => order.push(`${name}:${e.reason}`),
      );
    const controller = new AbortController();
    const all = [
      settle(queue.wait(grant("w1"), 100), "w1"),
      settle(queue.wait(grant("w2"), 100, controller.signal), "w2"),
      settle(queue.wait(grant("w3"), 100), "w3"),
      settle(queue.wait(grant("w4"), 50), "w4"),
    ];
    assert.equal(queue.length, 4);
    slots = 1;
    queue.drain();
    await time.advance(0);
    controller.abort();
    await time.advance(49);
    assert.deepEqual(order, ["w1", "w2:aborted"]);
    await time.advance(1);
    assert.deepEqual(order, ["w1", "w2:aborted", "w4:busy"]);
    slots = 5;
    queue.drain();
    await Promise.all(all);
    assert.deepEqual(order, ["w1", "w2:aborted", "w4:busy", "w3"]);
    assert.equal(queue.length, 0);
  });

  test("a grant that fails ends the wait; rejectAll ends every wait", async () => {
    const time = new VirtualTime();
    const queue = new WaitQueue<string>(time, time.nowMs);
    let down = false;
    const a = queue.wait(() => (down ? { fail: "down" } : null), 100);
    const b = queue.wait(() => null, 100);
    down = true;
    queue.drain();
    await assert.rejects(a, (e: AcquireFailure) => e.reason === "down");
    queue.rejectAll("closed");
    await assert.rejects(b, (e: AcquireFailure) => e.reason === "closed");
    await assert.rejects(
      queue.wait(() => null, 0),
      (e: AcquireFailure) => e.reason === "busy",
    );
  });
});
