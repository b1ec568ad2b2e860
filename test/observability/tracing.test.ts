/**
 * OpenTelemetry tracing through a real gateway process: a request carrying the client's traceparent leaves spans at a
 * local OTLP/HTTP receiver (http/json and http/protobuf) in the client's trace — the server span a child of the
 * client's span, admission, the model call with its attempt as a CLIENT span whose id is the parent in the
 * traceparent the model service got, the completion — and its log lines carry the trace id. Without the OTEL_*
 * variables nothing is exported and nothing is sent on.
 */
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { after, before, describe, test } from "node:test";
import { SpanKind, trace } from "@opentelemetry/api";
import { InMemorySpanExporter } from "@opentelemetry/sdk-trace-base";
import { BatchRequestRun } from "../../src/batches/batch-request-run.ts";
import { ConfigError } from "../../src/config.ts";
import { generateApiKey, newOrganizationId } from "../../src/domain/api-keys.ts";
import { type ModelService, ModelServiceError } from "../../src/models/model-service.ts";
import { createModelRouter } from "../../src/models/routing/router.ts";
import { startTracing } from "../../src/observability/tracing.ts";
import { tracingSettings } from "../../src/observability/tracing-settings.ts";
import { openStore } from "../../src/store/open-store.ts";
import { type FakeModelServer, startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { startGatewayProcess } from "../support/gateway-process.ts";
import { moduleReferences } from "../support/import-graph.ts";
import { closedPortUrl, type OtlpReceiver, type ReceivedSpan, startOtlpReceiver, startSilentCollector } from "../support/otlp-receiver.ts";

const SERVER = 2;
const CLIENT = 3;
const ERROR = 2;

const BODY = JSON.stringify({ state: { order: 17 }, questions: { refund: { type: "noul", instructions: "Refund?" } } });

const ROOT = new URL("../../", import.meta.url).pathname;

const records = (lines: string[]) =>
  lines.flatMap((line) => {
    try {
      return [JSON.parse(line) as Record<string, unknown>];
    } catch {
      return [];
    }
  });

const randomHex = (bytes: number) => Buffer.from(crypto.getRandomValues(new Uint8Array(bytes))).toString("hex");

interface Setup {
  dir: string;
  databaseUrl: string;
  orgId: string;
  key: string;
}

async function database(): Promise<Setup> {
  const dir = mkdtempSync(join(tmpdir(), "tds-tracing-"));
  const databaseUrl = `sqlite:${join(dir, "tds.sqlite")}`;
  const store = await openStore(databaseUrl);
  const org = await store.createOrganization({ id: newOrganizationId(), name: "traced", nowMs: Date.now() });
  const key = generateApiKey();
  await store.createApiKey({ id: key.id, orgId: org.id, name: null, hash: key.hash, nowMs: Date.now() });
  await store.close();
  return { dir, databaseUrl, orgId: org.id, key: key.raw };
}

async function decide(url: string, key: string, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(`${url}/v1/systemone`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json", ...headers },
    body: BODY,
  });
}

const traceparentParts = (header: string | undefined) => {
  const match = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/.exec(header ?? "");
  assert.ok(match, `not a W3C traceparent: ${header}`);
  return { traceId: match[1]!, parentId: match[2]!, flags: match[3]! };
};

