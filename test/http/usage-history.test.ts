import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { UsagePageJson, UsageRecordJson } from "../../src/contract/usage.ts";
import { compileSchema } from "../../src/contract/validation.ts";
import { errorBody, json } from "../support/contract-check.ts";
import { FixedClock } from "../support/fixed-clock.ts";
import { sampleRequest, startGateway } from "../support/gateway-harness.ts";
import { eventually } from "../support/timer-race.ts";

const validRecord = compileSchema<UsageRecordJson>(UsageRecordJson);
const validPage = compileSchema(UsagePageJson);

describe("usage history", () => {
  test("a record is found by request_id as soon as the response arrives, only by its own organization", async () => {
    const gw = await startGateway({ env: { TDS_REQUESTS_PER_MINUTE: "1000" } });
    try {
      const res = await gw.decide(sampleRequest(), { "x-tds-source": "playground" });
      const decision = await json(res);
      const record = await json(await gw.get(`/v1/usage/${decision.request_id}`));
      assert.ok(validRecord(record), JSON.stringify(validRecord.errors));
      assert.equal(record.request_id, decision.request_id);
      assert.equal(record.key_id, gw.keyId);
      assert.equal(record.source, "playground");
      assert.equal(record.outcome, "succeeded");
      assert.equal(record.http_status, 200);
      assert.equal(record.input_tokens, decision.usage.input_tokens);
      assert.equal(record.cost_usd, "0");
      assert.equal(record.model, "fake-small");
      assert.ok(!JSON.stringify(record).includes(gw.key));

      const other = await gw.newOrg("someone-else");
      const foreign = await fetch(`${gw.url}/v1/usage/${decision.request_id}`, { headers: { authorization: `Bearer ${other.key}` } });
      await errorBody(foreign, 404);
      await errorBody(await gw.get("/v1/usage/req_doesnotexist"), 404);
      await errorBody(await fetch(`${gw.url}/v1/usage`), 401);
    } finally {
      await gw.close();
    }
  });

  test("a request still running is found in flight (no status yet), then final once answered", async () => {
    const gw = await startGateway({ env: { TDS_REQUESTS_PER_MINUTE: "1000" } });
    try {
      // The fake model server answers this one 3 s after the call reaches it; the request is admitted (and in flight)
      // by then, so it is listed in flight from that moment until the answer.
      const pending = gw.decide(sampleRequest({ state: { fake_behavior: "delay:3000" } }));
      await eventually("the model call to start", () => (gw.fake!.calls.decide > 0 ? true : undefined));
      const running = (await json(await gw.get("/v1/usage?outcome=in_flight"))).data[0] as Record<string, unknown> | undefined;
      assert.ok(running, "listed in flight while the model works");
      const record = await json(await gw.get(`/v1/usage/${running.request_id}`));
      assert.ok(validRecord(record), JSON.stringify(validRecord.errors));
      assert.deepEqual([record.outcome, record.http_status, record.completed_at, record.cost_microusd], ["in_flight", null, null, 0]);
      const decision = await json(await pending);
      assert.equal(decision.request_id, running.request_id);
      const final = await json(await gw.get(`/v1/usage/${decision.request_id}`));
      assert.deepEqual([final.outcome, final.http_status], ["succeeded", 200]);
      assert.ok(Date.parse(final.completed_at) >= Date.parse(final.created_at));
    } finally {
      await gw.close();
    }
  });

  test("newest first, cursor paging, outcome and time filters", async () => {
    const clock = new FixedClock(Date.parse("2026-11-20T00:00:00Z"));
    const gw = await startGateway({ clock, env: { TDS_REQUESTS_PER_MINUTE: "1000" } });
    try {
      const ids: string[] = [];
      for (let i = 0; i < 7; i++) {
        clock.advance(3_600_000);
        const failing = i % 3 === 2;
        const res = await gw.decide(sampleRequest(failing ? { state: { fake_behavior: "status:500" } } : {}));
        await res.text();
        ids.push(res.headers.get("x-service-request-id")!);
      }
      const seen: string[] = [];
      let cursor: string | null = null;
      do {
        const page: { data: { request_id: string }[]; next_cursor: string | null } = await json(
          await gw.get(`/v1/usage?limit=3${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`),
        );
        assert.ok(validPage(page), JSON.stringify(validPage.errors));
        seen.push(...page.data.map((r) => r.request_id));
        cursor = page.next_cursor;
      } while (cursor);
      assert.deepEqual(seen, [...ids].reverse());

      const failed = await json(await gw.get("/v1/usage?outcome=model_error"));
      assert.deepEqual(
        failed.data.map((r: { request_id: string }) => r.request_id),
        [ids[5], ids[2]],
      );
      const window = await json(await gw.get("/v1/usage?from=2026-11-20T02:00:00Z&to=2026-11-20T04:00:00Z"));
      assert.deepEqual(
        window.data.map((r: { request_id: string }) => r.request_id),
        [ids[2], ids[1]],
      );

      for (const bad of ["limit=0", "limit=201", "limit=abc", "from=yesterday", "outcome=won", "cursor=%21%21", "color=red"]) {
        const body = await errorBody(await gw.get(`/v1/usage?${bad}`), 422);
        assert.ok(body.errors?.[0]?.field.startsWith("query"), `${bad}: ${JSON.stringify(body)}`);
      }
    } finally {
      await gw.close();
    }
  });
});
