/**
 * A model that cannot be downloaded because its hub cannot be reached at all (the offline first start), told apart from
 * a hub that answers with an error; the advice logged once; the download's size announced before its bytes; the
 * progress lines' pacing.
 */
import assert from "node:assert/strict";
import { createServer, request } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { progressLogGate } from "../../src/models/llama/download-progress.ts";
import { type LlamaService, openLlamaService } from "../../src/models/llama/llama-service.ts";
import { downloadProblem } from "../../src/models/llama/model-source.ts";
import { networkCodeOf, probeReachability } from "../../src/models/llama/network-probe.ts";
import { type FakeHub, startFakeHub } from "../fixtures/gguf/fake-hub.ts";
import { expectKind, type ModelDir, makeModelDir, recordingLogger } from "../fixtures/gguf/tiny-model.ts";
import { freePort } from "../support/redis-server.ts";
import { waitFor } from "./engine-gateway.ts";

const SHORT = { initialMs: 20, maxMs: 40 };
const OPTS = { timeoutMs: 30_000 };
const call = { model: "tiny", state: "facts", questions: { n: { type: "noul" as const } } };

let models: ModelDir;
before(() => {
  models = makeModelDir();
});
after(() => models?.cleanup());

/** How often `needle` occurs in `text`. */
function count(text: string, needle: string): number {
  return text.split(needle).length - 1;
}

function systemError(code: string): Error {
  return new TypeError("fetch failed", { cause: Object.assign(new Error(`connect ${code}`), { code }) });
}

