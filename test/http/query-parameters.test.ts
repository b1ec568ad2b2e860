/**
 * The query parameters the schemas admit as text and the routes read (`src/http/query.ts`): their values, their
 * defaults, and the one 422 answer of a value out of range on every route that reads them.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { USAGE_SUMMARY_DEFAULT_DAYS, USAGE_SUMMARY_MAX_DAYS } from "../../src/contract/organization.ts";
import { ServiceError } from "../../src/domain/errors.ts";
import { DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT } from "../../src/domain/paging.ts";
import { intInRange, isoTime, pageQuery, summaryDays, usageListQuery } from "../../src/http/query.ts";
import { errorBody } from "../support/contract-check.ts";
import { type Gateway, startGateway } from "../support/gateway-harness.ts";

const ADMIN_TOKEN = "adm-7Yq2pVx9Lr4Tz8Kw1Nc6Hs3Bd5Fg0Jm";

/** The refusal of one query parameter, as the routes throw it. */
function refusal(field: string, message: string) {
  return (err: unknown) => {
    assert.ok(err instanceof ServiceError);
    assert.deepEqual([err.code, err.status, err.detail, err.extra], ["invalid_query", 422, undefined, { errors: [{ field, message }] }]);
    return true;
  };
}

describe("query parameters", () => {
  test("a whole number in range, its fallback when absent", () => {
    const range = { min: 1, max: 9, fallback: 4 };
    assert.equal(intInRange("n", undefined, range), 4);
    assert.equal(intInRange("n", "1", range), 1);
    assert.equal(intInRange("n", "009", range), 9);
    for (const bad of ["0", "10", "", "abc", "1.5", "-1"])
      assert.throws(() => intInRange("n", bad, range), refusal("query.n", "must be from 1 to 9"), bad);
  });

  test("a page: limit 1 to MAX_PAGE_LIMIT (DEFAULT_PAGE_LIMIT when absent), the cursor only when not empty", () => {
    assert.deepEqual([MAX_PAGE_LIMIT, DEFAULT_PAGE_LIMIT], [200, 50]);
    assert.deepEqual(pageQuery({}), { limit: DEFAULT_PAGE_LIMIT });
    assert.deepEqual(pageQuery({ limit: "200", cursor: "c1" }), { limit: 200, cursor: "c1" });
    assert.deepEqual(pageQuery({ limit: "1", cursor: "" }), { limit: 1 });
    for (const bad of ["0", "201", "999"])
      assert.throws(() => pageQuery({ limit: bad }), refusal("query.limit", "must be from 1 to 200"), bad);
  });

  test("the summary's days: 1 to 31, 14 when absent", () => {
    assert.deepEqual([USAGE_SUMMARY_MAX_DAYS, USAGE_SUMMARY_DEFAULT_DAYS], [31, 14]);
    assert.equal(summaryDays(undefined), 14);
    assert.equal(summaryDays("31"), 31);
    for (const bad of ["0", "32", "99"]) assert.throws(() => summaryDays(bad), refusal("query.days", "must be from 1 to 31"), bad);
  });

  test("a time in ISO 8601; the usage listing's query with every filter", () => {
    assert.equal(isoTime("from", undefined), undefined);
    assert.equal(isoTime("from", "2026-11-26T00:00:00Z"), Date.UTC(2026, 10, 26));
    assert.throws(() => isoTime("to", "yesterday"), refusal("query.to", "must be an ISO-8601 time such as 2026-11-26T00:00:00Z"));
    assert.deepEqual(usageListQuery({}), { limit: 50 });
    assert.deepEqual(
      usageListQuery({ limit: "7", cursor: "c", from: "2026-11-26T00:00:00Z", to: "2026-11-27T00:00:00Z", outcome: "succeeded" }),
      { limit: 7, cursor: "c", fromMs: Date.UTC(2026, 10, 26), toMs: Date.UTC(2026, 10, 27), outcome: "succeeded" },
    );
    assert.throws(() => usageListQuery({ limit: "201", from: "x" }), refusal("query.limit", "must be from 1 to 200"), "limit first");
  });
});

describe("query parameters out of range, on every route that reads them", () => {
  let gw: Gateway;
  before(async () => {
    gw = await startGateway({ env: { TDS_ADMIN_TOKEN: ADMIN_TOKEN } });
  });
  after(async () => {
    await gw?.close();
  });

  const limit = { field: "query.limit", message: "must be from 1 to 200" };
  const days = { field: "query.days", message: "must be from 1 to 31" };
  const from = { field: "query.from", message: "must be an ISO-8601 time such as 2026-11-26T00:00:00Z" };
  const cases: Array<[string, boolean, { field: string; message: string }]> = [
    ["/v1/usage?limit=201", false, limit],
    ["/v1/usage?limit=0", false, limit],
    ["/v1/usage?from=yesterday", false, from],
    ["/v1/usage/summary?days=32", false, days],
    ["/admin/v1/organizations?limit=201", true, limit],
    ["/admin/v1/organizations/test-org/usage?limit=0", true, limit],
    ["/admin/v1/organizations/test-org/usage?to=tomorrow", true, { ...from, field: "query.to" }],
    ["/admin/v1/usage/summary?days=0", true, days],
    ["/admin/v1/audit?limit=201", true, limit],
  ];
  for (const [path, admin, error] of cases) {
    test(path, async () => {
      const headers = admin ? { authorization: `Bearer ${ADMIN_TOKEN}` } : { authorization: `Bearer ${gw.key}` };
      const body = await errorBody(await fetch(`${gw.url}${path}`, { headers }), 422);
      assert.deepEqual(body, { detail: `Invalid request body: ${error.field}: ${error.message}`, errors: [error] });
    });
  }
});
