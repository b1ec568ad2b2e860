import assert from "node:assert/strict";
import { copyFileSync, writeFileSync } from "node:fs";
import { createServer, request } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { writeTestGguf } from "../../scripts/make-test-gguf.ts";
import { DEFAULT_RETRY_BACKOFF, retryDelayMs } from "../../src/models/llama/retry.ts";
import { type FakeHub, startFakeHub } from "../fixtures/gguf/fake-hub.ts";
import { expectKind, type ModelDir, makeModelDir, recordingLogger, tinyService } from "../fixtures/gguf/tiny-model.ts";
import { settlesBefore } from "../support/timer-race.ts";
import { type ReadyzBody, startEngineGateway, waitFor } from "./engine-gateway.ts";

const SHORT = { initialMs: 40, maxMs: 160 };
const ISO_TIME = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/;

let models: ModelDir;
before(() => {
  models = makeModelDir();
});
after(() => models?.cleanup());

/** N of the "model … ready after N attempts" line. */
function readyAfter(lines: ReadonlyArray<{ msg: string }>, model: string): number {
  const line = lines.map((l) => new RegExp(`^model "${model}" ready after (\\d+) attempts`).exec(l.msg)).find((m) => m !== null);
  assert.ok(line, `no "ready after" line for ${model}`);
  return Number(line[1]);
}

/** The engine entry of `model` in a /readyz body. */
function engineOf(body: ReadyzBody, model: string): Record<string, unknown> {
  const entry = body.models[model];
  assert.ok(entry?.engine, `no engine entry for ${model}: ${JSON.stringify(body)}`);
  return entry.engine;
}

describe("load retries: the backoff", () => {
  test("1 s, doubling, at most 60 s", () => {
    assert.deepEqual(
      [1, 2, 3, 4, 5, 6, 7, 8, 50].map((n) => retryDelayMs(n, DEFAULT_RETRY_BACKOFF)),
      [1000, 2000, 4000, 8000, 16_000, 32_000, 60_000, 60_000, 60_000],
    );
  });

  test("a file being replaced: the failure logged once, not per attempt; a line when it loads", async () => {
    const path = join(models.dir, "replaced.gguf");
    writeFileSync(path, "not a model yet");
    const logger = recordingLogger();
    const service = tinyService(path, { logger, retry: SHORT });
    await waitFor("four failed attempts", () => ((service.status().failedAttempts ?? 0) >= 4 ? true : undefined));
    copyFileSync(models.model("tiny"), path);
    await service.ready();
    const warnings = logger.lines.filter((l) => l.level === "warn").map((l) => l.msg);
    const failures = warnings.filter((m) => /failed to load/.test(m));
    assert.equal(failures.length, 1, `the same reason is not logged again: ${JSON.stringify(warnings)}`);
    assert.match(failures[0] ?? "", /^the model "tiny" failed to load \(attempt 1\): .*; retrying in 40 ms, at /);
    for (const m of warnings.filter((w) => !/failed to load/.test(w)))
      assert.match(m, /^the model "tiny" still cannot be loaded after (8|16|32|64) attempts/, "only reminders at growing intervals");
    assert.ok(
      logger.lines.some((l) => l.level === "info" && /^model "tiny" ready after \d+ attempts: /.test(l.msg)),
      JSON.stringify(logger.lines),
    );
    assert.equal(logger.lines.filter((l) => l.level === "error").length, 0);
    assert.deepEqual(service.status(), { state: "ready" });
    await service.close();
  });

  test("close() during the wait ends the retries", async () => {
    const logger = recordingLogger();
    const service = tinyService(join(models.dir, "never.gguf"), { logger, retry: { initialMs: 30_000, maxMs: 30_000 } });
    await waitFor("the first failure", () => (service.status().state === "retrying" ? true : undefined));
    // The next attempt is 30 s away: a close() that waited for it would lose the race against this timer.
    assert.ok(await settlesBefore(service.close(), 10_000), "close() does not wait for the next attempt");
    await expectKind(service.ready(), "not_ready", /closed while loading/);
    assert.equal(logger.lines.length, 1);
  });
});

