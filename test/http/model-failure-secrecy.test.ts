/**
 * A hostile model service whose error texts carry secrets (a database URL with its password, an API key, internal
 * host names, file paths, markup, terminal escapes): none of it reaches the client's answer, the usage records
 * (GET /v1/usage, GET /v1/usage/{request_id}, the admin API), while the server log gets one warn line per failure with
 * the request id, the deployment, the kind and the upstream's words — bounded, control characters escaped.
 */
import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { Writable } from "node:stream";
import { after, before, describe, test } from "node:test";
import pino from "pino";
import { type Gateway, sampleRequest, startGateway } from "../support/gateway-harness.ts";

const ADMIN_TOKEN = "adm-3Kq8pVx2Lr7Tz4Kw9Nc1Hs6Bd0Fg5Jm";
const UPSTREAM_KEY = "upstream-key-Q9w8e7r6t5";
const LEAK =
  "psycopg2.OperationalError: could not connect to postgres://admin:S3cret@10.1.2.3:5432/prod (db-primary.internal)\n" +
  '  File "/srv/internal/app.py", line 42 <script>alert(1)</script> Incorrect API key provided: sk-live-abc123SECRETxyz ' +
  "\u001b[31mFORGED LOG LINE\u001b[0m\r\n";
const LONG_LEAK = `${LEAK}${"x".repeat(3000)}`;
const FORBIDDEN = [
  "S3cret",
  "postgres://",
  "10.1.2.3",
  "db-primary.internal",
  "psycopg2",
  "/srv/internal",
  "app.py",
  "<script>",
  "sk-live",
  "SECRETxyz",
  "FORGED",
  UPSTREAM_KEY,
  "xxxxxxxx",
];

/** How the hostile service answers POST /v1/systemone, by the state's `hostile` field. */
const BEHAVIOURS: Record<string, (req: IncomingMessage, res: ServerResponse) => void> = {
  "500": (_req, res) => sendJson(res, 500, { detail: LONG_LEAK }),
  "401": (req, res) => sendJson(res, 401, { error: { message: `${LEAK} you sent ${req.headers.authorization}` } }),
  "422": (_req, res) => sendJson(res, 422, { detail: [{ msg: LEAK }] }),
  "422-context": (_req, res) => sendJson(res, 422, { detail: `This model's maximum context length is 4096 tokens. ${LEAK}` }),
  "429": (_req, res) => sendJson(res, 429, { message: LEAK }, { "retry-after": "3" }),
  "503-html": (_req, res) => send(res, 503, "text/html", `<html><body><script>x()</script>${LEAK}</body></html>`),
  garbage: (_req, res) => send(res, 200, "application/json", `${LEAK}{{{`),
  answers: (_req, res) =>
    sendJson(res, 200, {
      answers: { topic: {}, urgency: {}, refund: {}, "postgres://admin:S3cret@10.1.2.3 <script>": { type: "noul", noul: 0.5 } },
      usage: { input_tokens: 5, output_tokens: 1 },
    }),
};

/** The status, the failure kind logged, and what the client is told. */
const CASES: Array<[hostile: string, status: number, failure: string, detail: RegExp]> = [
  ["500", 502, "bad_status", /answered HTTP 5xx/],
  ["401", 502, "bad_status", /answered HTTP 4xx/],
  ["422", 502, "refused", /refused the request \(HTTP 4xx\)/],
  ["422-context", 422, "context_rejected", /^The request is longer than the context of the model/],
  ["429", 502, "overloaded", /is overloaded \(HTTP 4xx\); retry in 3 s/],
  ["503-html", 502, "bad_status", /answered HTTP 5xx/],
  ["garbage", 502, "invalid_response", /sent an answer that cannot be read \(HTTP 2xx\)/],
  ["answers", 502, "answers_mismatch", /sent answers that do not match the questions/],
];

function send(res: ServerResponse, status: number, type: string, text: string, headers: Record<string, string> = {}): void {
  res.writeHead(status, { "content-type": type, "content-length": Buffer.byteLength(text), ...headers });
  res.end(text);
}

function sendJson(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  send(res, status, "application/json", JSON.stringify(body), headers);
}

async function startHostileService(): Promise<{ url: string; close(): Promise<void> }> {
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      if (req.url === "/v1/models") return sendJson(res, 200, { models: [{ name: "hostile-model" }] });
      const body = JSON.parse(Buffer.concat(chunks).toString("utf8")) as { state: { hostile: string } };
      const behaviour = BEHAVIOURS[body.state.hostile];
      if (!behaviour) return sendJson(res, 500, { detail: "unknown behaviour" });
      behaviour(req, res);
    });
  });
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

function assertClean(text: string, where: string): void {
  for (const secret of FORBIDDEN) assert.ok(!text.includes(secret), `${where} contains ${JSON.stringify(secret)}: ${text}`);
}