for (const protocol of ["http/json", "http/protobuf"] as const) {
  describe(`a traced request (OTLP ${protocol})`, () => {
    let setup: Setup;
    let receiver: OtlpReceiver;
    let fake: FakeModelServer;
    let lines: string[];
    const traceId = randomHex(16);
    const clientSpanId = randomHex(8);
    let requestId: string;
    let status: number;
    let inTrace: ReceivedSpan[];

    before(async () => {
      setup = await database();
      receiver = await startOtlpReceiver();
      fake = await startFakeModelServer();
      const gw = await startGatewayProcess({
        TDS_DATABASE_URL: setup.databaseUrl,
        TDS_MODEL_SERVICE_URL: fake.url,
        OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
        OTEL_EXPORTER_OTLP_PROTOCOL: protocol,
        OTEL_SERVICE_NAME: "tds-under-test",
        OTEL_RESOURCE_ATTRIBUTES: "deployment.environment.name=test",
        OTEL_BSP_SCHEDULE_DELAY: "100",
      });
      try {
        const res = await decide(gw.url, setup.key, { traceparent: `00-${traceId}-${clientSpanId}-01`, tracestate: "client=1" });
        status = res.status;
        requestId = res.headers.get("x-typesafe-request-id") ?? "";
        await res.arrayBuffer();
        await receiver.waitFor((s) => s.traceId === traceId && s.kind === SERVER);
        await receiver.waitFor((s) => s.traceId === traceId && s.name === "completion");
      } finally {
        await gw.stop();
        lines = gw.lines;
      }
      inTrace = receiver.spans.filter((s) => s.traceId === traceId);
    });
    after(async () => {
      await receiver?.close();
      await fake?.close();
      rmSync(setup.dir, { recursive: true, force: true });
    });

    test("the decision is answered as without tracing", () => {
      assert.equal(status, 200);
      assert.match(requestId, /\S/);
    });

    test(`the spans arrive over ${protocol} in the client's trace`, () => {
      assert.ok(receiver.contentTypes.includes(protocol === "http/json" ? "application/json" : "application/x-protobuf"));
      const server = inTrace.find((s) => s.kind === SERVER)!;
      assert.equal(server.parentSpanId, clientSpanId, "the server span continues the client's span");
      assert.equal(server.name, "POST /v1/systemone");
      assert.equal(server.attributes["http.route"], "/v1/systemone");
      assert.equal(server.attributes["http.request.method"], "POST");
      assert.equal(server.attributes["url.path"], "/v1/systemone");
      assert.equal(server.attributes["http.response.status_code"], 200);
      assert.equal(server.attributes["tds.request_id"], requestId);
      assert.equal(server.attributes["tds.organization_id"], setup.orgId);
      assert.equal(server.attributes["tds.model"], "fake-small");
      assert.equal(server.attributes["tds.outcome"], "succeeded");
      assert.notEqual(server.statusCode, ERROR);
      assert.equal(server.resource["service.name"], "tds-under-test");
      assert.equal(server.resource["deployment.environment.name"], "test");

      const byName = (name: string) => {
        const found = inTrace.filter((s) => s.name === name);
        assert.equal(found.length, 1, `one ${name} span; spans: ${inTrace.map((s) => s.name).join(", ")}`);
        return found[0]!;
      };
      assert.equal(byName("admission").parentSpanId, server.spanId);
      assert.equal(byName("completion").parentSpanId, server.spanId);
      const modelCall = byName("model call");
      assert.equal(modelCall.parentSpanId, server.spanId);
      assert.equal(modelCall.attributes["tds.attempts"], 1);
    });

    test("the model call's attempt is a CLIENT span whose id the model service got as the traceparent's parent", () => {
      const modelCall = inTrace.find((s) => s.name === "model call")!;
      const attempts = inTrace.filter((s) => s.kind === CLIENT);
      assert.equal(attempts.length, 1);
      const attempt = attempts[0]!;
      assert.equal(attempt.parentSpanId, modelCall.spanId);
      const deployment = attempt.attributes["tds.deployment"];
      assert.equal(attempt.name, deployment);
      assert.equal(modelCall.attributes["tds.deployment"], deployment);
      assert.equal(attempt.attributes["http.request.method"], "POST");
      assert.equal(attempt.attributes["server.address"], "127.0.0.1");
      assert.equal(attempt.attributes["server.port"], fake.port);
      assert.equal(attempt.attributes["http.response.status_code"], 200);
      assert.equal(attempt.attributes["tds.outcome"], "ok");

      assert.equal(fake.received.length, 1);
      const sent = traceparentParts(fake.received[0]!.traceparent);
      assert.equal(sent.traceId, traceId);
      assert.equal(sent.parentId, attempt.spanId);
      assert.equal(sent.flags, "01");
      assert.equal(fake.received[0]!.tracestate, "client=1");
    });

    test("the request's log lines carry its trace id", () => {
      const logged = records(lines);
      const ofRequest = logged.filter((r) => r.request_id === requestId);
      assert.ok(ofRequest.length > 0, "the request was logged");
      for (const record of ofRequest) assert.equal(record.trace_id, traceId, JSON.stringify(record));
      const started = logged.find((r) => r.component === "tracing");
      assert.match(String(started?.msg), /tracing on/);
    });
  });
}

