import assert from "node:assert/strict";
import { copyFileSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import type { AddressInfo } from "node:net";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { loadConfig } from "../../src/config.ts";
import { engineKey } from "../../src/config-models.ts";
import type { Question } from "../../src/contract/decision.ts";
import { checkAnswers } from "../../src/gateway/answer-check.ts";
import { type LlamaService, openLlamaService, SEE_THE_LOG, sourceHint } from "../../src/models/llama/llama-service.ts";
import { DEFAULT_MODEL_SOURCE, modelSourceKind, resolveModelSource } from "../../src/models/llama/model-source.ts";
import { openEngines } from "../../src/models/open-model-service.ts";
import { type FakeHub, startFakeHub } from "../fixtures/gguf/fake-hub.ts";
import { expectKind, type ModelDir, makeModelDir, recordingLogger, tinyService } from "../fixtures/gguf/tiny-model.ts";
import { settlesBefore } from "../support/timer-race.ts";

const questions: Record<string, Question> = {
  c: { type: "choice", criteria: { x: null, y: null } },
  s: { type: "score", criteria: ["low", "high"] },
  n: { type: "noul" },
};
const call = { model: "tiny", state: "facts", questions };
const OPTS = { timeoutMs: 30_000 };

let models: ModelDir;

before(() => {
  models = makeModelDir();
});
after(() => models?.cleanup());

/** No file-system path in a text shown to API clients: not the test's folders, not the working directory, no absolute path. */
function assertNoPath(text: string): void {
  for (const dir of [models.dir, tmpdir(), process.cwd()]) assert.ok(!text.includes(dir), `${JSON.stringify(text)} shows ${dir}`);
  assert.doesNotMatch(text, /(^|[\s(:'"])\.{0,2}\/[\w.-]/, "no absolute or relative path");
  assert.doesNotMatch(text, /\.gguf\b/, "no file name");
}

/** One attempt per test: the next would start after the test is over (close() ends the wait). */
const ONE_ATTEMPT = { retry: { initialMs: 60_000, maxMs: 60_000 } };

async function statusOnce(service: LlamaService, state: string): Promise<void> {
  while (service.status().state !== state) await new Promise((r) => setTimeout(r, 5));
}

/**
 * Asserts a service whose model cannot be had yet: state "retrying" after the first attempt, one warning logged (with
 * the path, the underlying error and the next attempt), not_ready everywhere with a detail that names the problem and
 * the setting but no path; close() ends the wait for the next attempt.
 */
async function expectRetrying(
  service: LlamaService,
  logger: ReturnType<typeof recordingLogger>,
  shown: RegExp,
  logged: RegExp,
  hint = sourceHint("TDS_MODEL_PATH"),
  state = "is still loading",
): Promise<void> {
  const started = Date.now();
  await statusOnce(service, "retrying");
  const status = service.status();
  assert.match(status.lastError ?? "", shown);
  assert.equal(status.failedAttempts, 1);
  // The attempt failed between `started` and now, and the next is 60 s after it.
  const next = status.nextAttemptAtMs ?? 0;
  assert.ok(next >= started + 60_000 && next <= Date.now() + 60_000, `next attempt 60 s after the failure: ${next}`);
  assert.ok(status.detail?.startsWith(`the model "tiny" ${state}: attempt 1 failed (`), status.detail);
  assert.ok(
    status.detail?.includes(
      `(${status.lastError}), the next starts at ${new Date(status.nextAttemptAtMs ?? 0).toISOString()}; ${hint} ${SEE_THE_LOG}`,
    ),
    status.detail,
  );
  assertNoPath(status.detail ?? "");
  assert.deepEqual(
    logger.lines.map((l) => l.level),
    ["warn"],
    JSON.stringify(logger.lines),
  );
  assert.match(logger.lines[0]?.msg ?? "", logged);
  assert.match(logger.lines[0]?.msg ?? "", /^the model "tiny" failed to load \(attempt 1\): .*; retrying in 60 s, at \d{4}-/);
  const e1 = await expectKind(service.decide(call, OPTS), "not_ready");
  assert.equal(e1.message, status.detail);
  const e2 = await expectKind(service.listModels(OPTS), "not_ready");
  assert.equal(e2.message, status.detail);
  assert.equal(logger.lines.length, 1, "failures are logged once, not per call");
  // The next attempt is 60 s away: a close() that waited for it would lose the race against this timer.
  assert.ok(await settlesBefore(service.close(), 30_000), "close() does not wait for the next attempt");
  await expectKind(service.ready(), "not_ready", /closed while loading/);
}

/**
 * Asserts a service that cannot load and is not retried: state "failed", one clear error logged (with the path and the underlying
 * error), not_ready everywhere with a detail that names the problem and the setting but no path, no crash.
 */
async function expectFailed(
  service: LlamaService,
  logger: ReturnType<typeof recordingLogger>,
  shown: RegExp,
  logged: RegExp,
  hint = sourceHint("TDS_MODEL_PATH"),
): Promise<void> {
  await expectKind(service.ready(), "not_ready");
  const status = service.status();
  assert.equal(status.state, "failed");
  assert.match(status.detail ?? "", shown);
  assert.ok(status.detail?.endsWith(`; ${hint} ${SEE_THE_LOG}`), status.detail);
  assertNoPath(status.detail ?? "");
  const errors = logger.lines.filter((l) => l.level === "error");
  assert.equal(errors.length, 1, `one error line, got ${JSON.stringify(logger.lines)}`);
  assert.match(errors[0]?.msg ?? "", logged);
  assert.ok(errors[0]?.msg.endsWith(hint), errors[0]?.msg);
  const e1 = await expectKind(service.decide(call, OPTS), "not_ready");
  assert.equal(e1.message, status.detail);
  const e2 = await expectKind(service.listModels(OPTS), "not_ready");
  assert.equal(e2.message, status.detail);
  // Still one line: failures are logged once, not per call.
  assert.equal(logger.lines.filter((l) => l.level === "error").length, 1);
  await service.close();
}

describe("embedded engine: loading and failures", () => {
  test("reports 'loading' with its progress until the model is ready", async () => {
    const logger = recordingLogger();
    const service = tinyService(models.model("tiny"), { logger });
    assert.equal(service.status().state, "loading");
    assertNoPath((await expectKind(service.listModels(OPTS), "not_ready", /^the model is still loading \(\d+%\)/)).message);
    await expectKind(service.decide(call, OPTS), "not_ready", /^the model is still loading \(\d+%\)/);
    // Every detail on the way (shown by /readyz and in 503s) names what happens, never the file.
    const details = new Set<string>();
    while (service.status().state === "loading") {
      details.add(service.status().detail ?? "");
      await new Promise((r) => setImmediate(r));
    }
    assert.ok(details.has("loading the model file"), JSON.stringify([...details]));
    for (const d of details) assertNoPath(d);
    await service.ready();
    assert.equal(service.status().state, "ready");
    const result = await service.decide(call, OPTS);
    assert.ok(checkAnswers(questions, result.answers).ok);
    assert.ok(logger.lines.some((l) => l.level === "info" && /ready/.test(l.msg)));
    assert.equal(logger.lines.filter((l) => l.level === "error").length, 0);
    await service.close();
  });

  test("a path with no file: retried, with one clear message per attempt", async () => {
    const logger = recordingLogger();
    const service = tinyService(join(models.dir, "missing.gguf"), { logger, ...ONE_ATTEMPT });
    await expectRetrying(
      service,
      logger,
      /^no model file at the configured path$/,
      /failed to load \(attempt 1\): no model file at .*missing\.gguf/,
    );
  });

  test("a file that is not GGUF: retried (it may be being replaced)", async () => {
    const path = join(models.dir, "garbage.gguf");
    writeFileSync(path, Buffer.from("this is not a model at all, just some text that goes on for a while".repeat(50)));
    const logger = recordingLogger();
    await expectRetrying(
      tinyService(path, { logger, ...ONE_ATTEMPT }),
      logger,
      /^the model file is not a usable GGUF model$/,
      /garbage\.gguf is not a usable GGUF model/,
    );
  });

  test("a truncated GGUF file: retried (it may be being written)", async () => {
    const whole = readFileSync(models.model("tiny"));
    const path = join(models.dir, "truncated.gguf");
    writeFileSync(path, whole.subarray(0, Math.floor(whole.length * 0.6)));
    const logger = recordingLogger();
    await expectRetrying(
      tinyService(path, { logger, ...ONE_ATTEMPT }),
      logger,
      /^the model file is not a usable GGUF model$/,
      /truncated\.gguf is not a usable GGUF model/,
    );
  });

  test("limits that leave no room for a state fail with one clear message, and are not retried", async () => {
    const logger = recordingLogger();
    const reason = /leave no room for a state: max_branch is 60 tokens/;
    const service = tinyService(models.model("tiny"), { logger, maxBranch: 60, retry: { initialMs: 1, maxMs: 1 } });
    await expectKind(service.ready(), "not_ready");
    await new Promise((r) => setTimeout(r, 50)); // time for a few retries, were there any
    assert.equal(service.status().state, "failed");
    assert.equal(service.status().failedAttempts, undefined);
    assert.deepEqual(
      logger.lines.map((l) => l.level),
      ["error"],
    );
    await expectFailed(
      service,
      logger,
      reason,
      reason,
      "raise the model's context.max_branch or context_size in the config file (TDS_CONFIG)",
    );
  });

  test("an unreachable model hub: retried, with one clear message per attempt", async () => {
    const port = await new Promise<number>((resolve) => {
      const s = createServer();
      s.listen(0, "127.0.0.1", () => {
        const p = (s.address() as AddressInfo).port;
        s.close(() => resolve(p));
      });
    });
    const logger = recordingLogger();
    const service = openLlamaService({
      name: "tiny",
      source: "hf:acme/Tiny-GGUF:Q8_0",
      cacheDir: join(models.dir, "cache-offline"),
      hubEndpoint: `http://127.0.0.1:${port}/`,
      logger,
      ...ONE_ATTEMPT,
    });
    await expectRetrying(
      service,
      logger,
      /^cannot download hf:acme\/Tiny-GGUF:Q8_0: the model hub cannot be reached$/,
      /cannot download hf:acme\/Tiny-GGUF:Q8_0 into .*cache-offline/,
      sourceHint("TDS_MODEL_PATH"),
      "cannot be downloaded (offline?)",
    );
  });

  test("a model listed in the config file: the detail names its source setting there", async () => {
    const file = join(models.dir, "engine-config.json");
    writeFileSync(
      file,
      JSON.stringify({ models: [{ name: "tiny", engine: "llama", source: join(models.dir, "absent.gguf"), threads: 1 }] }),
    );
    const logger = recordingLogger();
    const engines = await openEngines(loadConfig({ TDS_CONFIG: file }), logger, ONE_ATTEMPT);
    const service = engines.get(engineKey("tiny", 0)) as LlamaService;
    await expectRetrying(
      service,
      logger,
      /^no model file at the configured path$/,
      /absent\.gguf/,
      sourceHint('models[].source of "tiny" in the config file (TDS_CONFIG)'),
    );
  });
});

describe("embedded engine: model sources", () => {
  let hub: FakeHub;
  let big: string;

  before(async () => {
    big = models.model("big", { width: 512, layers: 6, weightType: "F16" });
    hub = await startFakeHub({
      tiny: { repo: "acme/Tiny-GGUF", quant: "Q8_0", fileName: "Tiny.Q8_0.gguf", path: models.model("tiny") },
      big: { repo: "acme/Big-GGUF", quant: "F16", fileName: "Big.F16.gguf", path: big },
    });
  });
  after(async () => hub?.close());

  test("source kinds", () => {
    assert.equal(modelSourceKind("/models/x.gguf"), "file");
    assert.equal(modelSourceKind("./x.gguf"), "file");
    assert.equal(modelSourceKind("hf:owner/repo:Q8_0"), "hub");
    assert.equal(modelSourceKind("hf:owner/repo/file.gguf"), "hub");
    assert.equal(modelSourceKind("https://example.com/x.gguf"), "url");
    assert.equal(DEFAULT_MODEL_SOURCE, "hf:bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q8_0");
  });

  test("a hub reference is downloaded once with progress, then found in the cache without the hub", async () => {
    const cacheDir = join(models.dir, "cache");
    const logger = recordingLogger();
    const service = openLlamaService({
      name: "tiny",
      source: "hf:acme/Tiny-GGUF:Q8_0",
      cacheDir,
      hubEndpoint: hub.url,
      logger,
      threads: 1,
    });
    await service.ready();
    const files = readdirSync(cacheDir);
    assert.equal(files.length, 1);
    assert.deepEqual(readFileSync(join(cacheDir, files[0] as string)), readFileSync(models.model("tiny")));
    assert.ok(
      logger.lines.some((l) => /^downloading hf:acme\/Tiny-GGUF:Q8_0: .* MB of .* MB \(\d+%\)$/.test(l.msg)),
      JSON.stringify(logger.lines),
    );
    assert.ok(checkAnswers(questions, (await service.decide(call, OPTS)).answers).ok);
    await service.close();

    // Second start: the hub is not asked again (a hub that is gone would fail the load).
    const before = hub.requests.length;
    const again = openLlamaService({
      name: "tiny",
      source: "hf:acme/Tiny-GGUF:Q8_0",
      cacheDir,
      hubEndpoint: "http://127.0.0.1:9/",
      logger: recordingLogger(),
      threads: 1,
    });
    await again.ready();
    assert.equal(hub.requests.length, before);
    await again.close();
  });

  test("an interrupted download resumes: only the missing parts are fetched again", async () => {
    const cacheDir = join(models.dir, "cache-resume");
    const size = statSync(big).size;
    hub.throttle = 400_000; // bytes per 10 ms and connection
    const cancel = new AbortController();
    await assert.rejects(
      resolveModelSource("hf:acme/Big-GGUF:F16", {
        cacheDir,
        hubEndpoint: hub.url,
        signal: cancel.signal,
        onProgress: ({ downloadedBytes }) => {
          if (downloadedBytes > size * 0.6) cancel.abort();
        },
      }),
      /cancelled/,
    );
    const partial = readdirSync(cacheDir);
    assert.ok(
      partial.some((f) => f.endsWith(".ipull")),
      `a partial download is kept: ${partial.join(", ")}`,
    );

    hub.throttle = 0;
    const mark = hub.requests.length;
    const path = await resolveModelSource("hf:acme/Big-GGUF:F16", { cacheDir, hubEndpoint: hub.url });
    assert.deepEqual(readFileSync(path), readFileSync(big));
    // The ranges asked for, an open one to the end of the file. (The downloader first sends one GET without a range,
    // before it asks for the missing parts; that one is not counted.)
    const ranges = hub.requests
      .slice(mark)
      .map((r) => /^bytes=(\d+)-(\d*)$/.exec(r.range ?? ""))
      .filter((m): m is RegExpExecArray => m !== null)
      .map((m) => [Number(m[1]), m[2] === "" ? size - 1 : Math.min(Number(m[2]), size - 1)] as const);
    // The bytes covered, each counted once: on a busy machine the downloader may ask for a part again (a retried
    // connection), which is not a restart; a restart from the beginning covers the whole file.
    const fetched = coveredBytes(ranges);
    assert.ok(fetched > 0 && fetched < size, `resumed by fetching ${fetched} of ${size} bytes (ranges ${JSON.stringify(ranges)})`);
    assert.ok(!readdirSync(cacheDir).some((f) => f.endsWith(".ipull")));
  });

  test("a cache folder that cannot be written: the detail names TDS_MODEL_CACHE_DIR, the log names the folder", async () => {
    const blocker = join(models.dir, "not-a-folder");
    writeFileSync(blocker, "a file where the cache folder should be");
    const logger = recordingLogger();
    const service = openLlamaService({
      name: "tiny",
      source: "hf:acme/Tiny-GGUF:Q8_0",
      cacheDir: join(blocker, "cache"),
      hubEndpoint: hub.url,
      logger,
      threads: 1,
      ...ONE_ATTEMPT,
    });
    await expectRetrying(
      service,
      logger,
      /^cannot download hf:acme\/Tiny-GGUF:Q8_0: the model cache folder cannot be written$/,
      /not-a-folder/,
      `set TDS_MODEL_CACHE_DIR to a writable folder with room for the model, or ${sourceHint()}`,
    );
  });

  test("a download's details name the hub reference, never the cache folder", async () => {
    hub.throttle = 100_000;
    const service = openLlamaService({
      name: "tiny",
      source: "hf:acme/Tiny-GGUF:Q8_0",
      cacheDir: join(models.dir, "cache-shown"),
      hubEndpoint: hub.url,
      logger: recordingLogger(),
      threads: 1,
    });
    const details = new Set<string>();
    try {
      while (service.status().state === "loading") {
        details.add(service.status().detail ?? "");
        await new Promise((r) => setImmediate(r));
      }
    } finally {
      hub.throttle = 0;
    }
    await service.ready();
    assert.ok(details.has("downloading hf:acme/Tiny-GGUF:Q8_0"), JSON.stringify([...details]));
    for (const d of details) assertNoPath(d);
    await service.close();
  });

  test("a local path relative to the working directory is used as it is", async () => {
    const path = join(models.dir, "copy.gguf");
    copyFileSync(models.model("tiny"), path);
    assert.equal(await resolveModelSource(path), path);
    await assert.rejects(resolveModelSource(models.dir), /is not a file/);
  });
});

/** The number of bytes that inclusive [start, end] ranges cover together. */
function coveredBytes(ranges: ReadonlyArray<readonly [number, number]>): number {
  let covered = 0;
  let reach = -1;
  for (const [start, end] of [...ranges].sort((a, b) => a[0] - b[0])) {
    if (end <= reach) continue;
    covered += end - Math.max(start, reach + 1) + 1;
    reach = end;
  }
  return covered;
}
