/**
 * Several deployments of one model behind a real listening gateway: three fake model servers (real HTTP), the
 * router's spreading by weight, failover under load, cooldowns and recovery, fast 502s when nothing is healthy, an
 * in-process fallback engine (a generated GGUF) and money on a retried paid request.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, type TestContext, test } from "node:test";
import type { RouterOptions } from "../../src/models/routing/types.ts";
import { type FakeModelServer, startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { type ModelDir, makeModelDir } from "../fixtures/gguf/tiny-model.ts";
import { allUsage, assertLedgerMatches } from "../support/books.ts";
import { type Gateway, sampleRequest, startGateway } from "../support/gateway-harness.ts";
import { eventually, settlesBefore } from "../support/timer-race.ts";

const dir = mkdtempSync(join(tmpdir(), "tds-routing-"));
after(() => rmSync(dir, { recursive: true, force: true }));
let configs = 0;

/**
 * Fast cooldowns and checks, so that recovery is observable in a test's time. The deadlines of an attempt and of a
 * check stay generous: on a loaded machine a healthy fake can take hundreds of ms to answer, and a deadline it
 * missed would count as its failure (a failover, a cooldown) that no test here means to cause.
 */
const FAST: RouterOptions = {
  failureThreshold: 2,
  cooldownInitialMs: 200,
  cooldownMaxMs: 800,
  healthCheckIntervalMs: 200,
  checkTimeoutMs: 2000,
  attemptTimeoutMs: 2000,
};

/** Only the balancer: no cooldowns, no active checks, no attempt deadline short of the model's. */
const BALANCER_ONLY: RouterOptions = { failureThreshold: Number.MAX_SAFE_INTEGER, healthCheckIntervalMs: null, attemptTimeoutMs: null };

interface Deployment {
  service?: string;
  engine?: "llama";
  source?: string;
  fallback?: boolean;
}

/** A gateway whose model "decider" is deployed on `servers` (named a, b, c, ...) with `weights`, and `extra` deployments. */
async function routedGateway(
  servers: FakeModelServer[],
  options: { weights?: number[]; extra?: Deployment[]; router?: RouterOptions; env?: Record<string, string>; engines?: boolean } = {},
): Promise<Gateway> {
  const names = servers.map((_, i) => String.fromCharCode(97 + i));
  const path = join(dir, `config-${++configs}.json`);
  writeFileSync(
    path,
    JSON.stringify({
      model_services: servers.map((s, i) => ({ name: names[i], url: s.url, weight: options.weights?.[i] ?? 1 })),
      models: [
        {
          name: "decider",
          deployments: [...names.map((n) => ({ service: n, upstream_name: "fake-large" })), ...(options.extra ?? [])],
        },
      ],
    }),
    { mode: 0o600 },
  );
  return startGateway({
    fake: false,
    env: { TDS_CONFIG: path, TDS_MODEL_TIMEOUT_MS: "3000", ...options.env },
    routerOptions: options.router ?? FAST,
    ...(options.engines ? { engines: true } : {}),
  });
}

async function startServers(n: number): Promise<FakeModelServer[]> {
  return Promise.all(Array.from({ length: n }, () => startFakeModelServer()));
}

/** Starts a fake again on the port of one that was closed. */
async function restart(server: FakeModelServer): Promise<FakeModelServer> {
  return startFakeModelServer({ port: server.port });
}

interface Outcome {
  status: number;
  detail?: string;
  /** Reported, never asserted: load changes it. */
  ms: number;
  requestId: string;
}

/**
 * Sends `total` requests with `concurrency` in flight; `onDone(n)` runs after the n-th completes (to act mid-load).
 */