describe("load retries behind the real gateway", () => {
  test("a local model file that appears later: 503 and /readyz 'retrying' first, then 200", async (t) => {
    const path = join(models.dir, "later.gguf");
    const gw = await startEngineGateway({ TDS_MODEL_PATH: path, TDS_MODEL_NAME: "local" }, { retry: SHORT });
    try {
      const retrying = await waitFor("the engine retrying", async () => {
        const r = await gw.readyz();
        return r.body.models.local?.engine?.state === "retrying" ? r : undefined;
      });
      assert.equal(retrying.status, 503);
      assert.deepEqual(Object.keys(retrying.body.models.local ?? {}), ["state", "healthy", "deployments", "engine"]);
      assert.equal(retrying.body.models.local?.state, "unavailable");
      const engine = engineOf(retrying.body, "local");
      assert.deepEqual(Object.keys(engine), ["state", "detail", "last_error", "failed_attempts", "next_attempt_at"]);
      assert.equal(engine.last_error, "no model file at the configured path");
      assert.ok(Number.isInteger(engine.failed_attempts) && (engine.failed_attempts as number) >= 1);
      assert.match(engine.next_attempt_at as string, ISO_TIME);
      assert.match(
        engine.detail as string,
        /^the model "local" is still loading: attempt \d+ failed \(no model file at the configured path\), the next starts at /,
      );
      assert.equal(retrying.body.models["fake-small"]?.state, "ok");

      const refused = await gw.decide("local");
      assert.equal(refused.status, 503);
      assert.match(
        refused.body.detail ?? "",
        /still loading.*no model file at the configured path.*set TDS_MODEL_PATH to a local GGUF file/,
      );
      assert.equal((await gw.decide("fake-small")).status, 200);

      const failedBefore = engineOf((await gw.readyz()).body, "local").failed_attempts as number;
      const written = performance.now();
      writeTestGguf(path);
      const answered = await waitFor("a 200 from the engine", async () => {
        const r = await gw.decide("local");
        return r.status === 200 ? r : undefined;
      });
      const loadedMs = performance.now() - written;
      assert.equal(answered.body.model, "local");
      t.diagnostic(`answered ${Math.round(loadedMs)} ms after the file appeared`);
      // Counted, not timed: one attempt may fail after the count was read and one may have been under way as the
      // file was written; the first to start after that loads it.
      assert.ok(
        readyAfter(gw.log.lines, "local") <= failedBefore + 3,
        `ready after ${readyAfter(gw.log.lines, "local")} attempts, ${failedBefore} failed before`,
      );
      const ready = await gw.readyz();
      assert.deepEqual(ready.body.models.local, { state: "ok", healthy: 1, deployments: 1 }, "no engine entry once it is ready");
      assert.equal(ready.status, 200);
      assert.ok(gw.log.lines.some((l) => /^model "local" ready after \d+ attempts/.test(l.msg)));
    } finally {
      await gw.close();
    }
  });

  describe("a model hub that is down, then answers 404, then serves the file", () => {
    let hub: FakeHub;
    let gate: HubGate;
    before(async () => {
      hub = await startFakeHub({ tiny: { repo: "acme/Tiny-GGUF", quant: "Q8_0", fileName: "Tiny.Q8_0.gguf", path: models.model("tiny") } });
      gate = await hubGate(hub.url);
      // node-llama-cpp's hub endpoint (this file runs in its own process).
      process.env.MODEL_ENDPOINT = gate.url;
    });
    after(async () => {
      delete process.env.MODEL_ENDPOINT;
      await gate?.close();
      await hub?.close();
    });

    test("each failure shows in /readyz as it happens; the download succeeds on a later attempt", async (t) => {
      const gw = await startEngineGateway({ TDS_MODEL_PATH: "hf:acme/Tiny-GGUF:Q8_0", TDS_MODEL_NAME: "hub-model" }, { retry: SHORT });
      try {
        const lastError = async (pattern: RegExp) =>
          waitFor(`a failure matching ${pattern}`, async () => {
            const r = await gw.readyz();
            const engine = r.body.models["hub-model"]?.engine;
            return engine?.state === "retrying" && pattern.test(String(engine.last_error)) ? { status: r.status, engine } : undefined;
          });

        const down = await lastError(/the model hub cannot be reached/);
        assert.equal(down.status, 503);
        assert.equal(down.engine.last_error, "cannot download hf:acme/Tiny-GGUF:Q8_0: the model hub cannot be reached");
        assert.match(String(down.engine.detail), /^the model "hub-model" cannot be downloaded \(offline\?\): attempt \d+ failed/);
        const refused = await gw.decide("hub-model");
        assert.equal(refused.status, 503);
        assert.match(refused.body.detail ?? "", /cannot be downloaded \(offline\?\).*the model hub cannot be reached/);

        await gate.set("404");
        const missing = await lastError(/no such model file/);
        assert.ok((missing.engine.failed_attempts as number) > (down.engine.failed_attempts as number));
        assert.match(String(missing.engine.detail), /^the model "hub-model" is still loading: attempt \d+ failed/, "answered: not offline");
        assert.equal((await gw.decide("fake-small")).status, 200);

        const failedBefore = engineOf((await gw.readyz()).body, "hub-model").failed_attempts as number;
        const served = performance.now();
        await gate.set("serve");
        const answered = await waitFor("a 200 from the engine", async () => {
          const r = await gw.decide("hub-model");
          return r.status === 200 ? r : undefined;
        });
        const loadedMs = performance.now() - served;
        assert.equal(answered.body.model, "hub-model");
        t.diagnostic(`answered ${Math.round(loadedMs)} ms after the hub came up`);
        assert.ok(
          readyAfter(gw.log.lines, "hub-model") <= failedBefore + 3,
          `ready after ${readyAfter(gw.log.lines, "hub-model")} attempts, ${failedBefore} failed before the hub served the file`,
        );
        assert.deepEqual((await gw.readyz()).body.models["hub-model"], { state: "ok", healthy: 1, deployments: 1 });
        assert.ok(
          hub.requests.some((r) => r.path.endsWith("/Tiny.Q8_0.gguf")),
          "the file came through the hub",
        );
        const warnings = gw.log.lines.filter((l) => l.level === "warn");
        assert.ok(
          warnings.some((l) => /cannot download .*fetch failed.*127\.0\.0\.1:\d+: the connection was refused/.test(l.msg)),
          JSON.stringify(warnings),
        );
        assert.equal(warnings.filter((l) => /npm run fake-model/.test(l.msg)).length, 1, "the offline advice once");
        assert.ok(
          warnings.some((l) => /cannot download .*does not exist/.test(l.msg)),
          JSON.stringify(warnings),
        );
      } finally {
        await gw.close();
      }
    });
  });
});

