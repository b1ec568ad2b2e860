import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { errorBody } from "../support/contract-check.ts";
import { FixedClock } from "../support/fixed-clock.ts";
import { sampleRequest, startGateway } from "../support/gateway-harness.ts";

describe("per-minute rate limit", () => {
  test("3× the limit at once: exactly the limit is accepted, every 429 has Retry-After, nothing recorded for them", async () => {
    const clock = new FixedClock(Date.parse("2026-11-26T12:00:00Z"));
    const gw = await startGateway({ clock, env: { TDS_REQUESTS_PER_MINUTE: "5" } });
    try {
      const responses = await Promise.all(Array.from({ length: 15 }, () => gw.decide(sampleRequest())));
      const statuses = responses.map((r) => r.status);
      assert.equal(statuses.filter((s) => s === 200).length, 5);
      assert.equal(statuses.filter((s) => s === 429).length, 10);
      for (const res of responses.filter((r) => r.status === 429)) {
        assert.equal(res.headers.get("retry-after"), "60");
        assert.equal(res.headers.get("retry-after-ms"), "60000");
        assert.match((await errorBody(res, 429)).detail, /requests_per_minute = 5/);
      }
      assert.equal(gw.fake!.calls.decide, 5);
      assert.equal((await gw.store.listUsage(gw.orgId, { limit: 100 })).records.length, 5);

      clock.advance(59_999);
      const still = await gw.decide(sampleRequest());
      assert.equal(still.status, 429);
      assert.equal(still.headers.get("retry-after-ms"), "1");
      clock.advance(1);
      assert.equal((await gw.decide(sampleRequest())).status, 200, "the window slides: 60 s after the first, a slot is free");
    } finally {
      await gw.close();
    }
  });

  test("all keys of an organization and the Playground share one limit; other organizations have their own", async () => {
    const gw = await startGateway({ env: { TDS_REQUESTS_PER_MINUTE: "2" } });
    try {
      const { generateApiKey } = await import("../../src/domain/api-keys.ts");
      const second = generateApiKey();
      await gw.store.createApiKey({ id: second.id, orgId: gw.orgId, name: null, hash: second.hash, nowMs: Date.now() });
      assert.equal((await gw.decide(sampleRequest())).status, 200);
      assert.equal((await gw.decide(sampleRequest(), { authorization: `Bearer ${second.raw}`, "x-tds-source": "playground" })).status, 200);
      assert.equal((await gw.decide(sampleRequest(), { authorization: `Bearer ${second.raw}` })).status, 429);
      const other = await gw.newOrg("other");
      assert.equal((await gw.decide(sampleRequest(), { authorization: `Bearer ${other.key}` })).status, 200);
    } finally {
      await gw.close();
    }
  });
});

describe("every authenticated request counts", () => {
  test("invalid bodies (422) use up the per-minute limit like valid ones; the 429 comes before the body is read (no 413)", async () => {
    const gw = await startGateway({ env: { TDS_REQUESTS_PER_MINUTE: "3", TDS_MAX_REQUEST_BYTES: "4096" } });
    try {
      for (let i = 0; i < 3; i++) await errorBody(await gw.decide({ state: 1, questions: { q: { type: "nope" } } }), 422);
      const limited = await gw.decide(sampleRequest());
      assert.match((await errorBody(limited, 429)).detail, /requests_per_minute = 3/);
      assert.equal(limited.headers.get("retry-after"), "60");
      // Over the byte limit too: refused for the rate before anything is read, so 429, not 413.
      await errorBody(await gw.decide("x".repeat(100_000)), 429);
      assert.equal(gw.fake!.calls.decide, 0);
      assert.equal((await gw.store.listUsage(gw.orgId, { limit: 10 })).records.length, 0, "nothing recorded for rejected requests");
      // A 401 is not counted against anyone.
      await errorBody(await gw.decide(sampleRequest(), { authorization: `Bearer tds_aaaaaaaaaaaa_${"a".repeat(43)}` }), 401);
    } finally {
      await gw.close();
    }
  });

  test("usage reads have a per-minute limit of their own, apart from decisions", async () => {
    const gw = await startGateway({ env: { TDS_REQUESTS_PER_MINUTE: "2", TDS_READ_REQUESTS_PER_MINUTE: "3" } });
    try {
      assert.equal((await gw.get("/v1/usage")).status, 200);
      assert.equal((await gw.get("/v1/usage/summary")).status, 200);
      assert.equal((await gw.get("/v1/organization")).status, 200);
      const limited = await gw.get("/v1/usage?limit=1");
      assert.match((await errorBody(limited, 429)).detail, /usage read limit.*read_requests_per_minute = 3/);
      assert.ok(Number(limited.headers.get("retry-after")) > 0);
      assert.equal((await gw.decide(sampleRequest())).status, 200, "decisions keep their own limit");
      const config = (await (await fetch(`${gw.url}/api/config`)).json()) as { limits: { read_requests_per_minute: number } };
      assert.equal(config.limits.read_requests_per_minute, 3);
    } finally {
      await gw.close();
    }
  });
});