async function drive(
  gw: Gateway,
  total: number,
  concurrency: number,
  onDone: (n: number) => Promise<void> | void = () => {},
): Promise<Outcome[]> {
  const outcomes: Outcome[] = [];
  let next = 0;
  const body = JSON.stringify(sampleRequest());
  const worker = async () => {
    while (next < total) {
      next++;
      const started = performance.now();
      const res = await gw.decide(body);
      const text = await res.text();
      const outcome: Outcome = {
        status: res.status,
        ms: performance.now() - started,
        requestId: res.headers.get("x-service-request-id") ?? "",
      };
      if (res.status !== 200) outcome.detail = (JSON.parse(text) as { detail: string }).detail;
      outcomes.push(outcome);
      await onDone(outcomes.length);
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return outcomes;
}

/**
 * Sends one request at a time until `until()` holds, at most `limit` requests (and 60 s, against hanging); returns
 * how many were sent.
 */
async function sendUntil(gw: Gateway, until: () => boolean, limit: number): Promise<{ sent: number; ms: number; statuses: number[] }> {
  const started = performance.now();
  const statuses: number[] = [];
  while (!until() && statuses.length < limit && performance.now() - started < 60_000) {
    const res = await gw.decide(sampleRequest());
    await res.arrayBuffer();
    statuses.push(res.status);
  }
  return { sent: statuses.length, ms: performance.now() - started, statuses };
}

async function readyz(gw: Gateway): Promise<{
  status: number;
  body: { checks: { models: string }; models: Record<string, { state: string; healthy: number; deployments: number }> };
}> {
  const res = await fetch(`${gw.url}/readyz`);
  return { status: res.status, body: (await res.json()) as never };
}

function report(t: TestContext, what: string): void {
  t.diagnostic(what);
}

/** tds_deployment_attempts_total of model "decider": deployment → outcome → count. */
function attemptsByDeployment(metrics: string): Record<string, Record<string, number>> {
  const out: Record<string, Record<string, number>> = {};
  for (const m of metrics.matchAll(/^tds_deployment_attempts_total\{model="decider",deployment="([^"]+)",outcome="([^"]+)"\} (\d+)$/gm)) {
    const byOutcome = out[m[1]!] ?? {};
    byOutcome[m[2]!] = Number(m[3]);
    out[m[1]!] = byOutcome;
  }
  return out;
}

describe("routing across three model services", () => {
  test("traffic is spread by weight (1 : 2 : 3 over 1200 requests); every call is accounted for", async (t) => {
    const REQUESTS = 1200;
    const servers = await startServers(3);
    // The spread is the point, not failover: nothing a slow answer on a loaded machine could turn into a failure.
    const gw = await routedGateway(servers, { weights: [1, 2, 3], router: BALANCER_ONLY, env: { TDS_MODEL_TIMEOUT_MS: "60000" } });
    try {
      // One request at a time: no deployment has a call outstanding when one is chosen, so the choice is the weighted
      // draw alone. (Under concurrency the outstanding calls, which load changes, tilt the spread: by design.)
      const outcomes = await drive(gw, REQUESTS, 1);
      assert.equal(outcomes.filter((o) => o.status !== 200).length, 0);
      const records = await allUsage(gw.store, gw.orgId);
      assert.equal(records.length, REQUESTS);
      const names = ["a", "b", "c"];
      const calls = servers.map((s) => s.calls.decide);
      const attempts = attemptsByDeployment(await (await fetch(`${gw.url}/metrics`)).text());
      const failovers = records.reduce((sum, r) => sum + r.attempts - 1, 0);
      report(t, `calls ${calls.join(" / ")}; ${failovers} failovers`);
      // Each request is one call, plus one for each failover (a failed attempt also reached a server).
      assert.equal(
        calls.reduce((a, b) => a + b, 0),
        REQUESTS + failovers,
      );
      names.forEach((name, i) => {
        const ok = records.filter((r) => r.deployment === name).length;
        assert.equal(attempts[name]?.ok ?? 0, ok, `${name}: its successful attempts are the requests it answered`);
        const all = Object.values(attempts[name] ?? {}).reduce((a, b) => a + b, 0);
        assert.equal(all, calls[i], `${name}: every attempt the router counted reached the server`);
      });
      // The spread of first choices: requests answered at their first attempt. Drawn ∝ weight, so each share is
      // binomial; outside 5 standard deviations a correct balancer lands less than once in a million runs.
      const first = names.map((n) => records.filter((r) => r.deployment === n && r.attempts === 1).length);
      const n = first.reduce((a, b) => a + b, 0);
      const shares = first.map((c) => c / n);
      report(
        t,
        `first attempts ${first.join(" / ")}; shares ${shares.map((s) => s.toFixed(3)).join(" / ")} (expected 0.167 / 0.333 / 0.500)`,
      );
      for (const [i, expected] of [1 / 6, 2 / 6, 3 / 6].entries()) {
        const tolerance = 5 * Math.sqrt((expected * (1 - expected)) / n);
        assert.ok(
          Math.abs(shares[i]! - expected) <= tolerance,
          `deployment ${names[i]}: ${shares[i]} vs ${expected} ± ${tolerance.toFixed(3)}`,
        );
      }
    } finally {
      await gw.close();
      await Promise.all(servers.map((s) => s.close()));
    }
  });

  test("one server killed under load: no client-visible failure; it receives traffic again after it restarts", async (t) => {
    const servers = await startServers(3);
    for (const s of servers) s.setBehavior("delay:15"); // requests in flight when the server dies
    const gw = await routedGateway(servers);
    let b = servers[1]!;
    try {
      let killedAt = -1;
      const outcomes = await drive(gw, 1200, 16, async (n) => {
        if (n === 300) {
          killedAt = n;
          await b.close();
        }
      });
      assert.equal(killedAt, 300);
      const failed = outcomes.filter((o) => o.status !== 200);
      const pastDeadline = failed.filter((o) => o.ms >= 3000);
      report(
        t,
        `${outcomes.length} requests, ${failed.length} failed (${pastDeadline.length} of them past the 3 s deadline); slowest ${Math.max(...outcomes.map((o) => o.ms)).toFixed(0)} ms`,
      );
      assert.deepEqual(
        failed.filter((o) => o.ms < 3000),
        [],
        "the only acceptable failures are requests already past their deadline",
      );
      const records = await allUsage(gw.store, gw.orgId);
      const failedOver = records.filter((r) => r.attempts > 1);
      report(t, `${failedOver.length} requests were answered after a failover`);
      assert.ok(records.every((r) => r.outcome === "succeeded" && r.deployment !== null));
      assert.ok(failedOver.every((r) => r.deployment !== "b"));

      const down = await readyz(gw);
      assert.equal(down.status, 200, "one deployment down leaves the model degraded, not unavailable");
      assert.deepEqual(down.body.models.decider, { state: "degraded", healthy: 2, deployments: 3 });

      b = await restart(b);
      b.setBehavior("delay:15");
      servers[1] = b;
      const back = await sendUntil(gw, () => b.calls.decide > 0, 500);
      report(t, `the restarted server received traffic again after ${back.ms.toFixed(0)} ms (${back.sent} requests)`);
      assert.ok(b.calls.decide > 0, `the restarted server receives traffic again (not within ${back.sent} requests)`);
      assert.deepEqual(
        back.statuses.filter((s) => s !== 200),
        [],
      );
      assert.deepEqual((await readyz(gw)).body.models.decider, { state: "ok", healthy: 3, deployments: 3 });
    } finally {
      await gw.close();
      await Promise.all(servers.map((s) => s.close()));
    }
  });

  for (const behavior of ["status:503", "hang"]) {
    test(`one server answering ${behavior}: traffic moves away within a bounded number of requests, none fails`, async (t) => {
      const servers = await startServers(3);
      // A long first cooldown: once it starts, the server gets no call for the rest of the test.
      const gw = await routedGateway(servers, {
        router: { ...FAST, cooldownInitialMs: 60_000, cooldownMaxMs: 60_000, healthCheckIntervalMs: null },
        // Room for the second attempt after a hanging first one (FAST.attemptTimeoutMs), however slow the machine.
        env: { TDS_MODEL_TIMEOUT_MS: "20000" },
      });
      try {
        servers[0]!.setBehavior(behavior);
        const outcomes = await drive(gw, 300, 4);
        const failed = outcomes.filter((o) => o.status !== 200);
        const reached = servers[0]!.calls.decide;
        report(
          t,
          `${reached} of 300 requests reached the failing server; ${failed.length} failed; slowest ${Math.max(...outcomes.map((o) => o.ms)).toFixed(0)} ms`,
        );
        assert.deepEqual(failed, []);
        // failureThreshold consecutive failures start the cooldown; up to `concurrency` more were already on their way.
        assert.ok(reached <= FAST.failureThreshold! + 4, `${reached} requests reached it`);
        assert.ok(reached >= 1);
        const records = await allUsage(gw.store, gw.orgId);
        const metIt = records.filter((r) => r.attempts === 2);
        assert.equal(metIt.length, reached, "each request that met it was answered by another deployment");
        assert.ok(
          records.every((r) => r.attempts <= 2),
          "the others were answered by their first deployment",
        );
        if (behavior === "hang") {
          const ms = new Map(outcomes.map((o) => [o.requestId, o.ms]));
          for (const r of metIt)
            assert.ok(
              ms.get(r.requestId)! >= FAST.attemptTimeoutMs!,
              "a request that met the hanging server waited for its attempt deadline",
            );
        }
        assert.deepEqual((await readyz(gw)).body.models.decider, { state: "degraded", healthy: 2, deployments: 3 });
        const metrics = await (await fetch(`${gw.url}/metrics`)).text();
        const outcome = behavior === "hang" ? "timeout" : "bad_status";
        assert.match(
          metrics,
          new RegExp(`tds_deployment_attempts_total\\{model="decider",deployment="a",outcome="${outcome}"\\} ${reached}\\n`),
        );
        assert.match(metrics, /tds_deployment_healthy\{model="decider",deployment="a",state="cooling_down"\} 0\n/);
        assert.match(metrics, /tds_deployment_healthy\{model="decider",deployment="b",state="healthy"\} 1\n/);
        assert.match(metrics, /tds_deployment_latency_seconds_count\{model="decider",deployment="b"\} \d+\n/);
        assert.match(metrics, /tds_deployment_outstanding\{model="decider",deployment="c"\} 0\n/);
      } finally {
        await gw.close();
        await Promise.all(servers.map((s) => s.close()));
      }
    });
  }

  test("all down: 502 at once (no attempt, long before any deadline) naming the model; /readyz says which model has no healthy deployment", async (t) => {
    const servers = await startServers(3);
    // Any attempt from now on would take its whole deadline (the servers hang once cooled down), far longer than
    // the guard below: a 502 that beats the guard was answered without waiting for a deployment.
    const ATTEMPT_MS = 20_000;
    const GUARD_MS = ATTEMPT_MS / 2;
    const gw = await routedGateway(servers, {
      router: {
        ...FAST,
        healthCheckIntervalMs: null,
        cooldownInitialMs: 600_000,
        cooldownMaxMs: 600_000,
        attemptTimeoutMs: ATTEMPT_MS,
        // The router's own listing of the hanging servers gives up (and answers from memory) well before /readyz's
        // 2 s deadline for it: an order of two timers.
        checkTimeoutMs: 500,
      },
      env: { TDS_MODEL_TIMEOUT_MS: String(ATTEMPT_MS * 2) },
    });
    try {
      for (const s of servers) s.setBehavior("status:503");
      // failureThreshold failures of each deployment start their cooldowns.
      const warm = await drive(gw, 8, 4);
      assert.ok(
        warm.every((o) => o.status === 502),
        JSON.stringify(warm),
      );
      for (const s of servers) s.setBehavior("hang");
      const callsBefore = servers.map((s) => s.calls.decide);
      const times: number[] = [];
      for (let i = 0; i < 20; i++) {
        const started = performance.now();
        const answer = gw
          .decide(sampleRequest())
          .then(async (res) => ({ status: res.status, body: (await res.json()) as { detail: string } }));
        assert.ok(await settlesBefore(answer, GUARD_MS), `request ${i} was not answered before ${GUARD_MS} ms: it waited for a deployment`);
        const { status, body } = await answer;
        times.push(performance.now() - started);
        assert.equal(status, 502);
        assert.match(body.detail, /no healthy deployment of model "decider"; the next is tried again in \d+\.\d s/);
      }
      report(t, `all down: 502 in ${Math.min(...times).toFixed(1)}–${Math.max(...times).toFixed(1)} ms`);
      assert.deepEqual(
        servers.map((s) => s.calls.decide),
        callsBefore,
        "no deployment was called",
      );
      const ready = await readyz(gw);
      assert.equal(ready.status, 503);
      assert.match(ready.body.checks.models, /no healthy deployment of model "decider"/);
      assert.deepEqual(ready.body.models.decider, { state: "unavailable", healthy: 0, deployments: 3 });
      const records = (await allUsage(gw.store, gw.orgId)).slice(0, 20);
      assert.ok(
        records.every((r) => r.attempts === 0 && r.deployment === null && r.outcome === "model_error" && r.costMicrousd === 0),
        "a request no deployment could take is recorded with 0 attempts and no deployment",
      );
    } finally {
      await gw.close();
      await Promise.all(servers.map((s) => s.close()));
    }
  });
});

describe("replicas from a comma-separated TDS_MODEL_SERVICE_URL", () => {
  test("each model the replicas list is offered, with a deployment on every replica that lists it", async () => {
    const one = await startFakeModelServer({ models: [{ name: "shared", context: { max_state: 3000 } }] });
    const two = await startFakeModelServer({
      models: [{ name: "shared", context: { max_state: 2000, max_branch: 5000 } }, { name: "only-two" }],
    });
    const gw = await startGateway({ fake: false, env: { TDS_MODEL_SERVICE_URL: `${one.url}, ${two.url}` } });
    try {
      const listed = (await (await gw.get("/v1/models")).json()) as { models: unknown[] };
      assert.deepEqual(
        listed.models,
        [{ name: "shared", context: { max_state: 2000, max_branch: 5000 } }, { name: "only-two" }],
        "a model on both replicas publishes the smallest limits of the two",
      );
      for (let i = 0; i < 40; i++) {
        const res = await gw.decide({ ...sampleRequest({ state: { note: "short" } }), model: i % 2 ? "only-two" : "shared" });
        assert.equal(res.status, 200, await res.text());
      }
      assert.equal(one.received.filter((c) => c.model === "only-two").length, 0, "a model is sent only to replicas that list it");
      assert.equal(two.received.filter((c) => c.model === "only-two").length, 20);
      assert.ok(
        one.received.length > 0 && two.received.filter((c) => c.model === "shared").length > 0,
        "the shared model is spread over both",
      );
      const records = await allUsage(gw.store, gw.orgId);
      assert.deepEqual(
        new Set(records.map((r) => r.deployment)),
        new Set([`127.0.0.1:${one.port}`, `127.0.0.1:${two.port}`]),
        "replicas are named host:port",
      );
    } finally {
      await gw.close();
      await one.close();
      await two.close();
    }
  });
});

describe("a fallback deployment on the in-process engine", () => {
  let models: ModelDir;
  before(() => {
    models = makeModelDir();
  });
  after(() => models?.cleanup());

  test("is used only while the primaries are down", async (t) => {
    const servers = await startServers(2);
    // The engine answers one call at a time; on a loaded machine a queued call may take seconds, so this test's deadline is
    // generous: it is about which deployment answers, not how fast.
    const gw = await routedGateway(servers, {
      extra: [{ engine: "llama", source: models.model("tiny"), fallback: true }],
      engines: true,
      env: { TDS_MODEL_TIMEOUT_MS: "20000" },
    });
    let [a, b] = servers as [FakeModelServer, FakeModelServer];
    try {
      // The engine loads in the background; an active check marks it healthy once it has.
      await eventually(
        "the engine to be loaded",
        async () => ((await readyz(gw)).body.models.decider?.healthy === 3 ? true : undefined),
        120_000,
        100,
      );
      assert.deepEqual((await readyz(gw)).body.models.decider, { state: "ok", healthy: 3, deployments: 3 });

      const before = await drive(gw, 60, 4);
      assert.deepEqual(
        before.filter((o) => o.status !== 200),
        [],
      );
      assert.equal(a.calls.decide + b.calls.decide, 60, "primaries up: every request goes to them");

      await a.close();
      await b.close();
      const during = await drive(gw, 30, 2);
      const failed = during.filter((o) => o.status !== 200);
      report(t, `primaries down: ${failed.length} of 30 failed`);
      assert.deepEqual(failed, [], "each request goes on to the fallback after the primaries fail");
      let records = await allUsage(gw.store, gw.orgId);
      assert.ok(
        records.slice(0, 30).every((r) => r.deployment === "in-process"),
        "answered by the engine",
      );
      assert.equal(records.slice(30).filter((r) => r.deployment === "in-process").length, 0);

      a = await restart(a);
      b = await restart(b);
      servers.splice(0, 2, a, b);
      const back = await sendUntil(gw, () => a.calls.decide + b.calls.decide > 0, 500);
      report(t, `primaries took traffic again after ${back.ms.toFixed(0)} ms (${back.sent} requests)`);
      assert.ok(a.calls.decide + b.calls.decide > 0, `the restarted primaries take traffic again (not within ${back.sent} requests)`);
      const after = await drive(gw, 40, 2);
      assert.deepEqual(
        after.filter((o) => o.status !== 200),
        [],
      );
      records = await allUsage(gw.store, gw.orgId);
      assert.deepEqual(
        records.slice(0, 40).filter((r) => r.deployment === "in-process"),
        [],
        "with the primaries back, the fallback takes no traffic",
      );
    } finally {
      await gw.close();
      await Promise.all(servers.map((s) => s.close()));
    }
  });
});

describe("money on a retried request", () => {
  test("a paid request retried on a second deployment is reserved and charged once; its record names the deployment and the attempts", async () => {
    const servers = await startServers(2);
    const gw = await routedGateway(servers, {
      router: { ...FAST, failureThreshold: 1_000_000, healthCheckIntervalMs: null },
      env: { TDS_SERVICE_MODE: "paid" },
    });
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 50_000_000, nowMs: Date.now() });
      servers[0]!.setBehavior("status:503");
      const results: Array<{ requestId: string; cost: number }> = [];
      let retried: string | null = null;
      for (let i = 0; i < 40 && retried === null; i++) {
        const res = await gw.decide(sampleRequest());
        const body = (await res.json()) as { usage: { cost_usd: string } };
        assert.equal(res.status, 200, JSON.stringify(body));
        const requestId = res.headers.get("x-service-request-id")!;
        const record = (await (await gw.get(`/v1/usage/${requestId}`)).json()) as {
          deployment: string;
          attempts: number;
          cost_usd: string;
        };
        assert.equal(record.deployment, "b", "only b answers");
        if (record.attempts === 2) retried = requestId;
        else assert.equal(record.attempts, 1);
        results.push({ requestId, cost: (await gw.store.getUsage(gw.orgId, requestId))!.costMicrousd });
      }
      assert.ok(retried, "within 40 requests, one was sent to a first");
      assert.ok(servers[0]!.calls.decide >= 1);
      const record = (await gw.store.getUsage(gw.orgId, retried))!;
      assert.equal(record.outcome, "succeeded");
      assert.ok(record.costMicrousd > 0);
      const balance = await assertLedgerMatches(gw.store, gw.orgId);
      const charged = results.reduce((sum, r) => sum + r.cost, 0);
      assert.equal(balance.spent, charged, "spent is exactly the sum of the answered requests' costs");
      assert.equal(balance.reserved, 0);
      const ledger = await gw.store.listLedger(gw.orgId);
      assert.deepEqual(
        ledger.filter((e) => e.kind !== "grant").map((e) => [e.kind, e.reservationId]),
        results.map((r) => ["settle", r.requestId]),
        "one entry per request: its settlement",
      );
    } finally {
      await gw.close();
      await Promise.all(servers.map((s) => s.close()));
    }
  });
});