interface HubGate {
  url: string;
  /** "down" (nothing listens: connection refused), "404" (every request), "serve" (passed on to the hub). */
  set(mode: "down" | "404" | "serve"): Promise<void>;
  close(): Promise<void>;
}

/** A loopback port in front of `target` that starts "down". */
async function hubGate(target: string): Promise<HubGate> {
  let mode: "down" | "404" | "serve" = "down";
  const server = createServer((req, res) => {
    if (mode !== "serve") {
      res.writeHead(404, { "content-type": "application/json" }).end('{"error":"not found"}');
      return;
    }
    const upstream = request(
      new URL(req.url ?? "/", target),
      { method: req.method, headers: { ...req.headers, host: new URL(target).host } },
      (up) => {
        res.writeHead(up.statusCode ?? 502, up.headers);
        up.pipe(res);
      },
    );
    upstream.on("error", () => res.destroy());
    req.pipe(upstream);
  });
  // A free port, left closed until the gate is up.
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  const stop = () =>
    new Promise<void>((resolve) => {
      if (!server.listening) return resolve();
      server.closeAllConnections();
      server.close(() => resolve());
    });
  await stop();
  return {
    url: `http://127.0.0.1:${port}/`,
    async set(next) {
      mode = next;
      if (next === "down") return stop();
      if (!server.listening) await new Promise<void>((resolve) => server.listen(port, "127.0.0.1", resolve));
    },
    close: stop,
  };
}