describe("a hostile model service's error texts stay in the server log", () => {
  let upstream: Awaited<ReturnType<typeof startHostileService>>;
  let gw: Gateway;
  const lines: string[] = [];
  const answered = new Map<string, { requestId: string; detail: string }>();

  before(async () => {
    upstream = await startHostileService();
    const sink = new Writable({
      write(chunk, _enc, done) {
        lines.push(...chunk.toString().split("\n").filter(Boolean));
        done();
      },
    });
    gw = await startGateway({
      fake: false,
      env: { TDS_MODEL_SERVICE_URL: upstream.url, TDS_MODEL_SERVICE_KEY: UPSTREAM_KEY, TDS_ADMIN_TOKEN: ADMIN_TOKEN },
      loggerInstance: pino({ level: "info" }, sink),
    });
  });
  after(async () => {
    await gw.close();
    await upstream.close();
  });

  for (const [hostile, status, , detail] of CASES) {
    test(`${hostile} → ${status}: our own words, the deployment and the request id; nothing of the upstream's text`, async () => {
      const res = await gw.decide(sampleRequest({ state: { hostile } }));
      const text = await res.text();
      assert.equal(res.status, status, text);
      assertClean(text, "the response");
      const body = JSON.parse(text) as { detail: string };
      const requestId = res.headers.get("x-service-request-id")!;
      assert.match(body.detail, detail);
      assert.ok(body.detail.includes(`(deployment ${JSON.stringify(gw.config.modelServices[0]!.name)})`), body.detail);
      assert.ok(body.detail.endsWith(`; no credits were charged (request ${requestId}).`), body.detail);
      answered.set(hostile, { requestId, detail: body.detail });
    });
  }

  test("the usage records say what the client was told, and nothing more (GET /v1/usage, /v1/usage/{id}, the admin API)", async () => {
    assert.equal(answered.size, CASES.length);
    const list = await gw.get("/v1/usage?limit=100");
    const listText = await list.text();
    assert.equal(list.status, 200, listText);
    assertClean(listText, "GET /v1/usage");
    const records = (JSON.parse(listText) as { data: { request_id: string; error: string | null }[] }).data;
    for (const { requestId, detail } of answered.values()) {
      const one = await gw.get(`/v1/usage/${requestId}`);
      const oneText = await one.text();
      assert.equal(one.status, 200, oneText);
      assertClean(oneText, `GET /v1/usage/${requestId}`);
      assert.equal((JSON.parse(oneText) as { error: string }).error, detail);
      assert.equal(records.find((r) => r.request_id === requestId)?.error, detail);
      const admin = await fetch(`${gw.url}/admin/v1/organizations/${gw.orgId}/usage/${requestId}`, {
        headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
      });
      const adminText = await admin.text();
      assert.equal(admin.status, 200, adminText);
      assertClean(adminText, "the admin API");
    }
  });

  test("the server log has one warn line per failure: request id, model, deployment, kind and the escaped, bounded reason", () => {
    const logged = lines.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === "model call failed");
    for (const [hostile, , failure] of CASES) {
      const { requestId } = answered.get(hostile)!;
      const mine = logged.filter((l) => l.request_id === requestId);
      assert.equal(mine.length, 1, `${hostile}: one line`);
      const line = mine[0]!;
      assert.equal(line.level, 40, "warn");
      assert.equal(line.model, "hostile-model");
      assert.equal(line.deployment, gw.config.modelServices[0]!.name);
      assert.equal(line.failure, failure);
      const reason = line.reason as string;
      // biome-ignore lint/suspicious/noControlCharactersInRegex: the test looks for raw control characters
      assert.ok(!/[\u0000-\u001f\u007f]/.test(reason), `${hostile}: no raw control character in ${JSON.stringify(reason)}`);
      assert.ok(Array.from(reason).length <= 520, `${hostile}: bounded, ${reason.length} characters`);
      if (failure !== "answers_mismatch" && failure !== "invalid_response") {
        assert.ok(reason.includes("postgres://admin:S3cret@10.1.2.3"), `${hostile}: the upstream's words are in the log: ${reason}`);
      }
      if (hostile === "500") {
        assert.ok(reason.includes("\\n  File"), "a newline is escaped");
        assert.ok(reason.includes("\\u001b[31mFORGED"), "an escape sequence is escaped");
        assert.ok(reason.endsWith("…"), "a long text is cut");
      }
      if (hostile === "401") {
        assert.ok(!reason.includes(UPSTREAM_KEY), "the model service key is scrubbed even from the log");
        assert.ok(reason.includes("Bearer [redacted]"));
      }
      if (hostile === "answers") assert.match(reason, /answers contain "postgres:\/\/admin:S3cret@10\.1\.2\.3 <script>"/);
    }
    assert.equal(logged.length, CASES.length, "one line per failure, none for anything else");
  });
});