describe("a traced gateway's edges", () => {
  let setup: Setup;
  let receiver: OtlpReceiver;
  let fake: FakeModelServer;
  let gw: Awaited<ReturnType<typeof startGatewayProcess>>;

  before(async () => {
    setup = await database();
    receiver = await startOtlpReceiver();
    fake = await startFakeModelServer();
    gw = await startGatewayProcess({
      TDS_DATABASE_URL: setup.databaseUrl,
      TDS_MODEL_SERVICE_URL: fake.url,
      OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
      OTEL_EXPORTER_OTLP_PROTOCOL: "http/json",
      OTEL_EXPORTER_OTLP_HEADERS: "x-collector-token=s3cret,tenant=tds",
      OTEL_BSP_SCHEDULE_DELAY: "100",
    });
  });
  after(async () => {
    await gw?.stop();
    await receiver?.close();
    await fake?.close();
    rmSync(setup.dir, { recursive: true, force: true });
  });

  test("OTEL_EXPORTER_OTLP_HEADERS are sent with each export", async () => {
    const res = await decide(gw.url, setup.key);
    assert.equal(res.status, 200);
    const requestId = res.headers.get("x-typesafe-request-id");
    await res.arrayBuffer();
    await receiver.waitFor((s) => s.attributes["tds.request_id"] === requestId);
    assert.ok(receiver.headers.length > 0);
    for (const headers of receiver.headers) {
      assert.equal(headers["x-collector-token"], "s3cret");
      assert.equal(headers.tenant, "tds");
    }
  });

  test("an invalid traceparent starts a new trace", async () => {
    const invalid = `00-${"0".repeat(32)}-${randomHex(8)}-01`;
    for (const traceparent of [invalid, "not a traceparent"]) {
      fake.received.length = 0;
      const res = await decide(gw.url, setup.key, { traceparent });
      assert.equal(res.status, 200);
      const requestId = res.headers.get("x-typesafe-request-id");
      await res.arrayBuffer();
      const server = await receiver.waitFor((s) => s.kind === SERVER && s.attributes["tds.request_id"] === requestId);
      assert.equal(server.parentSpanId, "", "a root span");
      assert.match(server.traceId, /^[0-9a-f]{32}$/);
      assert.notEqual(server.traceId, "0".repeat(32));
      assert.equal(traceparentParts(fake.received[0]?.traceparent).traceId, server.traceId);
    }
  });

  test("a long path and user agent are cut on the span", async () => {
    const marker = randomHex(8);
    const path = `/v1/${marker}${"a".repeat(3000)}`;
    const res = await fetch(`${gw.url}${path}?q=1`, { headers: { "user-agent": "u".repeat(5000) } });
    assert.equal(res.status, 404);
    await res.arrayBuffer();
    const server = await receiver.waitFor((s) => s.kind === SERVER && String(s.attributes["url.path"]).includes(marker));
    assert.equal(server.attributes["url.path"], path.slice(0, 1024));
    assert.equal(server.attributes["user_agent.original"], "u".repeat(256));
    assert.equal(server.attributes["http.response.status_code"], 404);
  });
});

