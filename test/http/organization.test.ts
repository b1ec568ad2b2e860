import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { OrganizationResponse, type UsageDay, UsageSummaryResponse } from "../../src/contract/organization.ts";
import { compileSchema } from "../../src/contract/validation.ts";
import { errorBody, json } from "../support/contract-check.ts";
import { FixedClock } from "../support/fixed-clock.ts";
import { sampleRequest, startGateway } from "../support/gateway-harness.ts";
import { finalRecord, type SeedRecord, seedUsage } from "../support/usage-fixtures.ts";

const validOrg = compileSchema<OrganizationResponse>(OrganizationResponse);
const validSummary = compileSchema<UsageSummaryResponse>(UsageSummaryResponse);

function usageRecord(orgId: string, keyId: string, requestId: string, createdAtMs: number, extra: Partial<SeedRecord> = {}): SeedRecord {
  return finalRecord({ requestId, orgId, keyId, createdAtMs, ...extra });
}

describe("GET /v1/organization", () => {
  test("preview: today's quota from the store, the reset at the next 00:00 UTC, no balance", async () => {
    const clock = new FixedClock(Date.parse("2026-11-20T15:30:00Z"));
    const gw = await startGateway({ clock, env: { TDS_PREVIEW_REQUEST_LIMIT: "5", TDS_REQUESTS_PER_MINUTE: "42" } });
    try {
      for (let i = 0; i < 2; i++) await (await gw.decide(sampleRequest())).text();
      const body = await json(await gw.get("/v1/organization"));
      assert.ok(validOrg(body), JSON.stringify(validOrg.errors));
      assert.deepEqual(body, {
        id: gw.orgId,
        name: "test-org",
        service_mode: "preview",
        paused: false,
        balance: null,
        preview: { date: "2026-11-20", used: 2, limit: 5, remaining: 3, resets_at: "2026-11-21T00:00:00.000Z" },
        rate_limit: { requests_per_minute: 42 },
      });

      // A new UTC day: a fresh counter.
      clock.set(Date.parse("2026-11-21T00:00:00Z"));
      const next = await json(await gw.get("/v1/organization"));
      assert.deepEqual(next.preview, { date: "2026-11-21", used: 0, limit: 5, remaining: 5, resets_at: "2026-11-22T00:00:00.000Z" });

      // Exhausted: remaining never goes below zero.
      for (let i = 0; i < 6; i++) await (await gw.decide(sampleRequest())).text();
      const full = await json(await gw.get("/v1/organization"));
      assert.equal(full.preview.used, 5);
      assert.equal(full.preview.remaining, 0);
    } finally {
      await gw.close();
    }
  });

  test("paid: the balance in microUSD and exact USD strings, no preview quota", async () => {
    const gw = await startGateway({ env: { TDS_SERVICE_MODE: "paid", TDS_PRICE_PER_MILLION_INPUT_USD: "1" } });
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 2_500_000, nowMs: Date.now() });
      const decision = await json(await gw.decide(sampleRequest()));
      const body = await json(await gw.get("/v1/organization"));
      assert.ok(validOrg(body), JSON.stringify(validOrg.errors));
      assert.equal(body.service_mode, "paid");
      assert.equal(body.preview, null);
      const cost = decision.usage.cost_microusd;
      assert.ok(cost > 0);
      assert.deepEqual(body.balance, {
        available_microusd: 2_500_000 - cost,
        available_usd: String((2_500_000 - cost) / 1e6),
        reserved_microusd: 0,
        reserved_usd: "0",
        spent_microusd: cost,
        spent_usd: decision.usage.cost_usd,
      });
    } finally {
      await gw.close();
    }
  });

  test("scoped to the key's organization; a paused organization can read it; no key → 401", async () => {
    const gw = await startGateway();
    try {
      const other = await gw.newOrg("other-org");
      await gw.store.setOrganizationPaused(other.orgId, true);
      const res = await fetch(`${gw.url}/v1/organization`, { headers: { authorization: `Bearer ${other.key}` } });
      const body = await json(res);
      assert.equal(body.id, other.orgId);
      assert.equal(body.name, "other-org");
      assert.equal(body.paused, true);
      await errorBody(await fetch(`${gw.url}/v1/organization`), 401);
      await errorBody(await fetch(`${gw.url}/v1/organization`, { headers: { authorization: "Bearer tds_nope" } }), 401);
    } finally {
      await gw.close();
    }
  });
});

