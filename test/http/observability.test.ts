import assert from "node:assert/strict";
import { Writable } from "node:stream";
import { describe, test } from "node:test";
import pino from "pino";
import { Metrics } from "../../src/observability/metrics.ts";
import { errorBody, json } from "../support/contract-check.ts";
import { sampleRequest, startGateway, TICKET_HISTORY } from "../support/gateway-harness.ts";
import { byteBound } from "../support/token-bound.ts";

function metricValue(text: string, name: string, labels: Record<string, string> = {}): number {
  const wanted = Object.entries(labels).map(([k, v]) => `${k}="${v}"`);
  const line = text
    .split("\n")
    .find((l) => (l.startsWith(`${name}{`) || l.startsWith(`${name} `) ? wanted.every((w) => l.includes(w)) : false));
  return line ? Number(line.slice(line.lastIndexOf(" ") + 1)) : 0;
}

describe("observability", () => {
  test("/metrics after a mix of requests has the expected counters", async () => {
    const gw = await startGateway({
      metrics: new Metrics(),
      env: { TDS_SERVICE_MODE: "paid", TDS_PRICE_PER_MILLION_INPUT_USD: "1", TDS_REQUESTS_PER_MINUTE: "7" },
    });
    try {
      // Every request reserves its token bound (1 µUSD per token) and is charged the fake's token count.
      const bound = byteBound(sampleRequest());
      const statuses: number[] = [];
      const send = async (body: Record<string, unknown>) => {
        const res = await gw.decide(body);
        await res.text();
        statuses.push(res.status);
      };
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: bound, nowMs: Date.now() });
      await send(sampleRequest()); // 200, `cost` µUSD
      const cost = (await gw.store.getBalance(gw.orgId)).spent;
      assert.ok(cost > 0 && cost < bound, `an honest count under the bound: ${cost} < ${bound}`);
      // Enough for 900 µUSD, one more sampleRequest() and, after it, one reservation less 1 µUSD.
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 900 + 2 * cost - 1, nowMs: Date.now() });
      const failing = sampleRequest({ state: { fake_behavior: "status:500", history: TICKET_HISTORY } });
      assert.ok(byteBound(failing) <= bound);
      const oversized = sampleRequest({ model: "fake-large", state: { log: "x".repeat(40_000) } });
      assert.ok(byteBound(oversized) > 32_768, "over the default reserve_tokens");
      const mix = [
        sampleRequest({ state: { fake_behavior: "tokens:900:0", history: TICKET_HISTORY } }), // 200, 900 µUSD
        failing, // 502, released
        { state: 1 }, // 422, before admission (it counts against the rate limit all the same)
        sampleRequest(), // 200: then 1 µUSD less than one reservation is left
        oversized, // 413: its bound is over reserve_tokens, nothing reserved
        sampleRequest(), // 402
        sampleRequest(), // 429: the seventh counted request of the minute came before
      ];
      for (const body of mix) await send(body);
      await (await gw.decide(sampleRequest(), { authorization: "Bearer nope" })).text();
      assert.deepEqual(statuses, [200, 200, 502, 422, 200, 413, 402, 429]);
      const text = await (await fetch(`${gw.url}/metrics`)).text();
      const post = { method: "POST", route: "/v1/systemone" };
      assert.equal(metricValue(text, "tds_http_requests_total", { ...post, status: "200" }), statuses.filter((s) => s === 200).length);
      assert.equal(metricValue(text, "tds_http_requests_total", { ...post, status: "502" }), 1);
      assert.equal(metricValue(text, "tds_http_requests_total", { ...post, status: "422" }), 1);
      assert.equal(metricValue(text, "tds_http_requests_total", { ...post, status: "401" }), 1);
      assert.equal(metricValue(text, "tds_http_requests_total", { ...post, status: "413" }), 1);
      assert.equal(metricValue(text, "tds_http_requests_total", { ...post, status: "402" }), 1);
      assert.equal(metricValue(text, "tds_http_requests_total", { ...post, status: "429" }), statuses.filter((s) => s === 429).length);
      assert.equal(metricValue(text, "tds_model_errors_total", { kind: "bad_status" }), 1);
      assert.equal(metricValue(text, "tds_reservations_total", { outcome: "released" }), 1);
      assert.equal(metricValue(text, "tds_reservations_total", { outcome: "settled" }), statuses.filter((s) => s === 200).length);
      assert.equal(
        metricValue(text, "tds_admission_rejections_total", { reason: "rate_limited" }),
        statuses.filter((s) => s === 429).length,
      );
      assert.equal(metricValue(text, "tds_admission_rejections_total", { reason: "insufficient_credits" }), 1);
      assert.equal(metricValue(text, "tds_admission_rejections_total", { reason: "token_bound_over_reserve" }), 1);
      assert.equal(metricValue(text, "tds_reservations_total", { outcome: "reserved" }), 4, "none for the 413 or the 402");
      assert.equal(metricValue(text, "tds_reservations_total", { outcome: "insufficient" }), 1);
      assert.equal(metricValue(text, "tds_gateway_latency_seconds_count"), statuses.filter((s) => s === 200).length);
      assert.equal(metricValue(text, "tds_rate_limiter_fallback"), 0);
    } finally {
      await gw.close();
    }
  });

  test("TDS_METRICS_TOKEN protects /metrics", async () => {
    const token = "scrape-7Hq2Lw9Xv4Rk8Tz1Nb6Mc3Pd5Fg0Js";
    const gw = await startGateway({ env: { TDS_METRICS_TOKEN: token } });
    try {
      await errorBody(await fetch(`${gw.url}/metrics`), 401);
      for (const wrong of ["wrong", token.slice(0, -1), `${token}x`, token.toUpperCase()]) {
        await errorBody(await fetch(`${gw.url}/metrics`, { headers: { authorization: `Bearer ${wrong}` } }), 401);
      }
      const ok = await fetch(`${gw.url}/metrics`, { headers: { authorization: `Bearer ${token}` } });
      assert.equal(ok.status, 200);
      assert.match(await ok.text(), /tds_http_requests_total/);
    } finally {
      await gw.close();
    }
  });

  test("/healthz is up; /readyz reports the database and the model service", async () => {
    const gw = await startGateway();
    const down = await startGateway({ fake: false, env: { TDS_MODEL_SERVICE_URL: "http://127.0.0.1:9" } });
    try {
      assert.deepEqual(await json(await fetch(`${gw.url}/healthz`)), { status: "ok" });
      assert.deepEqual(await json(await fetch(`${gw.url}/readyz`)), {
        status: "ready",
        checks: { database: "ok", models: "ok" },
        models: { "fake-large": { state: "ok", healthy: 1, deployments: 1 }, "fake-small": { state: "ok", healthy: 1, deployments: 1 } },
      });
      const res = await fetch(`${down.url}/readyz`);
      assert.equal(res.status, 503);
      const body = await json(res);
      assert.equal(body.checks.database, "ok");
      assert.match(body.checks.models, /unavailable/);
      assert.equal((await fetch(`${down.url}/healthz`)).status, 200);
    } finally {
      await gw.close();
      await down.close();
    }
  });

  test("JSON logs carry the request id on every request line and never the key, the Authorization header or the state", async () => {
    const lines: string[] = [];
    const sink = new Writable({
      write(chunk, _enc, done) {
        lines.push(...chunk.toString().split("\n").filter(Boolean));
        done();
      },
    });
    const gw = await startGateway({ loggerInstance: pino({ level: "info" }, sink) });
    try {
      const secret = "STATE-SECRET-7f3a";
      const res = await gw.decide(sampleRequest({ state: { note: secret, fake_behavior: "status:500" } }));
      const requestId = res.headers.get("x-service-request-id")!;
      await res.text();
      await (await gw.decide(sampleRequest({ state: secret }))).text();
      await (await gw.decide(sampleRequest(), { authorization: `Bearer ${gw.key}x` })).text();
      const all = lines.join("\n");
      assert.ok(lines.length >= 6, all);
      for (const forbidden of [gw.key, secret, "Bearer", "authorization"]) assert.ok(!all.includes(forbidden), `logs contain ${forbidden}`);
      const requestLines = lines.map((l) => JSON.parse(l)).filter((l) => l.req || l.res);
      assert.ok(requestLines.length >= 6);
      for (const l of requestLines) assert.match(l.request_id, /^req_/);
      assert.ok(requestLines.some((l) => l.request_id === requestId));
    } finally {
      await gw.close();
    }
  });
});
