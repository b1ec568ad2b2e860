/**
 * The batch API through a real listening gateway on SQLite, with batches left queued (runBatches: false): submissions
 * streamed as NDJSON, checked line by line and refused whole; reads, paging, results and cancel scoped to the
 * organization; Idempotency-Key replays; and no upload left behind by a refusal or a client that goes away.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { request } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type Database from "better-sqlite3";
import { Batch, BatchList, BatchResultLine } from "../../src/contract/batches.ts";
import { compileSchema } from "../../src/contract/validation.ts";
import { startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { errorBody, fields, json } from "../support/contract-check.ts";
import { type Gateway, sampleRequest, startGateway } from "../support/gateway-harness.ts";
import { eventually } from "../support/timer-race.ts";

const validBatch = compileSchema<Batch>(Batch);
const validList = compileSchema<BatchList>(BatchList);
const validResultLine = compileSchema(BatchResultLine);

/** NDJSON of one sample request per custom_id. */
function ndjson(...customIds: string[]): string {
  return customIds.map((id) => JSON.stringify({ custom_id: id, ...sampleRequest() })).join("\n");
}

function submit(
  gw: Gateway,
  body: string | ReadableStream<Uint8Array>,
  options: { key?: string; path?: string; headers?: Record<string, string> } = {},
) {
  return fetch(`${gw.url}${options.path ?? "/v1/batches"}`, {
    method: "POST",
    headers: { authorization: `Bearer ${options.key ?? gw.key}`, "content-type": "application/x-ndjson", ...options.headers },
    body,
    ...(typeof body === "string" ? {} : { duplex: "half" }),
  } as RequestInit);
}

/** A body sent chunked (no Content-Length): the limits must be found while it streams. */
function chunked(text: string, pieceBytes = 512): ReadableStream<Uint8Array> {
  const bytes = new TextEncoder().encode(text);
  let at = 0;
  return new ReadableStream({
    pull(controller) {
      if (at >= bytes.length) return controller.close();
      controller.enqueue(bytes.slice(at, at + pieceBytes));
      at += pieceBytes;
    },
  });
}

async function batchOf(res: Response, status = 202): Promise<Batch> {
  const text = await res.text();
  assert.equal(res.status, status, text);
  const body = JSON.parse(text);
  assert.ok(validBatch(body), JSON.stringify(validBatch.errors));
  return body;
}

function withKey(key: string) {
  return { authorization: `Bearer ${key}` };
}

/** The batches rows of the gateway's SQLite file, uploads being read included. */
function batchRows(gw: Gateway): { id: string; status: string }[] {
  const db = (gw.store as unknown as { db: Database.Database }).db;
  return db.prepare("SELECT id, status FROM batches").all() as { id: string; status: string }[];
}

async function resultLines(gw: Gateway, id: string): Promise<{ text: string; lines: Record<string, unknown>[] }> {
  const res = await gw.get(`/v1/batches/${id}/results`);
  const text = await res.text();
  assert.equal(res.status, 200, text);
  assert.equal(res.headers.get("content-type"), "application/x-ndjson; charset=utf-8");
  const lines =
    text === ""
      ? []
      : text
          .replace(/\n$/, "")
          .split("\n")
          .map((l) => JSON.parse(l));
  for (const line of lines) assert.ok(validResultLine(line), JSON.stringify(validResultLine.errors));
  return { text, lines };
}