describe("preview daily quotas", () => {
  test("reset at 00:00:00.000 UTC for the organization and the service; Playground and API share the counters", async () => {
    const clock = new FixedClock(Date.parse("2026-11-26T23:59:59.000Z"));
    const gw = await startGateway({
      clock,
      env: { TDS_PREVIEW_REQUEST_LIMIT: "2", TDS_PREVIEW_GLOBAL_REQUEST_LIMIT: "3", TDS_REQUESTS_PER_MINUTE: "1000" },
    });
    try {
      const b = await gw.newOrg("org-b");
      const asB = { authorization: `Bearer ${b.key}` };
      assert.equal((await gw.decide(sampleRequest())).status, 200);
      assert.equal((await gw.decide(sampleRequest(), { "x-tds-source": "playground" })).status, 200);
      const orgFull = await gw.decide(sampleRequest());
      assert.match((await errorBody(orgFull, 429)).detail, /preview_request_limit = 2/);
      assert.equal(orgFull.headers.get("retry-after"), "1", "until midnight UTC");
      assert.equal(orgFull.headers.get("retry-after-ms"), "1000");

      assert.equal((await gw.decide(sampleRequest(), asB)).status, 200);
      const globalFull = await gw.decide(sampleRequest(), asB);
      assert.match((await errorBody(globalFull, 429)).detail, /preview_global_request_limit = 3/);

      clock.set(Date.parse("2026-11-26T23:59:59.999Z"));
      assert.equal((await gw.decide(sampleRequest())).status, 429);
      assert.equal((await gw.decide(sampleRequest(), asB)).status, 429);

      clock.set(Date.parse("2026-11-27T00:00:00.000Z"));
      assert.equal((await gw.decide(sampleRequest(), { "x-tds-source": "playground" })).status, 200);
      assert.equal((await gw.decide(sampleRequest(), asB)).status, 200);
      assert.deepEqual(await gw.store.previewUsage(gw.orgId, "2026-11-27"), { org: 1, global: 2 });
      assert.deepEqual(await gw.store.previewUsage(gw.orgId, "2026-11-26"), { org: 2, global: 3 });

      const records = (await gw.store.listUsage(gw.orgId, { limit: 10 })).records;
      assert.deepEqual(records.map((r) => r.source).sort(), ["api", "playground", "playground"]);
    } finally {
      await gw.close();
    }
  });

  test("accepted requests that fail still consume quota; requests rejected before acceptance do not", async () => {
    const gw = await startGateway({ env: { TDS_PREVIEW_REQUEST_LIMIT: "3" } });
    try {
      const day = new Date().toISOString().slice(0, 10);
      await (await gw.decide({ state: 1 })).text(); // 422 validation
      await (await gw.decide({ ...sampleRequest(), model: "nope" })).text(); // 422 unknown model
      await (await gw.decide(sampleRequest(), { authorization: "Bearer x" })).text(); // 401
      assert.equal((await gw.store.previewUsage(gw.orgId, day)).org, 0);
      assert.equal((await gw.decide(sampleRequest({ state: { fake_behavior: "status:503" } }))).status, 502);
      assert.equal((await gw.decide(sampleRequest({ state: { fake_behavior: "context-rejected" } }))).status, 422);
      assert.equal((await gw.store.previewUsage(gw.orgId, day)).org, 2);
      assert.equal((await gw.decide(sampleRequest())).status, 200);
      assert.equal((await gw.decide(sampleRequest())).status, 429);
    } finally {
      await gw.close();
    }
  });
});