describe("a client that goes away before the answer", () => {
  test("its server span ends without a status code, and nothing writes to it afterwards", async () => {
    const setup = await database();
    const receiver = await startOtlpReceiver();
    const fake = await startFakeModelServer();
    const traceId = randomHex(16);
    let lines: string[] = [];
    try {
      const gw = await startGatewayProcess({
        TDS_DATABASE_URL: setup.databaseUrl,
        TDS_MODEL_SERVICE_URL: fake.url,
        OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
        OTEL_EXPORTER_OTLP_PROTOCOL: "http/json",
        OTEL_BSP_SCHEDULE_DELAY: "100",
      });
      try {
        const aborter = new AbortController();
        const answered = fetch(`${gw.url}/v1/systemone`, {
          method: "POST",
          headers: {
            authorization: `Bearer ${setup.key}`,
            "content-type": "application/json",
            traceparent: `00-${traceId}-${randomHex(8)}-01`,
          },
          body: JSON.stringify({ state: { fake_behavior: "delay:1500" }, questions: { refund: { type: "noul", instructions: "?" } } }),
          signal: aborter.signal,
        });
        answered.catch(() => {});
        // Gone while the model is working on it.
        while (fake.received.length === 0) await new Promise((r) => setTimeout(r, 20));
        aborter.abort();
        await assert.rejects(answered);
        const server = await receiver.waitFor((s) => s.traceId === traceId && s.kind === SERVER);
        assert.equal(server.attributes["http.response.status_code"], undefined);
        assert.equal(server.attributes["error.type"], "client_closed");
        // The model answers after the span ended; the pipeline goes on (the shutdown waits for it).
        await receiver.waitFor((s) => s.traceId === traceId && s.name === "model call");
      } finally {
        await gw.stop();
        lines = gw.lines;
      }
      assert.deepEqual(
        lines.filter((line) => /ended Span/i.test(line)),
        [],
      );
      assert.equal(receiver.spans.filter((s) => s.traceId === traceId && s.name === "completion").length, 0);
    } finally {
      await receiver.close();
      await fake.close();
      rmSync(setup.dir, { recursive: true, force: true });
    }
  });
});

describe("a collector that is down or does not answer", () => {
  let setup: Setup;
  let fake: FakeModelServer;

  before(async () => {
    setup = await database();
    fake = await startFakeModelServer();
  });
  after(async () => {
    await fake.close();
    rmSync(setup.dir, { recursive: true, force: true });
  });

  test("down: requests are answered; the export failure is logged once, with no request's trace id", async () => {
    const gw = await startGatewayProcess({
      TDS_DATABASE_URL: setup.databaseUrl,
      TDS_MODEL_SERVICE_URL: fake.url,
      OTEL_EXPORTER_OTLP_ENDPOINT: await closedPortUrl(),
      OTEL_BSP_SCHEDULE_DELAY: "100",
    });
    try {
      for (let i = 0; i < 3; i++) {
        const res = await decide(gw.url, setup.key, { traceparent: `00-${randomHex(16)}-${randomHex(8)}-01` });
        assert.equal(res.status, 200);
        assert.deepEqual(Object.keys(((await res.json()) as { answers: object }).answers), ["refund"]);
      }
      const warned = () => records(gw.lines).filter((r) => r.component === "tracing" && r.level === 40);
      const until = Date.now() + 30_000;
      while (warned().length === 0 && Date.now() < until) await new Promise((r) => setTimeout(r, 100));
      const warnings = warned();
      assert.equal(warnings.length, 1, JSON.stringify(warnings));
      assert.match(String(warnings[0]!.msg), /OpenTelemetry/);
      assert.equal(warnings[0]!.trace_id, undefined, JSON.stringify(warnings[0]));
    } finally {
      await gw.stop();
    }
  });

  test("not answering: SIGTERM exits 0 without waiting out the exporter's 10 s timeout", async () => {
    const silent = await startSilentCollector();
    try {
      const gw = await startGatewayProcess({
        TDS_DATABASE_URL: setup.databaseUrl,
        TDS_MODEL_SERVICE_URL: fake.url,
        OTEL_EXPORTER_OTLP_ENDPOINT: silent.url,
        // Nothing is exported before the shutdown: it is the shutdown's export that meets the silent collector.
        OTEL_BSP_SCHEDULE_DELAY: "600000",
      });
      const res = await decide(gw.url, setup.key);
      assert.equal(res.status, 200);
      await res.arrayBuffer();
      const exited = new Promise<{ code: number | null; signal: string | null }>((resolve) =>
        gw.child.once("exit", (code, signal) => resolve({ code, signal })),
      );
      const killer = setTimeout(() => gw.child.kill("SIGKILL"), 30_000);
      const startedMs = Date.now();
      gw.child.kill("SIGTERM");
      const { code, signal } = await exited;
      const tookMs = Date.now() - startedMs;
      clearTimeout(killer);
      assert.deepEqual({ code, signal }, { code: 0, signal: null });
      assert.ok(silent.connections() > 0, "the last spans were sent to the collector");
      // Before: the exporter's 10 s timeout, then the exit. Now the export gets 2 s, alongside closing the store.
      assert.ok(tookMs < 8000, `the shutdown took ${tookMs} ms`);
      assert.ok(
        records(gw.lines).some((r) => r.component === "tracing" && /not exported/.test(String(r.msg))),
        "the lost spans are logged",
      );
    } finally {
      await silent.close();
    }
  });
});

