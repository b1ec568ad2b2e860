/**
 * What operators see of deployments that fail and come back, through a real listening gateway with real fake model
 * servers: /readyz keeps counting a dead replica (2 of 3, degraded, for as long as it is down — also when the models
 * are discovered from the replicas' own lists), the server log says "deployment failing" once with its reason and
 * "deployment healthy again" once, an engine that is not ready does not add a warning per request, and a request that
 * a model service failed before it could be admitted is found in Usage by the id the client got.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Writable } from "node:stream";
import { after, describe, test } from "node:test";
import pino from "pino";
import type { Clock } from "../../src/domain/clock.ts";
import type { RouterOptions } from "../../src/models/routing/types.ts";
import { type FakeModelServer, startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { assertLedgerMatches } from "../support/books.ts";
import { createFakeModelService } from "../support/fake-model-service.ts";
import { type Gateway, sampleRequest, startGateway } from "../support/gateway-harness.ts";
import { eventually } from "../support/timer-race.ts";

const dir = mkdtempSync(join(tmpdir(), "tds-deployment-health-"));
after(() => rmSync(dir, { recursive: true, force: true }));

/** Short cooldowns and checks: a dead deployment goes through many cooldown → probe → cooldown rounds in a test's time. */
const FAST: RouterOptions = {
  failureThreshold: 2,
  cooldownInitialMs: 100,
  cooldownMaxMs: 300,
  healthCheckIntervalMs: 100,
  checkTimeoutMs: 2000,
  attemptTimeoutMs: 2000,
};

type LogLine = Record<string, unknown> & { level: number; msg: string };

/** A pino logger at debug whose JSON lines are kept. */
function capturedLog(): { logger: pino.Logger; lines: LogLine[] } {
  const lines: LogLine[] = [];
  const sink = new Writable({
    write(chunk, _enc, done) {
      for (const l of chunk.toString().split("\n").filter(Boolean)) lines.push(JSON.parse(l) as LogLine);
      done();
    },
  });
  return { logger: pino({ level: "debug" }, sink), lines };
}

/** Wall time moved on by `offsetMs`: lets the registry's 30 s cache of the services' lists run out at once. */
function offsetClock(): Clock & { offsetMs: number } {
  const clock = { offsetMs: 0, nowMs: () => Date.now() + clock.offsetMs };
  return clock;
}

interface ModelReadiness {
  state: string;
  healthy: number;
  deployments: number;
}

async function readyz(gw: Gateway): Promise<{ status: number; models: Record<string, ModelReadiness> }> {
  const res = await fetch(`${gw.url}/readyz`);
  const body = (await res.json()) as { models: Record<string, ModelReadiness> };
  return { status: res.status, models: body.models };
}

interface Setup {
  what: string;
  /** The gateway over the three servers, the public models they serve, and each server's deployment name. */
  start(servers: FakeModelServer[], log: pino.Logger, clock: Clock): Promise<{ gw: Gateway; models: string[]; names: string[] }>;
}

let configs = 0;
const SETUPS: Setup[] = [
  {
    what: "a model configured on three model services",
    async start(servers, log, clock) {
      const names = ["a", "b", "c"];
      const path = join(dir, `config-${++configs}.json`);
      const config = {
        model_services: servers.map((s, i) => ({ name: names[i], url: s.url })),
        models: [{ name: "decider", deployments: names.map((n) => ({ service: n, upstream_name: "fake-large" })) }],
      };
      writeFileSync(path, JSON.stringify(config), { mode: 0o600 });
      const gw = await startGateway({ fake: false, env: { TDS_CONFIG: path }, routerOptions: FAST, loggerInstance: log, clock });
      return { gw, models: ["decider"], names };
    },
  },
  {
    what: "replicas of TDS_MODEL_SERVICE_URL whose own lists are offered",
    async start(servers, log, clock) {
      const gw = await startGateway({
        fake: false,
        env: { TDS_MODEL_SERVICE_URL: servers.map((s) => s.url).join(",") },
        routerOptions: FAST,
        loggerInstance: log,
        clock,
      });
      return { gw, models: ["fake-small", "fake-large"], names: servers.map((s) => `127.0.0.1:${s.port}`) };
    },
  },
];

/** Transitions of one deployment's health state seen by polling the registry, until `count` cooldowns began after a probe. */
async function cooldownRounds(gw: Gateway, model: string, deployment: string, count: number): Promise<void> {
  let last = "";
  let rounds = 0;
  await eventually(
    `${count} cooldowns of ${deployment} after a probe`,
    () => {
      const d = gw.app.modelRegistry
        .health()
        .find((m) => m.model === model)
        ?.deployments.find((x) => x.name === deployment);
      if (d && last === "probing" && d.state === "cooling_down") rounds++;
      if (d) last = d.state;
      return rounds >= count ? true : undefined;
    },
    60_000,
    5,
  );
}

