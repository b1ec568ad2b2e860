/**
 * The two usage summaries through a real listening gateway: GET /v1/usage/summary (the key's organization) and
 * GET /admin/v1/usage/summary (every organization) answer from one implementation, so they agree with each other and
 * with the records themselves (paged through GET /v1/usage), for every period, across UTC days and organizations.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { StoreAdministration } from "../../src/admin/store-administration.ts";
import { AdminUsageSummary } from "../../src/contract/admin.ts";
import { type UsageDay, UsageSummaryResponse } from "../../src/contract/organization.ts";
import { compileSchema } from "../../src/contract/validation.ts";
import { DAY_MS } from "../../src/domain/utc-day.ts";
import { json } from "../support/contract-check.ts";
import { FixedClock } from "../support/fixed-clock.ts";
import { type Gateway, sampleRequest, startGateway } from "../support/gateway-harness.ts";
import { finalRecord, seedUsage } from "../support/usage-fixtures.ts";

const ADMIN_TOKEN = "adm-Usage5ummary-9Lr4Tz8Kw1Nc6Hs3Bd5Fg0Jm";
const validSummary = compileSchema<UsageSummaryResponse>(UsageSummaryResponse);
const validAdmin = compileSchema<AdminUsageSummary>(AdminUsageSummary);

type Sums = { requests: number; input_tokens: number; output_tokens: number; cost_microusd: number };
const zero = (): Sums => ({ requests: 0, input_tokens: 0, output_tokens: 0, cost_microusd: 0 });
const add = (a: Sums, b: Sums): Sums => ({
  requests: a.requests + b.requests,
  input_tokens: a.input_tokens + b.input_tokens,
  output_tokens: a.output_tokens + b.output_tokens,
  cost_microusd: a.cost_microusd + b.cost_microusd,
});
const sums = (d: Sums): Sums => ({
  requests: d.requests,
  input_tokens: d.input_tokens,
  output_tokens: d.output_tokens,
  cost_microusd: d.cost_microusd,
});

describe("usage summaries: the organization's and the admin's agree", () => {
  const clock = new FixedClock(Date.parse("2026-11-18T10:00:00Z"));
  let gw: Gateway;
  const keys = new Map<string, string>();

  const as = (key: string, path: string) => fetch(`${gw.url}${path}`, { headers: { authorization: `Bearer ${key}` } });
  const decide = async (key: string, body: Record<string, unknown> = sampleRequest()) => {
    const res = await fetch(`${gw.url}/v1/systemone`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    await res.arrayBuffer();
    return res.status;
  };

  before(async () => {
    gw = await startGateway({
      clock,
      env: {
        TDS_ADMIN_TOKEN: ADMIN_TOKEN,
        TDS_SERVICE_MODE: "paid",
        TDS_PRICE_PER_MILLION_INPUT_USD: "0.7",
        TDS_PRICE_PER_MILLION_OUTPUT_USD: "2.1",
        TDS_RESERVE_TOKENS: "100000",
        TDS_MODEL_TIMEOUT_MS: "2000",
      },
    });
    const b = await gw.newOrg("Org B");
    const c = await gw.newOrg("Org C (no usage)");
    keys.set(gw.orgId, gw.key);
    keys.set(b.orgId, b.key);
    keys.set(c.orgId, c.key);
    for (const orgId of [gw.orgId, b.orgId]) await gw.store.grantCredits({ orgId, amountMicrousd: 50_000_000, nowMs: clock.nowMs() });

    // Through the gateway: successes (charged) and a model failure (not charged) on three days.
    assert.equal(await decide(gw.key), 200);
    assert.equal(await decide(gw.key), 200);
    assert.equal(await decide(gw.key, sampleRequest({ state: { fake_behavior: "status:500" } })), 502);
    assert.equal(await decide(b.key), 200);
    clock.set(Date.parse("2026-11-19T23:59:59.999Z"));
    assert.equal(await decide(b.key), 200);
    clock.set(Date.parse("2026-11-20T00:00:00Z"));
    assert.equal(await decide(gw.key), 200);
    // History older than the gateway's own traffic, of every outcome, and one request left in flight that the sweep
    // completes (it stays counted in the day it was accepted).
    const seeded = [
      finalRecord({
        requestId: "old_1",
        orgId: gw.orgId,
        createdAtMs: Date.parse("2026-10-21T08:00:00Z"),
        costMicrousd: 900,
        mode: "paid",
      }),
      finalRecord({ requestId: "old_2", orgId: gw.orgId, createdAtMs: Date.parse("2026-11-06T23:59:59Z"), outcome: "context_rejected" }),
      finalRecord({ requestId: "old_3", orgId: b.orgId, createdAtMs: Date.parse("2026-11-07T00:00:00Z"), outcome: "reservation_expired" }),
      finalRecord({
        requestId: "old_4",
        orgId: b.orgId,
        createdAtMs: Date.parse("2026-11-17T12:00:00Z"),
        costMicrousd: 1234,
        mode: "paid",
      }),
      {
        ...finalRecord({ requestId: "stuck", orgId: b.orgId, createdAtMs: Date.parse("2026-11-20T00:00:01Z"), outcome: "in_flight" }),
        completedAtMs: null,
        httpStatus: null,
        inputTokens: 0,
        outputTokens: 0,
      },
    ];
    await seedUsage(gw.store, seeded);
    clock.set(Date.parse("2026-11-20T18:30:00Z"));
    assert.equal((await gw.store.sweep({ nowMs: clock.nowMs(), inFlightBeforeMs: clock.nowMs() - 60_000, limit: 10 })).abandoned, 1);
  });

  after(async () => {
    await gw.close();
  });

  /** Every record of the organization created on or after `fromMs`, paged through GET /v1/usage, summed per UTC day. */
  async function recordsPerDay(key: string, fromMs: number): Promise<Map<string, Sums>> {
    const perDay = new Map<string, Sums>();
    let cursor: string | null = null;
    do {
      const page = await json(
        await as(key, `/v1/usage?limit=200&from=${new Date(fromMs).toISOString()}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`),
      );
      for (const r of page.data as (Sums & { created_at: string })[]) {
        const day = r.created_at.slice(0, 10);
        perDay.set(day, add(perDay.get(day) ?? zero(), { ...sums(r), requests: 1 }));
      }
      cursor = page.next_cursor;
    } while (cursor);
    return perDay;
  }

  for (const days of [1, 2, 3, 14, 31]) {
    test(`days=${days}: per day and per organization, the same figures as the records`, async () => {
      const admin = await json(
        await fetch(`${gw.url}/admin/v1/usage/summary?days=${days}`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } }),
      );
      assert.ok(validAdmin(admin), JSON.stringify(validAdmin.errors));
      assert.equal(admin.to, "2026-11-21T00:00:00.000Z");
      assert.equal(admin.from, new Date(Date.parse(admin.to) - days * DAY_MS).toISOString());
      assert.equal(admin.days.length, days);

      const everyOrg = admin.days.map(() => zero());
      const listed = new Map<string, Sums>((admin.organizations as (Sums & { id: string })[]).map((o) => [o.id, sums(o)]));
      for (const [orgId, key] of keys) {
        const own = await json(await as(key, `/v1/usage/summary?days=${days}`));
        assert.ok(validSummary(own), JSON.stringify(validSummary.errors));
        assert.equal(own.truncated, false);
        assert.deepEqual(
          own.days.map((d: UsageDay) => d.date),
          admin.days.map((d: UsageDay) => d.date),
          "the same days",
        );
        const records = await recordsPerDay(key, Date.parse(admin.from));
        own.days.forEach((d: UsageDay, i: number) => {
          assert.deepEqual(sums(d), records.get(d.date) ?? zero(), `${orgId} on ${d.date}: the records`);
          assert.equal(d.cost_usd, String(d.cost_microusd / 1e6));
          everyOrg[i] = add(everyOrg[i]!, sums(d));
        });
        const total = own.days.reduce((s: Sums, d: UsageDay) => add(s, sums(d)), zero());
        if (total.requests === 0) assert.equal(listed.has(orgId), false, `${orgId} without requests is not listed`);
        else assert.deepEqual(listed.get(orgId), total, `${orgId}: the admin's organization row is the sum of its days`);
      }
      assert.deepEqual(admin.days.map(sums), everyOrg, "the admin's days are the sum of every organization's");
    });
  }

  test("the figures the traffic implies: counted in the day accepted, failures and the sweep included, names listed", async () => {
    const admin = await json(
      await fetch(`${gw.url}/admin/v1/usage/summary?days=31`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } }),
    );
    const requests = new Map(admin.days.map((d: UsageDay) => [d.date, d.requests]));
    assert.equal(requests.get("2026-11-18"), 4);
    assert.equal(requests.get("2026-11-19"), 1);
    assert.equal(requests.get("2026-11-20"), 2, "the swept request counts in the day it was accepted");
    assert.equal(requests.get("2026-11-06"), 1);
    assert.equal(requests.get("2026-11-07"), 1);
    const names = (admin.organizations as { id: string; name: string }[]).map((o) => [o.id, o.name]);
    assert.deepEqual(new Set(names.map(([, name]) => name)), new Set(["test-org", "Org B"]));
    assert.equal(admin.days[0].date, "2026-10-21", "31 days, today included");
    assert.equal(requests.get("2026-10-21"), 1);
    const fourteen = await json(
      await fetch(`${gw.url}/admin/v1/usage/summary?days=14`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } }),
    );
    assert.equal(fourteen.days[0].date, "2026-11-07");
    assert.equal(
      fourteen.days.reduce((n: number, d: UsageDay) => n + d.requests, 0),
      4 + 1 + 2 + 1 + 1,
      "the 6th and the 21st of October are outside",
    );
  });

  test("the administration on the database (the CLI's) gives the admin route's figures, the days with requests only", async () => {
    const admin = await json(
      await fetch(`${gw.url}/admin/v1/usage/summary?days=14`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } }),
    );
    const operations = new StoreAdministration({
      store: gw.store,
      previewRequestLimit: 0,
      nowMs: () => clock.nowMs(),
      actor: { source: "cli", client: null, remoteAddress: null },
    });
    const summary = await operations.usageSummary(14);
    assert.deepEqual([new Date(summary.fromMs).toISOString(), new Date(summary.toMs).toISOString()], [admin.from, admin.to]);
    assert.deepEqual(
      summary.days.map((d) => [
        new Date(d.dayStartMs).toISOString().slice(0, 10),
        d.requests,
        d.inputTokens,
        d.outputTokens,
        d.costMicrousd,
      ]),
      (admin.days as (UsageDay & Sums)[])
        .filter((d) => d.requests > 0)
        .map((d) => [d.date, d.requests, d.input_tokens, d.output_tokens, d.cost_microusd]),
    );
    assert.deepEqual(
      summary.organizations.map((o) => [o.orgId, o.name, o.requests, o.costMicrousd]),
      (admin.organizations as (Sums & { id: string; name: string })[]).map((o) => [o.id, o.name, o.requests, o.cost_microusd]),
    );
  });
});
