import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { type FallbackMode, type FallbackOptions, withFallback } from "../../src/limits/fallback-rate-limiter.ts";
import type { RateDecision, RateLimiter } from "../../src/limits/rate-limiter.ts";

/** An outage of the fake primary (what isOutage accepts below); any other Error is a misuse. */
class Outage extends Error {}

function deferred<T>(): { promise: Promise<T>; resolve: (value: T) => void; reject: (err: unknown) => void } {
  let resolve!: (value: T) => void;
  let reject!: (err: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/**
 * An in-memory limiter whose answers the test sets: `answer` (its `remaining` tells which limiter
 * answered), a rejection, or a pending call settled by the test.
 */
class FakeLimiter implements RateLimiter {
  readonly calls: { key: string; limit: number }[] = [];
  /** Rejects every call with this, when set. */
  failure: unknown = null;
  /** When set, every call waits for it before answering or failing. */
  gate: Promise<void> | null = null;
  answer: RateDecision;

  constructor(
    readonly name: string,
    remaining: number,
    private readonly closes: string[] = [],
  ) {
    this.answer = { allowed: true, retryAfterMs: 0, remaining };
  }

  async consume(key: string, limit: number): Promise<RateDecision> {
    this.calls.push({ key, limit });
    if (this.gate) await this.gate;
    if (this.failure !== null) throw this.failure;
    return this.answer;
  }

  async close(): Promise<void> {
    this.closes.push(this.name);
  }
}

const FROM_PRIMARY: RateDecision = { allowed: true, retryAfterMs: 0, remaining: 1 };
const FROM_FALLBACK: RateDecision = { allowed: true, retryAfterMs: 0, remaining: 2 };

class RecordingLogger {
  readonly warns: { obj: Record<string, unknown>; msg: string }[] = [];
  readonly infos: { obj: Record<string, unknown>; msg: string }[] = [];
  warn(obj: object, msg: string): void {
    this.warns.push({ obj: obj as Record<string, unknown>, msg });
  }
  info(obj: object, msg: string): void {
    this.infos.push({ obj: obj as Record<string, unknown>, msg });
  }
}

function setup(overrides: Partial<FallbackOptions> = {}) {
  const closes: string[] = [];
  const primary = new FakeLimiter("primary", 1, closes);
  const fallback = new FakeLimiter("fallback", 2, closes);
  const logger = new RecordingLogger();
  const modes: FallbackMode[] = [];
  let ready = true;
  let clock = 1000;
  const limiter = withFallback(primary, fallback, {
    isOutage: (err) => err instanceof Outage,
    primaryReady: () => ready,
    logger,
    logLines: {
      outage: "primary down",
      outageFields: { target: "fake", timeoutMs: 5 },
      recovered: "primary back",
      recoveredFields: { target: "fake" },
    },
    onModeChange: (m) => modes.push(m),
    now: () => clock,
    ...overrides,
  });
  return {
    limiter,
    primary,
    fallback,
    logger,
    modes,
    closes,
    setReady: (r: boolean) => (ready = r),
    advance: (ms: number) => (clock += ms),
  };
}

/** Puts the limiter in fallback mode: the primary fails one check with an outage (and stays failing). */
async function startOutage(s: ReturnType<typeof setup>, err: unknown = new Outage("refused")): Promise<void> {
  s.primary.failure = err;
  assert.deepEqual(await s.limiter.consume("org", 5), FROM_FALLBACK);
  assert.equal(s.limiter.mode(), "fallback");
}

describe("withFallback: a RateLimiter over a primary and a fallback", () => {
  test("while the primary answers, it alone answers: nothing logged, no mode change", async () => {
    const s = setup();
    for (let i = 0; i < 3; i++) assert.deepEqual(await s.limiter.consume(`k${i}`, 7), FROM_PRIMARY);
    assert.deepEqual(s.primary.calls, [
      { key: "k0", limit: 7 },
      { key: "k1", limit: 7 },
      { key: "k2", limit: 7 },
    ]);
    assert.equal(s.fallback.calls.length, 0);
    assert.equal(s.limiter.mode(), "primary");
    assert.deepEqual(s.modes, []);
    assert.equal(s.logger.warns.length + s.logger.infos.length, 0);
  });

  test("an outage: the failed check is answered by the fallback, one warn with the error and fields, one mode change", async () => {
    const s = setup();
    const err = new Outage("connection refused");
    await startOutage(s, err);
    assert.deepEqual(s.fallback.calls, [{ key: "org", limit: 5 }], "the same key and limit");
    assert.deepEqual(s.modes, ["fallback"]);
    assert.equal(s.logger.warns.length, 1);
    assert.equal(s.logger.warns[0]!.msg, "primary down");
    assert.deepEqual(s.logger.warns[0]!.obj, { err, target: "fake", timeoutMs: 5 });
    assert.equal(s.logger.infos.length, 0);
  });

  test("during an outage every check is answered, by the fallback's own limit: refused stays refused, never unlimited", async () => {
    const s = setup();
    s.setReady(false);
    await startOutage(s);
    const refusal = { allowed: false, retryAfterMs: 1234, remaining: 0 };
    s.fallback.answer = refusal;
    assert.deepEqual(await s.limiter.consume("org", 5), refusal);
    s.fallback.failure = new Error("fallback broken");
    await assert.rejects(s.limiter.consume("org", 5), /fallback broken/, "a failing fallback fails the check, it does not allow it");
    assert.equal(s.primary.calls.length, 1, "a primary that is not ready is not tried");
    assert.equal(s.logger.warns.length, 1, "logged once per outage");
    assert.deepEqual(s.modes, ["fallback"]);
  });

  test("concurrent checks failing at the start of an outage: one warn, one mode change, all answered by the fallback", async () => {
    const s = setup();
    const gate = deferred<void>();
    s.primary.gate = gate.promise;
    s.primary.failure = new Outage("timed out");
    const pending = Array.from({ length: 5 }, (_, i) => s.limiter.consume(`k${i}`, 5));
    gate.resolve();
    assert.deepEqual(await Promise.all(pending), Array(5).fill(FROM_FALLBACK));
    assert.equal(s.logger.warns.length, 1);
    assert.deepEqual(s.modes, ["fallback"]);
  });

  test("a non-outage error of the primary is passed on and switches nothing, in either mode", async () => {
    const s = setup();
    const misuse = new TypeError("bad key");
    s.primary.failure = misuse;
    await assert.rejects(s.limiter.consume("org", 5), (err) => err === misuse);
    assert.equal(s.limiter.mode(), "primary");
    assert.equal(s.fallback.calls.length, 0, "not answered by the fallback");

    await startOutage(s);
    s.primary.failure = misuse;
    await assert.rejects(s.limiter.consume("org", 5), (err) => err === misuse);
    assert.equal(s.limiter.mode(), "fallback", "nor does it end the outage");
    assert.deepEqual(s.modes, ["fallback"]);
    assert.equal(s.logger.warns.length, 1);
    assert.equal(s.logger.infos.length, 0);
  });

  test("a limit that is not a positive integer is a RangeError in either mode, and neither limiter is asked", async () => {
    const s = setup();
    for (const limit of [0, -1, 1.5, Number.NaN]) await assert.rejects(s.limiter.consume("k", limit), RangeError);
    s.setReady(false);
    await startOutage(s);
    const before = s.fallback.calls.length;
    for (const limit of [0, 1.5]) await assert.rejects(s.limiter.consume("k", limit), RangeError);
    assert.equal(s.fallback.calls.length, before);
    assert.equal(s.primary.calls.length, 1);
    assert.equal(s.logger.warns.length, 1);
  });

  test("recovers by itself: the first check the ready primary answers switches back, answered by the primary, one info", async () => {
    const s = setup();
    await startOutage(s);
    s.advance(4321.4);
    // Still down: each check tries the primary, then is answered by the fallback.
    assert.deepEqual(await s.limiter.consume("org", 5), FROM_FALLBACK);
    assert.equal(s.primary.calls.length, 2);
    assert.equal(s.limiter.mode(), "fallback");
    s.primary.failure = null;
    assert.deepEqual(await s.limiter.consume("org", 5), FROM_PRIMARY);
    assert.equal(s.limiter.mode(), "primary");
    assert.deepEqual(s.modes, ["fallback", "primary"]);
    assert.equal(s.logger.warns.length, 1);
    assert.equal(s.logger.infos.length, 1);
    assert.equal(s.logger.infos[0]!.msg, "primary back");
    assert.deepEqual(s.logger.infos[0]!.obj, { target: "fake", outageMs: 4321 });
    assert.deepEqual(await s.limiter.consume("org", 5), FROM_PRIMARY);

    // A second outage is a new one: logged again, once.
    await startOutage(s);
    assert.deepEqual(await s.limiter.consume("org", 5), FROM_FALLBACK);
    assert.equal(s.logger.warns.length, 2);
    assert.deepEqual(s.modes, ["fallback", "primary", "fallback"]);
  });

  test("during an outage only one check at a time tries the primary; the others are answered by the fallback at once", async () => {
    const s = setup();
    await startOutage(s);
    const gate = deferred<void>();
    s.primary.gate = gate.promise;
    const trying = s.limiter.consume("a", 5);
    const others = await Promise.all([s.limiter.consume("b", 5), s.limiter.consume("c", 5)]);
    assert.deepEqual(others, [FROM_FALLBACK, FROM_FALLBACK]);
    assert.deepEqual(
      s.primary.calls.map((c) => c.key),
      ["org", "a"],
    );
    gate.resolve();
    assert.deepEqual(await trying, FROM_FALLBACK, "the trying check failed, so the fallback answered it");
    s.primary.gate = null;
    // Freed: the next check tries the primary again.
    await s.limiter.consume("d", 5);
    assert.deepEqual(
      s.primary.calls.map((c) => c.key),
      ["org", "a", "d"],
    );
    assert.equal(s.logger.warns.length, 1);
  });

  test("probe(): during an outage a ping that answers switches back; one that fails does not; it never rejects", async () => {
    let pingFails = true;
    let pings = 0;
    const s = setup({
      ping: async () => {
        pings++;
        if (pingFails) throw new Outage("no pong");
      },
    });
    await s.limiter.probe();
    assert.equal(pings, 0, "no ping while the primary answers");
    s.setReady(false);
    await startOutage(s);
    await s.limiter.probe();
    assert.equal(pings, 1);
    assert.equal(s.limiter.mode(), "fallback");
    assert.equal(s.logger.infos.length, 0);
    pingFails = false;
    await s.limiter.probe();
    assert.equal(s.limiter.mode(), "primary");
    assert.deepEqual(s.modes, ["fallback", "primary"]);
    assert.equal(s.logger.infos.length, 1);
    s.primary.failure = null;
    assert.deepEqual(await s.limiter.consume("org", 5), FROM_PRIMARY);
  });

  test("probe() does not ping while a check is trying the primary, and without a ping it does nothing", async () => {
    let pings = 0;
    const s = setup({ ping: async () => void pings++ });
    await startOutage(s);
    const gate = deferred<void>();
    s.primary.gate = gate.promise;
    const trying = s.limiter.consume("a", 5);
    await s.limiter.probe();
    assert.equal(pings, 0);
    gate.resolve();
    await trying;

    const t = setup();
    await startOutage(t);
    await t.limiter.probe();
    assert.equal(t.limiter.mode(), "fallback");
  });

  test("a slow answer from before a switch cannot undo it", async () => {
    const s = setup();
    // Started while the primary answered; fails only after the outage began and ended.
    const slow = deferred<void>();
    s.primary.gate = slow.promise;
    const stale = s.limiter.consume("stale", 5);
    s.primary.gate = null;
    await startOutage(s);
    s.primary.failure = null;
    assert.deepEqual(await s.limiter.consume("org", 5), FROM_PRIMARY);
    assert.equal(s.limiter.mode(), "primary");
    s.primary.failure = new Outage("late timeout");
    slow.resolve();
    assert.deepEqual(await stale, FROM_FALLBACK, "the stale check is still answered");
    assert.equal(s.limiter.mode(), "primary", "but does not start a new outage");
    assert.deepEqual(s.modes, ["fallback", "primary"]);
    assert.equal(s.logger.warns.length, 1);
  });

  test("a throwing logger or mode listener does not turn a check into an error", async () => {
    const s = setup({
      logger: {
        warn: () => {
          throw new Error("logger broken");
        },
        info: () => {
          throw new Error("logger broken");
        },
      },
      onModeChange: () => {
        throw new Error("listener broken");
      },
    });
    await startOutage(s);
    s.primary.failure = null;
    assert.deepEqual(await s.limiter.consume("org", 5), FROM_PRIMARY);
    assert.equal(s.limiter.mode(), "primary");
  });

  test("close() closes the primary then the fallback, once; checks afterwards reject; a late failure logs nothing", async () => {
    const s = setup({ name: "Fake limiter" });
    const gate = deferred<void>();
    s.primary.gate = gate.promise;
    const inFlight = s.limiter.consume("org", 5);
    await s.limiter.close();
    await s.limiter.close();
    assert.deepEqual(s.closes, ["primary", "fallback"]);
    await assert.rejects(s.limiter.consume("org", 5), /^Error: Fake limiter is closed$/);
    s.primary.failure = new Outage("connection closed");
    gate.resolve();
    await inFlight;
    assert.equal(s.limiter.mode(), "primary");
    assert.deepEqual(s.modes, []);
    assert.equal(s.logger.warns.length, 0);
  });

  test("close() closes the fallback even when closing the primary fails", async () => {
    const s = setup();
    s.primary.close = async () => {
      throw new Error("close failed");
    };
    await assert.rejects(s.limiter.close(), /close failed/);
    assert.deepEqual(s.closes, ["fallback"]);
  });

  test("without log lines it logs generic ones", async () => {
    const s = setup({ logLines: undefined });
    await startOutage(s);
    s.primary.failure = null;
    await s.limiter.consume("org", 5);
    assert.match(s.logger.warns[0]!.msg, /unreachable: falling back/);
    assert.deepEqual(Object.keys(s.logger.warns[0]!.obj), ["err"]);
    assert.match(s.logger.infos[0]!.msg, /reachable again/);
    assert.deepEqual(Object.keys(s.logger.infos[0]!.obj), ["outageMs"]);
  });
});