describe("batch API", () => {
  let gw: Gateway;
  before(async () => {
    gw = await startGateway({
      runBatches: false,
      env: { TDS_MAX_BATCH_REQUESTS: "5", TDS_MAX_BATCH_BYTES: "16384", TDS_MAX_REQUEST_BYTES: "4096" },
    });
  });
  after(async () => {
    await gw?.close();
  });

  test("a submission of 3 lines is queued; it is read back alone and in the list", async () => {
    const batch = await batchOf(await submit(gw, ndjson("a", "b", "c"), { path: "/v1/batches?model=fake-small" }));
    assert.match(batch.id, /^batch_[a-z0-9]{24}$/);
    assert.equal(batch.status, "queued");
    assert.equal(batch.model, "fake-small");
    assert.deepEqual(batch.request_counts, { total: 3, succeeded: 0, failed: 0 });
    assert.deepEqual([batch.cost_microusd, batch.cost_usd, batch.started_at, batch.ended_at], [0, "0", null, null]);
    const window = Date.parse(batch.expires_at) - Date.parse(batch.created_at);
    assert.equal(window, gw.config.batches.completionWindowMs);

    assert.deepEqual(await batchOf(await gw.get(`/v1/batches/${batch.id}`), 200), batch);
    const list = await json(await gw.get("/v1/batches"));
    assert.ok(validList(list), JSON.stringify(validList.errors));
    assert.ok(list.data.some((b: Batch) => b.id === batch.id));
    assert.deepEqual((await resultLines(gw, batch.id)).lines, [], "no request has finished");
    await gw.store.batches.cancelBatch(gw.orgId, batch.id, Date.now());

    const jsonl = await batchOf(await submit(gw, ndjson("j"), { headers: { "content-type": "application/jsonl; charset=utf-8" } }));
    assert.equal(jsonl.model, null);
    await gw.store.batches.cancelBatch(gw.orgId, jsonl.id, Date.now());
  });

  test("the list is newest first with cursor paging; unknown query fields are refused", async () => {
    const org = await gw.newOrg("pager");
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push((await batchOf(await submit(gw, ndjson(`p${i}`), { key: org.key }))).id);
    const seen: string[] = [];
    let cursor: string | null = null;
    do {
      const url = `${gw.url}/v1/batches?limit=2${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`;
      const page: { data: Batch[]; next_cursor: string | null } = await json(await fetch(url, { headers: withKey(org.key) }));
      assert.ok(page.data.length <= 2);
      seen.push(...page.data.map((b) => b.id));
      cursor = page.next_cursor;
    } while (cursor !== null);
    assert.deepEqual(seen, [...ids].reverse());

    const unknown = await errorBody(await fetch(`${gw.url}/v1/batches?limit=2&status=queued`, { headers: withKey(org.key) }), 422);
    assert.ok(
      fields(unknown).some((f) => f.startsWith("query")),
      JSON.stringify(unknown),
    );
    await errorBody(await fetch(`${gw.url}/v1/batches?limit=0`, { headers: withKey(org.key) }), 422);
    await errorBody(await submit(gw, ndjson("x"), { key: org.key, path: "/v1/batches?modle=fake-small" }), 422);
    assert.equal(
      (await json(await fetch(`${gw.url}/v1/batches`, { headers: withKey(org.key) }))).data.length,
      3,
      "nothing queued by the refusal",
    );
  });

  test("results list finished requests in input order with their bodies verbatim; cancel ends the rest", async () => {
    const batch = await batchOf(await submit(gw, ndjson("first", "second", "third")));
    const now = Date.now();
    const claimed = await gw.store.batches.claimRequests({ instanceId: "test", nowMs: now, leaseUntilMs: now + 60_000, limit: 100 });
    const mine = claimed.filter((c) => c.batchId === batch.id).sort((x, y) => x.position - y.position);
    assert.deepEqual(
      mine.map((c) => c.customId),
      ["first", "second", "third"],
    );
    // Finished out of order: the third, then the first; the second is still running.
    const bodies = ['{"answers":  {"q": "x"},\t"note": "kept as written"}', '{ "detail" : "Model failed." }'];
    assert.equal(
      await gw.store.batches.finishRequest({ ...ref(mine[2]!), status: 200, body: bodies[0]!, costMicrousd: 1500, nowMs: now }),
      true,
    );
    assert.equal(
      await gw.store.batches.finishRequest({ ...ref(mine[0]!), status: 502, body: bodies[1]!, costMicrousd: 0, nowMs: now }),
      true,
    );

    const partial = await resultLines(gw, batch.id);
    assert.deepEqual(
      partial.lines.map((l) => [l.custom_id, l.request_id, l.status]),
      [
        ["first", mine[0]!.requestId, 502],
        ["third", mine[2]!.requestId, 200],
      ],
    );
    assert.equal(
      partial.text,
      `{"custom_id":"first","request_id":"${mine[0]!.requestId}","status":502,"body":${bodies[1]}}\n` +
        `{"custom_id":"third","request_id":"${mine[2]!.requestId}","status":200,"body":${bodies[0]}}\n`,
    );
    const running = await batchOf(await gw.get(`/v1/batches/${batch.id}`), 200);
    assert.equal(running.status, "running");
    assert.deepEqual(running.request_counts, { total: 3, succeeded: 1, failed: 1 });
    assert.deepEqual([running.cost_microusd, running.cost_usd], [1500, "0.0015"]);

    // Cancel: the running second request keeps its claim and ends the batch when it finishes.
    const cancelling = await batchOf(
      await fetch(`${gw.url}/v1/batches/${batch.id}/cancel`, { method: "POST", headers: withKey(gw.key) }),
      200,
    );
    assert.equal(cancelling.status, "cancelling");
    await gw.store.batches.finishRequest({ ...ref(mine[1]!), status: 200, body: "{}", costMicrousd: 0, nowMs: Date.now() });
    const ended = await batchOf(await gw.get(`/v1/batches/${batch.id}`), 200);
    assert.equal(ended.status, "cancelled");
    assert.ok(ended.ended_at !== null);
  });

  test("a queued batch cancelled: one batch_cancelled line per request, never run", async () => {
    const batch = await batchOf(await submit(gw, ndjson("c1", "c2", "c3", "c4")));
    const cancelled = await batchOf(
      await fetch(`${gw.url}/v1/batches/${batch.id}/cancel`, { method: "POST", headers: withKey(gw.key) }),
      200,
    );
    assert.equal(cancelled.status, "cancelled");
    assert.deepEqual(cancelled.request_counts, { total: 4, succeeded: 0, failed: 4 });
    const { lines } = await resultLines(gw, batch.id);
    assert.deepEqual(
      lines.map((l) => [l.custom_id, l.request_id, l.status]),
      ["c1", "c2", "c3", "c4"].map((id) => [id, null, 409]),
    );
    for (const line of lines) assert.match((line.body as { detail: string }).detail, /cancelled/);
    const again = await batchOf(await fetch(`${gw.url}/v1/batches/${batch.id}/cancel`, { method: "POST", headers: withKey(gw.key) }), 200);
    assert.equal(again.status, "cancelled");
  });

  describe("refused submissions queue nothing", () => {
    let org: { orgId: string; key: string };
    before(async () => {
      org = await gw.newOrg("refused");
    });
    const listEmpty = async () => {
      assert.deepEqual((await json(await fetch(`${gw.url}/v1/batches`, { headers: withKey(org.key) }))).data, []);
      assert.deepEqual(
        batchRows(gw).filter((b) => b.status === "validating"),
        [],
        "no upload left",
      );
    };

    test("an invalid line and a repeated custom_id: 422 naming the lines", async () => {
      const body = [
        JSON.stringify({ custom_id: "a", ...sampleRequest() }),
        "",
        JSON.stringify({ custom_id: "b", ...sampleRequest({ questions: "none" }) }),
        "{not json",
        JSON.stringify({ custom_id: "a", ...sampleRequest() }),
      ].join("\n");
      const err = await errorBody(await submit(gw, body, { key: org.key }), 422);
      const named = fields(err);
      assert.ok(named.includes("line 3: questions"), JSON.stringify(err));
      assert.ok(named.includes("line 4"), JSON.stringify(err));
      assert.ok(named.includes("line 5: custom_id"), JSON.stringify(err));
      assert.match(err.detail, /Nothing was queued/);
      await listEmpty();
    });

    test("more lines than max_batch_requests: 422; an empty body: 422", async () => {
      const err = await errorBody(await submit(gw, ndjson("1", "2", "3", "4", "5", "6", "7"), { key: org.key }), 422);
      assert.ok(
        err.errors?.some((e) => e.field === "line 6" && /max_batch_requests/.test(e.message)),
        JSON.stringify(err),
      );
      await errorBody(await submit(gw, "\n\n", { key: org.key }), 422);
      await listEmpty();
    });

    test("over max_batch_bytes: 413, by Content-Length and while streaming", async () => {
      const big = ndjson(...Array.from({ length: 20 }, (_, i) => `big${i}`));
      assert.ok(Buffer.byteLength(big) > gw.config.batches.maxBytes);
      assert.match((await errorBody(await submit(gw, big, { key: org.key }), 413)).detail, /max_batch_bytes/);
      assert.match((await errorBody(await submit(gw, chunked(big), { key: org.key }), 413)).detail, /max_batch_bytes/);
      await listEmpty();
    });

    test("a line over max_request_bytes: 413 naming it", async () => {
      const long = JSON.stringify({ custom_id: "long", ...sampleRequest({ state: { text: "x".repeat(5000) } }) });
      const body = `${ndjson("ok")}\n${long}\n${ndjson("after")}`;
      const err = await errorBody(await submit(gw, chunked(body), { key: org.key }), 413);
      assert.match(err.detail, /Line 2 .*max_request_bytes/);
      await listEmpty();
    });

    test("another media type or charset: 422 unsupported_media_type", async () => {
      const json422 = await errorBody(
        await submit(gw, ndjson("a"), { key: org.key, headers: { "content-type": "application/json" } }),
        422,
      );
      assert.match(json422.detail, /application\/x-ndjson/);
      await errorBody(
        await submit(gw, ndjson("a"), { key: org.key, headers: { "content-type": "application/x-ndjson; charset=latin1" } }),
        422,
      );
      await listEmpty();
    });

    test("a client that goes away mid-upload leaves no batch", async () => {
      const { hostname, port } = new URL(gw.url);
      const req = request({
        host: hostname,
        port,
        method: "POST",
        path: "/v1/batches",
        headers: { authorization: `Bearer ${org.key}`, "content-type": "application/x-ndjson", "transfer-encoding": "chunked" },
      });
      req.on("error", () => {});
      req.write(`${ndjson("u1", "u2")}\n`);
      await eventually("the upload to begin", () => (batchRows(gw).some((b) => b.status === "validating") ? true : undefined));
      req.destroy();
      await eventually("the upload to be dropped", () => (batchRows(gw).some((b) => b.status === "validating") ? undefined : true));
      await listEmpty();
    });
  });

  test("Idempotency-Key: the same body and model answer the same batch, another body or model 422", async () => {
    const headers = { "idempotency-key": "batch-key-1" };
    const first = await submit(gw, ndjson("i1", "i2"), { headers });
    assert.equal(first.headers.get("idempotent-replayed"), null);
    const batch = await batchOf(first);
    const again = await submit(gw, ndjson("i1", "i2"), { headers });
    assert.equal(again.headers.get("idempotent-replayed"), "true");
    assert.equal((await batchOf(again)).id, batch.id);
    const other = await errorBody(await submit(gw, ndjson("i1", "i3"), { headers }), 422);
    assert.match(other.detail, /Idempotency-Key/);
    const otherModel = await errorBody(await submit(gw, ndjson("i1", "i2"), { headers, path: "/v1/batches?model=fake-small" }), 422);
    assert.match(otherModel.detail, /Idempotency-Key/);
    assert.equal(batchRows(gw).filter((b) => b.id !== batch.id && b.status === "validating").length, 0);
    await gw.store.batches.cancelBatch(gw.orgId, batch.id, Date.now());
  });

  test("another organization's batch is not found; no key is 401; a paused organization cannot submit", async () => {
    const batch = await batchOf(await submit(gw, ndjson("mine")));
    const other = await gw.newOrg("outsider");
    for (const [method, path] of [
      ["GET", `/v1/batches/${batch.id}`],
      ["GET", `/v1/batches/${batch.id}/results`],
      ["POST", `/v1/batches/${batch.id}/cancel`],
    ] as const) {
      const err = await errorBody(await fetch(`${gw.url}${path}`, { method, headers: withKey(other.key) }), 404);
      assert.match(err.detail, new RegExp(batch.id), path);
    }
    await errorBody(await gw.get("/v1/batches/batch_unknown"), 404);
    assert.deepEqual((await json(await fetch(`${gw.url}/v1/batches`, { headers: withKey(other.key) }))).data, []);
    assert.equal((await batchOf(await gw.get(`/v1/batches/${batch.id}`), 200)).status, "queued", "the outsider's cancel did nothing");

    const noKey = await fetch(`${gw.url}/v1/batches`, {
      method: "POST",
      headers: { "content-type": "application/x-ndjson" },
      body: ndjson("a"),
    });
    await errorBody(noKey, 401);
    await errorBody(await fetch(`${gw.url}/v1/batches`), 401);

    await gw.store.setOrganizationPaused(other.orgId, true);
    await errorBody(await submit(gw, ndjson("p"), { key: other.key }), 403);
    assert.deepEqual((await json(await fetch(`${gw.url}/v1/batches`, { headers: withKey(other.key) }))).data, []);
    await gw.store.batches.cancelBatch(gw.orgId, batch.id, Date.now());
  });

  test("the five operations are in /openapi.json with their NDJSON bodies", async () => {
    const doc = await json(await fetch(`${gw.url}/openapi.json`));
    const submitOp = doc.paths["/v1/batches"].post;
    assert.equal(submitOp.requestBody.content["application/x-ndjson"].schema.title, "BatchRequestLine");
    assert.equal(submitOp.responses["202"].content["application/json"].schema.title, "Batch");
    assert.ok(submitOp.responses["413"] && submitOp.responses["422"] && submitOp.responses["401"]);
    assert.ok(submitOp.parameters.some((p: { name: string }) => p.name === "model"));
    assert.ok(submitOp.parameters.some((p: { name: string }) => p.name === "idempotency-key"));
    assert.equal(doc.paths["/v1/batches"].get.responses["200"].content["application/json"].schema.title, "BatchList");
    assert.equal(doc.paths["/v1/batches/{id}"].get.responses["404"].content["application/json"].schema.title, "ErrorResponse");
    const results = doc.paths["/v1/batches/{id}/results"].get;
    assert.equal(results.responses["200"].content["application/x-ndjson"].schema.title, "BatchResultLine");
    assert.equal(doc.paths["/v1/batches/{id}/cancel"].post.responses["200"].content["application/json"].schema.title, "Batch");
  });
});