describe("a download server that cannot be reached, told apart from one that answers", () => {
  test("system errors: no DNS answer, refused, unreachable are network failures; a reset or an HTTP error is not", () => {
    for (const code of ["ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "EHOSTUNREACH", "ENETUNREACH", "ETIMEDOUT"])
      assert.equal(networkCodeOf(systemError(code)), code);
    assert.equal(networkCodeOf(systemError("ECONNRESET")), null);
    assert.equal(networkCodeOf(new Error('Failed to fetch manifest for "hf:a/b:Q8_0": 500 Internal Server Error')), null);
  });

  test("the public words: unreachable, a server error, a missing file, a connection that broke after it was accepted", () => {
    const offline = { address: "huggingface.co:443", code: "ENOTFOUND", words: "the name does not resolve" };
    assert.equal(downloadProblem("fetch failed", "the model hub", offline), "the model hub cannot be reached");
    assert.equal(
      downloadProblem('Failed to fetch manifest for "hf:a/b:Q8_0": 503 Service Unavailable', "the model hub", null),
      "the model hub answered with a server error (HTTP 503)",
    );
    assert.equal(downloadProblem("the file does not exist", "the model hub", null), "the model hub has no such model file");
    assert.equal(downloadProblem("TypeError: fetch failed", "the model hub", null, true), "the connection to the model hub failed");
  });

  test("one connection tells a closed port (refused) from a listening one", async () => {
    const closed = await freePort();
    assert.deepEqual(await probeReachability(`http://127.0.0.1:${closed}/`), {
      address: `127.0.0.1:${closed}`,
      code: "ECONNREFUSED",
      words: "the connection was refused (nothing listens there)",
    });
    const server = createServer((_req, res) => res.end());
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    try {
      assert.equal(await probeReachability(`http://127.0.0.1:${(server.address() as AddressInfo).port}/`), null);
    } finally {
      server.close();
    }
  });
});

describe("an offline hub: the advice once, not a warning per attempt", () => {
  test("a refusing hub: one message naming the reference and the three ways out; retries stay quiet; 503s say offline", async () => {
    const port = await freePort();
    const logger = recordingLogger();
    const service = openLlamaService({
      name: "tiny",
      source: "hf:acme/Tiny-GGUF:Q8_0",
      cacheDir: join(models.dir, "cache-refused"),
      hubEndpoint: `http://127.0.0.1:${port}/`,
      logger,
      retry: SHORT,
    });
    try {
      await waitFor("nine failed attempts", () => ((service.status().failedAttempts ?? 0) >= 9 ? true : undefined));
      const all = logger.lines.map((l) => l.msg).join("\n");
      for (const way of ["TDS_MODEL_SERVICE_URL", "TDS_MODEL_PATH", "npm run fake-model"])
        assert.equal(count(all, way), 1, `${way} named once: ${all}`);
      const warnings = logger.lines.filter((l) => l.level === "warn").map((l) => l.msg);
      const advice = warnings.filter((m) => m.includes("npm run fake-model"));
      assert.equal(advice.length, 1);
      const [first, ...rest] = (advice[0] ?? "").split("\n");
      assert.match(
        first ?? "",
        /^the model "tiny" failed to load \(attempt 1\): cannot download hf:acme\/Tiny-GGUF:Q8_0 into .*cache-refused/,
      );
      assert.match(first ?? "", /127\.0\.0\.1:\d+: the connection was refused \(nothing listens there\) \(ECONNREFUSED\)/);
      assert.match(
        rest[0] ?? "",
        /^ {2}The model hub at 127\.0\.0\.1:\d+ cannot be reached: the connection was refused \(nothing listens there\)\. The download of hf:acme\/Tiny-GGUF:Q8_0 cannot succeed while this machine is offline\./,
      );
      assert.match(rest.join("\n"), /^ {4}TDS_MODEL_SERVICE_URL=http:\/\/127\.0\.0\.1:9090 +a System One model server/m);
      assert.match(rest.join("\n"), /^ {4}TDS_MODEL_PATH=\/path\/to\/model\.gguf +the in-process engine/m);
      assert.match(rest.join("\n"), /^ {4}npm run fake-model -- --port 9090 +starts a fake model server there/m);
      // The later attempts failed for the same reason: only reminders at attempts 8, 16, … (more attempts may have run
      // by now), without the advice.
      const reminders = warnings.filter((m) => m !== advice[0]).map((m) => /still cannot be loaded after (\d+) attempts/.exec(m)?.[1]);
      assert.equal(reminders[0], "8", JSON.stringify(warnings));
      assert.deepEqual(
        reminders,
        reminders.map((_, i) => String(8 * 2 ** i)),
        JSON.stringify(warnings),
      );

      const status = service.status();
      assert.equal(status.state, "retrying");
      assert.equal(status.offline, true);
      assert.match(
        status.detail ?? "",
        /^the model "tiny" cannot be downloaded \(offline\?\): attempt \d+ failed \(cannot download hf:acme\/Tiny-GGUF:Q8_0: the model hub cannot be reached\)/,
      );
      assert.equal((await expectKind(service.decide(call, OPTS), "not_ready")).message, service.status().detail);
    } finally {
      await service.close();
    }
  });

  describe("a hub that comes back", () => {
    let hub: FakeHub;
    before(async () => {
      hub = await startFakeHub({ tiny: { repo: "acme/Tiny-GGUF", quant: "Q8_0", fileName: "Tiny.Q8_0.gguf", path: models.model("tiny") } });
    });
    after(async () => hub?.close());

    test("offline first, then the download: its size announced before its bytes, 'offline' gone, the model ready", async () => {
      const port = await freePort();
      const logger = recordingLogger();
      let service: LlamaService | undefined;
      const gate = createServer((req, res) => {
        const upstream = request(new URL(req.url ?? "/", hub.url), { method: req.method, headers: req.headers }, (up) => {
          res.writeHead(up.statusCode ?? 502, up.headers);
          up.pipe(res);
        });
        upstream.on("error", () => res.destroy());
        req.pipe(upstream);
      });
      try {
        service = openLlamaService({
          name: "tiny",
          source: "hf:acme/Tiny-GGUF:Q8_0",
          cacheDir: join(models.dir, "cache-later"),
          hubEndpoint: `http://127.0.0.1:${port}/`,
          logger,
          retry: SHORT,
          threads: 1,
        });
        const s = service;
        await waitFor("an offline failure", () => (s.status().offline ? true : undefined));
        await new Promise<void>((resolve) => gate.listen(port, "127.0.0.1", resolve));
        await service.ready();
        assert.deepEqual(service.status(), { state: "ready" });
        const infos = logger.lines.filter((l) => l.level === "info").map((l) => l.msg);
        const announced = infos.findIndex((m) =>
          /^downloading hf:acme\/Tiny-GGUF:Q8_0: \d+\.\d MB into .*cache-later \(once: later starts find the file there\)$/.test(m),
        );
        const progressed = infos.findIndex((m) => /^downloading hf:acme\/Tiny-GGUF:Q8_0: .* MB of .* MB \(100%\)$/.test(m));
        assert.ok(announced >= 0 && progressed > announced, JSON.stringify(infos));
        assert.equal(logger.lines.filter((l) => l.msg.includes("npm run fake-model")).length, 1);
      } finally {
        await service?.close();
        gate.close();
      }
    });
  });
});

describe("download progress lines", () => {
  test("a line per 10 % step at most every 3 s, one after 30 s of silence, always the last", () => {
    let now = 0;
    const gate = progressLogGate({ stepPercent: 10, minIntervalMs: 3000, maxSilenceMs: 30_000, now: () => now });
    const at = (ms: number, pct: number) => {
      now = ms;
      return gate(pct, 100);
    };
    assert.equal(at(100, 5), false, "no step yet");
    assert.equal(at(500, 15), false, "a step, but too soon after the start");
    assert.equal(at(3000, 16), true, "a step, 3 s on");
    assert.equal(at(4000, 45), false, "steps, too soon");
    assert.equal(at(6000, 46), true);
    assert.equal(at(35_000, 47), false, "no new step, 29 s of silence");
    assert.equal(at(36_001, 47), true, "30 s of silence");
    assert.equal(at(36_002, 100), true, "the last, however soon");
    assert.equal(at(40_000, 100), false, "once");
  });
});