describe("GET /v1/usage/summary", () => {
  test("the last N UTC days, today included, oldest first, zero-filled, only this organization", async () => {
    const clock = new FixedClock(Date.parse("2026-11-18T10:00:00Z"));
    const gw = await startGateway({ clock });
    try {
      const other = await gw.newOrg("other-org");
      // Nov 18: two successes; Nov 20: one success and one model error; Nov 17 (out of a 3-day window): one.
      await seedUsage(gw.store, [usageRecord(gw.orgId, gw.keyId, "req_old", Date.parse("2026-11-17T23:59:59.999Z"))]);
      for (let i = 0; i < 2; i++) await (await gw.decide(sampleRequest())).text();
      clock.set(Date.parse("2026-11-20T00:00:00Z"));
      await (await gw.decide(sampleRequest())).text();
      await (await gw.decide(sampleRequest({ state: { fake_behavior: "status:500" } }))).text();
      await seedUsage(gw.store, [usageRecord(other.orgId, other.keyId, "req_other", Date.parse("2026-11-20T01:00:00Z"))]);
      clock.set(Date.parse("2026-11-20T23:59:59Z"));

      const body = await json(await gw.get("/v1/usage/summary?days=3"));
      assert.ok(validSummary(body), JSON.stringify(validSummary.errors));
      assert.equal(body.truncated, false);
      assert.deepEqual(
        body.days.map((d: { date: string }) => d.date),
        ["2026-11-18", "2026-11-19", "2026-11-20"],
      );
      assert.deepEqual(
        body.days.map((d: { requests: number }) => d.requests),
        [2, 0, 2],
      );
      const [first, empty, last] = body.days as [UsageDay, UsageDay, UsageDay];
      assert.ok(first.input_tokens > 0 && first.output_tokens > 0);
      assert.deepEqual(empty, { date: "2026-11-19", requests: 0, input_tokens: 0, output_tokens: 0, cost_microusd: 0, cost_usd: "0" });
      assert.equal(last.cost_usd, "0");

      const list = await json(await gw.get("/v1/usage?from=2026-11-20T00:00:00Z"));
      assert.equal(list.data.length, 2, "the summary counts what the list shows");

      const fourteen = await json(await gw.get("/v1/usage/summary"));
      assert.equal(fourteen.days.length, 14);
      assert.equal(fourteen.days[0].date, "2026-11-07");
      assert.equal(fourteen.days.at(-1).date, "2026-11-20");
      assert.equal(fourteen.days.find((d: { date: string }) => d.date === "2026-11-17").requests, 1);
      assert.equal(
        fourteen.days.reduce((s: number, d: { requests: number }) => s + d.requests, 0),
        5,
      );

      const one = await json(await gw.get("/v1/usage/summary?days=1"));
      assert.deepEqual(
        one.days.map((d: { date: string }) => d.date),
        ["2026-11-20"],
      );
      assert.equal((await json(await gw.get("/v1/usage/summary?days=31"))).days.length, 31);

      for (const bad of ["days=0", "days=32", "days=abc", "days=-1", "days=1.5", "colour=red"]) {
        const err = await errorBody(await gw.get(`/v1/usage/summary?${bad}`), 422);
        assert.ok(err.errors?.[0]?.field.startsWith("query"), `${bad}: ${JSON.stringify(err)}`);
      }
      await errorBody(await fetch(`${gw.url}/v1/usage/summary`), 401);
    } finally {
      await gw.close();
    }
  });

  test("paid costs add up exactly per day", async () => {
    const gw = await startGateway({
      env: { TDS_SERVICE_MODE: "paid", TDS_PRICE_PER_MILLION_INPUT_USD: "0.7" },
    });
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 1_000_000, nowMs: Date.now() });
      let total = 0;
      for (let i = 0; i < 3; i++) total += (await json(await gw.decide(sampleRequest()))).usage.cost_microusd;
      const today = (await json(await gw.get("/v1/usage/summary?days=1"))).days[0];
      assert.equal(today.requests, 3);
      assert.equal(today.cost_microusd, total);
      assert.equal(today.cost_usd, String(total / 1e6));
    } finally {
      await gw.close();
    }
  });

  test("never truncated: more than 10,000 records of a day are all counted, from the daily totals", async () => {
    const clock = new FixedClock(Date.parse("2026-11-20T12:00:00Z"));
    const gw = await startGateway({ clock });
    try {
      const now = clock.nowMs();
      const records = Array.from({ length: 10_005 }, (_, i) =>
        usageRecord(gw.orgId, gw.keyId, `req_bulk${i}`, now - i * 1000, { inputTokens: 3, outputTokens: 2 }),
      );
      await seedUsage(gw.store, records);
      const body = await json(await gw.get("/v1/usage/summary?days=2"));
      assert.ok(validSummary(body), JSON.stringify(validSummary.errors));
      assert.equal(body.truncated, false);
      assert.deepEqual(
        body.days.map((d: UsageDay) => [d.date, d.requests, d.input_tokens, d.output_tokens]),
        [
          ["2026-11-19", 0, 0, 0],
          ["2026-11-20", 10_005, 30_015, 20_010],
        ],
      );
    } finally {
      await gw.close();
    }
  });
});

describe("OpenAPI", () => {
  test("documents the read endpoints with their schemas and security; the console's routes are left out", async () => {
    const gw = await startGateway();
    try {
      const doc = await json(await fetch(`${gw.url}/openapi.json`));
      const org = doc.paths["/v1/organization"].get;
      assert.ok(org.summary);
      assert.deepEqual(org.security, [{ bearer: [] }]);
      assert.equal(org.responses["200"].content["application/json"].schema.title, "Organization");
      assert.equal(org.responses["200"].content["application/json"].schema.additionalProperties, false);
      const summary = doc.paths["/v1/usage/summary"].get;
      assert.deepEqual(summary.security, [{ bearer: [] }]);
      assert.equal(summary.responses["200"].content["application/json"].schema.title, "UsageSummary");
      assert.deepEqual(
        summary.parameters.map((p: { name: string; in: string }) => [p.name, p.in]),
        [["days", "query"]],
      );
      for (const path of Object.keys(doc.paths)) assert.ok(!path.startsWith("/console") && path !== "/", path);
    } finally {
      await gw.close();
    }
  });
});