describe("with tracing off", () => {
  test("the app and the logger do not load the OpenTelemetry SDK: server.ts imports it only when tracing is on", () => {
    const sdk = /^@opentelemetry\/(?!api$|semantic-conventions$)/;
    const seen = new Set<string>();
    const loaded: string[] = [];
    const visit = (file: string) => {
      if (seen.has(file)) return;
      seen.add(file);
      for (const { specifier, form } of moduleReferences(file, readFileSync(file, "utf8"))) {
        if (form !== "import" && form !== "side effect" && form !== "export from" && form !== "require") continue;
        if (specifier.startsWith(".")) visit(resolve(dirname(file), specifier));
        else if (sdk.test(specifier)) loaded.push(`${file.slice(ROOT.length)} → ${specifier}`);
      }
    };
    visit(join(ROOT, "src/server.ts"));
    assert.ok(seen.has(join(ROOT, "src/app.ts")) && seen.has(join(ROOT, "src/observability/logging.ts")));
    assert.deepEqual(loaded, []);
    const dynamic = moduleReferences("server.ts", readFileSync(join(ROOT, "src/server.ts"), "utf8")).filter(
      (r) => r.form === "dynamic import",
    );
    assert.deepEqual(
      dynamic.map((r) => r.specifier),
      ["./observability/tracing.ts"],
    );
  });
});

describe("without the OTEL_* variables", () => {
  let setup: Setup;
  let receiver: OtlpReceiver;
  let fake: FakeModelServer;

  before(async () => {
    setup = await database();
    receiver = await startOtlpReceiver();
    fake = await startFakeModelServer();
  });
  after(async () => {
    await receiver.close();
    await fake.close();
    rmSync(setup.dir, { recursive: true, force: true });
  });

  test("nothing is exported, nothing is sent on, the answer is the same", async () => {
    const gw = await startGatewayProcess({
      TDS_DATABASE_URL: setup.databaseUrl,
      TDS_MODEL_SERVICE_URL: fake.url,
      // Named but switched off: the exporter must stay off all the same.
      OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
      OTEL_TRACES_EXPORTER: "none",
    });
    let lines: string[];
    try {
      const res = await decide(gw.url, setup.key, { traceparent: `00-${randomHex(16)}-${randomHex(8)}-01` });
      assert.equal(res.status, 200);
      const body = (await res.json()) as { answers: object };
      assert.deepEqual(Object.keys(body.answers), ["refund"]);
      assert.equal(res.headers.get("traceparent"), null);
    } finally {
      // The shutdown is when a running exporter sends what it holds.
      await gw.stop();
      lines = gw.lines;
    }
    assert.equal(receiver.contentTypes.length, 0, "nothing reached the receiver");
    assert.equal(fake.received.length, 1);
    assert.equal(fake.received[0]!.traceparent, undefined);
    assert.ok(lines.every((line) => !line.includes('"trace_id"')));
  });
});