for (const setup of SETUPS) {
  describe(`a dead replica, ${setup.what}`, () => {
    test("/readyz stays degraded (2 of 3) while it is down; 'deployment failing' once, with its reason; 'deployment healthy again' once when it is back", async () => {
      const servers = await Promise.all([0, 1, 2].map(() => startFakeModelServer()));
      const { logger, lines } = capturedLog();
      const clock = offsetClock();
      const { gw, models, names } = await setup.start(servers, logger, clock);
      const dead = names[1]!;
      try {
        for (const model of models) assert.deepEqual((await readyz(gw)).models[model], { state: "ok", healthy: 3, deployments: 3 });
        await servers[1]!.close();
        await eventually("the dead replica to be counted down", async () =>
          (await readyz(gw)).models[models[0]!]?.healthy === 2 ? true : undefined,
        );

        // Past the cache of the services' lists: a replica that does not answer its list stays a deployment.
        clock.offsetMs += 31_000;
        for (let i = 0; i < 3; i++) {
          const ready = await readyz(gw);
          assert.equal(ready.status, 200, "one replica down leaves the models degraded, not unavailable");
          for (const model of models) assert.deepEqual(ready.models[model], { state: "degraded", healthy: 2, deployments: 3 });
          // Several rounds of cooldown → probe → failed check → cooldown, none of which is news.
          await cooldownRounds(gw, models[0]!, dead, 2);
        }
        for (const model of models) {
          const failing = lines.filter((l) => l.msg === "deployment failing" && l.model === model && l.deployment === dead);
          assert.equal(failing.length, 1, `${model}: one line while it stays down: ${JSON.stringify(failing)}`);
          const line = failing[0]!;
          assert.equal(line.level, 40, "warn");
          assert.equal(line.failure, "unavailable");
          // Refused once the server is gone; reset or closed when the server closed a connection a call was using.
          assert.match(
            String(line.reason),
            /connection refused|ECONNREFUSED|ECONNRESET|UND_ERR_SOCKET|other side closed/i,
            "the reason says what happened",
          );
        }
        assert.deepEqual(
          lines.filter((l) => l.msg === "deployment failing" && l.deployment !== dead),
          [],
          "the live replicas were never failing",
        );

        servers[1] = await startFakeModelServer({ port: servers[1]!.port });
        await eventually(
          "the replica to be counted healthy again",
          async () => {
            const ready = await readyz(gw);
            return models.every((m) => ready.models[m]?.state === "ok") ? ready : undefined;
          },
          60_000,
          50,
        );
        const ready = await readyz(gw);
        for (const model of models) {
          assert.deepEqual(ready.models[model], { state: "ok", healthy: 3, deployments: 3 });
          const back = lines.filter((l) => l.msg === "deployment healthy again" && l.model === model);
          assert.equal(back.length, 1, `${model}: ${JSON.stringify(back)}`);
          assert.equal(back[0]!.deployment, dead);
          assert.equal(back[0]!.level, 30, "info");
        }
        assert.equal(lines.filter((l) => l.msg === "deployment failing").length, models.length, "no other failing line since");
      } finally {
        await gw.close();
        await Promise.all(servers.map((s) => s.close()));
      }
    });
  });
}