/** A small valid line (about 120 bytes). */
function smallLine(customId: string): string {
  return JSON.stringify({ custom_id: customId, state: { n: customId }, questions: { r: { type: "noul", instructions: "Refund?" } } });
}

describe("batches of more requests than one store call or one results page", () => {
  let gw: Gateway;
  before(async () => {
    gw = await startGateway({ runBatches: false, env: { TDS_MAX_BATCH_REQUESTS: "2500" } });
  });
  after(async () => {
    await gw?.close();
  });

  test("2100 lines are queued in order; once cancelled, the results stream all 2100 in input order", async () => {
    const ids = Array.from({ length: 2100 }, (_, i) => `r${i}`);
    const batch = await batchOf(await submit(gw, chunked(ids.map(smallLine).join("\r\n"), 4096)));
    assert.deepEqual(batch.request_counts, { total: 2100, succeeded: 0, failed: 0 });
    await gw.store.batches.cancelBatch(gw.orgId, batch.id, Date.now());
    const { lines } = await resultLines(gw, batch.id);
    assert.deepEqual(
      lines.map((l) => l.custom_id),
      ids,
    );
  });

  test("a custom_id repeated after the first 1000 lines: 422 naming the line, and the lines written are dropped", async () => {
    const ids = Array.from({ length: 1500 }, (_, i) => (i === 1400 ? "d5" : `d${i}`));
    const err = await errorBody(await submit(gw, ids.map(smallLine).join("\n")), 422);
    assert.deepEqual(fields(err), ["line 1401: custom_id"]);
    assert.deepEqual(
      batchRows(gw).filter((b) => b.status === "validating"),
      [],
    );
  });
});