describe("the OTEL_* variables", () => {
  const version = "9.9.9";

  test("tracing is off without an endpoint, with OTEL_TRACES_EXPORTER=none or OTEL_SDK_DISABLED=true", () => {
    assert.equal(tracingSettings({}, version), null);
    assert.equal(tracingSettings({ OTEL_EXPORTER_OTLP_ENDPOINT: " " }, version), null);
    assert.equal(tracingSettings({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318", OTEL_TRACES_EXPORTER: "none" }, version), null);
    assert.equal(tracingSettings({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318", OTEL_SDK_DISABLED: "true" }, version), null);
  });

  test("the endpoint, protocol, resource and sampler as the specification reads them", () => {
    assert.deepEqual(tracingSettings({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://collector:4318/" }, version), {
      url: "http://collector:4318/v1/traces",
      protocol: "http/protobuf",
      resource: { "service.version": version, "service.name": "typed-decision-service" },
      sampler: { name: "parentbased_always_on", ratio: 1 },
    });
    const settings = tracingSettings(
      {
        OTEL_EXPORTER_OTLP_ENDPOINT: "http://ignored:4318",
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "https://collector/custom/traces",
        OTEL_EXPORTER_OTLP_PROTOCOL: "http/json",
        OTEL_RESOURCE_ATTRIBUTES: "service.name=from-attributes,team=a%2Cb",
        OTEL_TRACES_SAMPLER: "parentbased_traceidratio",
        OTEL_TRACES_SAMPLER_ARG: "0.25",
      },
      version,
    );
    assert.equal(settings?.url, "https://collector/custom/traces");
    assert.equal(settings?.protocol, "http/json");
    assert.deepEqual(settings?.resource, { "service.version": version, "service.name": "from-attributes", team: "a,b" });
    assert.deepEqual(settings?.sampler, { name: "parentbased_traceidratio", ratio: 0.25 });
    assert.equal(
      tracingSettings(
        { OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318", OTEL_SERVICE_NAME: "mine", OTEL_RESOURCE_ATTRIBUTES: "service.name=x" },
        version,
      )?.resource["service.name"],
      "mine",
    );
  });

  test("what cannot be honoured stops the start with a message naming the variable", () => {
    const problems = (env: Record<string, string>) => {
      try {
        tracingSettings({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318", ...env }, version);
      } catch (err) {
        assert.ok(err instanceof ConfigError);
        return err.problems.join("\n");
      }
      assert.fail("accepted");
    };
    assert.match(problems({ OTEL_EXPORTER_OTLP_PROTOCOL: "grpc" }), /OTEL_EXPORTER_OTLP_PROTOCOL: grpc is not supported/);
    assert.match(problems({ OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: "thrift" }), /OTEL_EXPORTER_OTLP_TRACES_PROTOCOL/);
    assert.match(problems({ OTEL_TRACES_SAMPLER: "jaeger_remote" }), /OTEL_TRACES_SAMPLER: must be one of/);
    assert.match(problems({ OTEL_TRACES_SAMPLER: "traceidratio", OTEL_TRACES_SAMPLER_ARG: "2" }), /OTEL_TRACES_SAMPLER_ARG/);
    assert.match(problems({ OTEL_TRACES_EXPORTER: "zipkin" }), /OTEL_TRACES_EXPORTER/);
    assert.match(problems({ OTEL_EXPORTER_OTLP_ENDPOINT: "collector:4318" }), /OTEL_EXPORTER_OTLP_ENDPOINT: must be an http\(s\) URL/);
  });

  test("a gateway asked for grpc refuses to start, saying so", async () => {
    const setup = await database();
    try {
      await assert.rejects(
        startGatewayProcess({
          TDS_DATABASE_URL: setup.databaseUrl,
          OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:4317",
          OTEL_EXPORTER_OTLP_PROTOCOL: "grpc",
        }),
        /exited with 2[\s\S]*grpc is not supported/,
      );
    } finally {
      rmSync(setup.dir, { recursive: true, force: true });
    }
  });
});

describe("a model call that fails over", () => {
  test("has one CLIENT span per attempt, each with its deployment, number and outcome", async () => {
    const exporter = new InMemorySpanExporter();
    const settings = tracingSettings({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:9" }, "0.0.0")!;
    const tracing = startTracing(settings, { exporter });
    const service = (fails: boolean): ModelService => ({
      listModels: async () => [],
      decide: async () => {
        if (fails) throw new ModelServiceError("unavailable", "connection refused");
        return { answers: {}, usage: { input_tokens: 1, output_tokens: 1 }, latencyMs: 1 };
      },
      close: async () => {},
    });
    const router = createModelRouter(
      "m",
      [
        { name: "down", service: service(true), upstreamName: "m", weight: 1e9 },
        { name: "up", service: service(false), upstreamName: "m", weight: 1e-9 },
      ],
      { tracer: tracing.attempts, healthCheckIntervalMs: null, random: () => 0 },
    );
    await tracing.decisions.root("decision", {}, async () => {
      const step = tracing.decisions.step("model call")!;
      await step.within(() => router.decide({ model: "m", state: null, questions: {} }, { timeoutMs: 5000 }));
      step.end();
    });
    await tracing.forceFlush();
    await router.close();
    const spans = exporter.getFinishedSpans();
    await tracing.shutdown(5000);
    const modelCall = spans.find((s) => s.name === "model call")!;
    const attempts = spans
      .filter((s) => s.kind === SpanKind.CLIENT)
      .sort((a, b) => Number(a.attributes["tds.attempt"]) - Number(b.attributes["tds.attempt"]));
    assert.deepEqual(
      attempts.map((s) => [s.name, s.attributes["tds.attempt"], s.attributes["tds.outcome"], s.attributes["error.type"], s.status.code]),
      [
        ["down", 1, "unavailable", "unavailable", ERROR],
        ["up", 2, "ok", undefined, 0],
      ],
    );
    for (const a of attempts) assert.equal(a.parentSpanContext?.spanId, modelCall.spanContext().spanId);
  });
});

describe("batch requests", () => {
  test("each is a trace of its own: a root span with the batch id and position, the pipeline's spans under it", async () => {
    const exporter = new InMemorySpanExporter();
    const tracing = startTracing(tracingSettings({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:9" }, "0.0.0")!, { exporter });
    const seen: Array<string | undefined> = [];
    const key = { revokedAtMs: null, expiresAtMs: null, retiresAtMs: null, replacedBy: null };
    const run = new BatchRequestRun({
      store: {} as never,
      clock: { nowMs: () => Date.now() } as never,
      keyOf: async () => ({ org: { id: "org_1", paused: false }, key }) as never,
      pipeline: {
        decide: async (ctx) => {
          seen.push(trace.getActiveSpan()?.spanContext().traceId);
          tracing.decisions.step("admission")?.end();
          return { status: 200, body: '{"usage":{"cost_microusd":0}}', requestId: ctx.requestId, replayed: false };
        },
      },
      finish: async () => true,
      tracer: tracing.decisions,
    });
    const claim = (position: number) => ({
      batchId: "batch_1",
      position,
      orgId: "org_1",
      keyId: "k",
      model: null,
      customId: `c${position}`,
      body: BODY,
      requestId: `req_${position}`,
      leaseUntilMs: Date.now() + 60_000,
      takenOver: false,
    });
    for (const position of [0, 1]) assert.equal((await run.run(claim(position))).kind, "finished");
    await tracing.forceFlush();
    const spans = exporter.getFinishedSpans();
    await tracing.shutdown(5000);
    const roots = spans.filter((s) => s.name === "batch request");
    assert.deepEqual(
      roots.map((s) => [
        s.parentSpanContext,
        s.attributes["tds.batch_id"],
        s.attributes["tds.batch_position"],
        s.attributes["tds.request_id"],
      ]),
      [
        [undefined, "batch_1", 0, "req_0"],
        [undefined, "batch_1", 1, "req_1"],
      ],
    );
    assert.deepEqual(
      seen,
      roots.map((s) => s.spanContext().traceId),
    );
    assert.notEqual(seen[0], seen[1]);
    for (const root of roots) {
      const admission = spans.find((s) => s.name === "admission" && s.spanContext().traceId === root.spanContext().traceId);
      assert.equal(admission?.parentSpanContext?.spanId, root.spanContext().spanId);
    }
  });
});