describe("a model that is not ready", () => {
  test("no warning per request while nothing changes: each 503 at debug, 'deployment failing' once; recovery through a call is logged once", async () => {
    const service = createFakeModelService();
    service.setDefault({ fail: "not_ready", message: "the model is loading (42 %)" });
    const { logger, lines } = capturedLog();
    const gw = await startGateway({
      modelService: service,
      routerOptions: { ...FAST, healthCheckIntervalMs: null },
      loggerInstance: logger,
    });
    try {
      const ids: string[] = [];
      for (let i = 0; i < 12; i++) {
        const res = await gw.decide(sampleRequest());
        const body = (await res.json()) as { detail: string };
        assert.equal(res.status, 503, JSON.stringify(body));
        assert.match(body.detail, /^The model( \(deployment "[^"]+"\))? is not ready/);
        ids.push(res.headers.get("x-service-request-id")!);
      }
      const failed = lines.filter((l) => l.msg === "model call failed");
      assert.deepEqual(
        failed.map((l) => l.request_id),
        ids,
        "each request is still logged, with its id",
      );
      assert.ok(
        failed.every((l) => l.level === 20 && l.failure === "not_ready"),
        `at debug: ${JSON.stringify(failed.map((l) => l.level))}`,
      );
      assert.deepEqual(
        lines.filter((l) => l.level >= 40),
        [],
        "no warning: an engine logs what it is doing itself",
      );
      const failing = lines.filter((l) => l.msg === "deployment failing");
      assert.equal(failing.length, 1, "the deployment's state change, once");
      assert.equal(failing[0]!.failure, "not_ready");
      assert.equal(failing[0]!.level, 30, "info");

      service.setDefault(null);
      await eventually(
        "a probe to succeed",
        async () => {
          const res = await gw.decide(sampleRequest());
          await res.arrayBuffer();
          return res.status === 200 ? true : undefined;
        },
        60_000,
        50,
      );
      const back = lines.filter((l) => l.msg === "deployment healthy again");
      assert.equal(back.length, 1);
      assert.equal(lines.filter((l) => l.msg === "deployment failing").length, 1);
    } finally {
      await gw.close();
    }
  });
});

describe("a model service that fails before the request is admitted", () => {
  test("502 while the model is being found: the request id the client got leads to a record (nothing charged or reserved)", async () => {
    const gone = await startFakeModelServer();
    await gone.close(); // nothing listens on its port: the model's list cannot be had
    const { logger, lines } = capturedLog();
    const gw = await startGateway({
      fake: false,
      env: { TDS_MODEL_SERVICE_URL: gone.url, TDS_SERVICE_MODE: "paid" },
      loggerInstance: logger,
    });
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 5_000_000, nowMs: Date.now() });
      const res = await gw.decide(sampleRequest(), { "idempotency-key": "k-before-admission" });
      const body = (await res.json()) as { detail: string };
      assert.equal(res.status, 502, JSON.stringify(body));
      const requestId = res.headers.get("x-service-request-id")!;
      assert.equal(body.detail, `The model service is unavailable; no credits were charged (request ${requestId}).`);

      const found = await gw.get(`/v1/usage/${requestId}`);
      const record = (await found.json()) as Record<string, unknown>;
      assert.equal(found.status, 200, JSON.stringify(record));
      assert.equal(record.outcome, "model_error");
      assert.equal(record.http_status, 502);
      assert.equal(record.error, body.detail, "the record says what the client was told");
      assert.equal(record.cost_microusd, 0);
      assert.equal(record.attempts, 0);
      assert.equal(record.deployment, null);
      assert.equal(record.model, "(default)");
      assert.ok(record.completed_at !== null);

      const balance = await assertLedgerMatches(gw.store, gw.orgId);
      assert.equal(balance.reserved, 0);
      assert.equal(balance.spent, 0);
      assert.equal(balance.available, 5_000_000);
      assert.deepEqual(
        (await gw.store.listLedger(gw.orgId)).map((e) => e.kind),
        ["grant"],
        "nothing reserved, so nothing resolved",
      );

      const logged = lines.filter((l) => l.msg === "model call failed");
      assert.equal(logged.length, 1);
      assert.equal(logged[0]!.request_id, requestId);
      assert.equal(logged[0]!.failure, "unavailable");
      assert.equal(logged[0]!.level, 40);

      // The Idempotency-Key was not claimed: the same request runs again (and fails again, with a record of its own).
      const again = await gw.decide(sampleRequest(), { "idempotency-key": "k-before-admission" });
      await again.arrayBuffer();
      assert.equal(again.status, 502);
      const againId = again.headers.get("x-service-request-id")!;
      assert.notEqual(againId, requestId);
      assert.equal((await gw.get(`/v1/usage/${againId}`)).status, 200);
    } finally {
      await gw.close();
    }
  });

  test("preview: such a record uses up no preview quota; a refused request (unknown model, 422) has none", async () => {
    const gone = await startFakeModelServer();
    await gone.close();
    const gw = await startGateway({ fake: false, env: { TDS_MODEL_SERVICE_URL: gone.url } });
    try {
      const res = await gw.decide(sampleRequest({ model: "decider" }));
      await res.arrayBuffer();
      assert.equal(res.status, 502);
      const requestId = res.headers.get("x-service-request-id")!;
      const record = (await (await gw.get(`/v1/usage/${requestId}`)).json()) as { model: string; outcome: string };
      assert.equal(record.model, "decider", "the model requested");
      assert.equal(record.outcome, "model_error");
      const day = new Date().toISOString().slice(0, 10);
      assert.equal((await gw.store.previewUsage(gw.orgId, day)).org, 0);
    } finally {
      await gw.close();
    }

    const live = await startGateway();
    try {
      const res = await live.decide(sampleRequest({ model: "no-such-model" }));
      await res.arrayBuffer();
      assert.equal(res.status, 422);
      assert.equal((await live.get(`/v1/usage/${res.headers.get("x-service-request-id")}`)).status, 404, "refused: no record");
    } finally {
      await live.close();
    }
  });
});