describe("a submission counts against the per-minute request limit", () => {
  test("the second within the minute is 429; reads are limited apart", async () => {
    const gw = await startGateway({ runBatches: false, env: { TDS_REQUESTS_PER_MINUTE: "1" } });
    try {
      await batchOf(await submit(gw, ndjson("one")));
      const limited = await submit(gw, ndjson("two"));
      await errorBody(limited, 429);
      assert.ok(limited.headers.get("retry-after"));
      assert.equal((await json(await gw.get("/v1/batches"))).data.length, 1);
    } finally {
      await gw.close();
    }
  });
});

describe("?model= with models named in the configuration", () => {
  test("an unknown model is refused (422) without asking the model service", async () => {
    const fake = await startFakeModelServer();
    const dir = mkdtempSync(join(tmpdir(), "tds-batch-models-"));
    const config = join(dir, "config.json");
    writeFileSync(
      config,
      JSON.stringify({
        model_services: [{ name: "a", url: fake.url }],
        models: [{ name: "decider", deployments: [{ service: "a", upstream_name: "fake-small" }] }],
      }),
      { mode: 0o600 },
    );
    const gw = await startGateway({ fake: false, runBatches: false, env: { TDS_CONFIG: config } });
    try {
      const err = await errorBody(await submit(gw, ndjson("a"), { path: "/v1/batches?model=nope" }), 422);
      assert.deepEqual(fields(err), ["query.model"]);
      assert.match(err.detail, /nope/);
      const batch = await batchOf(await submit(gw, ndjson("a"), { path: "/v1/batches?model=decider" }));
      assert.equal(batch.model, "decider");
      assert.equal(fake.calls.models, 0);
      assert.equal(fake.calls.decide, 0);
    } finally {
      await gw.close();
      await fake.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

function ref(claim: { batchId: string; position: number; requestId: string }) {
  return { batchId: claim.batchId, position: claim.position, requestId: claim.requestId };
}
