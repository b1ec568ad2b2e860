import assert from "node:assert/strict";
import { request } from "node:http";
import { after, before, describe, test } from "node:test";
import { errorBody } from "../support/contract-check.ts";
import { type Gateway, startGateway } from "../support/gateway-harness.ts";

const LIMIT = 2048;

/** A JSON request body of exactly `bytes` UTF-8 bytes (multi-byte characters included). */
function bodyOfBytes(bytes: number): Buffer {
  const head = '{"state":"';
  const tail = '","questions":{"q":{"type":"noul"}}}';
  const room = bytes - Buffer.byteLength(head + tail);
  const filler = "é".repeat(Math.floor(room / 2)) + "a".repeat(room % 2);
  const body = Buffer.from(head + filler + tail);
  assert.equal(body.length, bytes);
  return body;
}

/** Sends the body in chunks without Content-Length; resolves with status, body and bytes the client wrote. */
function sendChunked(url: string, key: string, chunks: Buffer[]): Promise<{ status: number; body: string; written: number }> {
  return new Promise((resolve, reject) => {
    const req = request(`${url}/v1/systemone`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json", "transfer-encoding": "chunked" },
    });
    let written = 0;
    req.on("response", (res) => {
      let body = "";
      res.on("data", (d) => (body += d));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body, written }));
    });
    req.on("error", reject);
    (async () => {
      for (const chunk of chunks) {
        if (req.destroyed) return;
        req.write(chunk);
        written += chunk.length;
        await new Promise((r) => setTimeout(r, 2));
      }
      req.end();
    })();
  });
}

describe("max_request_bytes", () => {
  let gw: Gateway;
  before(async () => {
    gw = await startGateway({ env: { TDS_MAX_REQUEST_BYTES: String(LIMIT) } });
  });
  after(async () => gw.close());

  test("a body of exactly the limit in UTF-8 bytes is accepted", async () => {
    const res = await gw.decide(bodyOfBytes(LIMIT).toString());
    assert.equal(res.status, 200, await res.text());
  });

  test("one byte over with Content-Length is 413 and the model is never called", async () => {
    const calls = gw.fake!.calls.decide;
    const body = await errorBody(await gw.decide(bodyOfBytes(LIMIT + 1).toString()), 413);
    assert.match(body.detail, /max_request_bytes \(2048/);
    assert.equal(gw.fake!.calls.decide, calls);
  });

  test("one byte over, chunked without Content-Length, is 413", async () => {
    const body = bodyOfBytes(LIMIT + 1);
    const chunks = [body.subarray(0, 1000), body.subarray(1000, 2000), body.subarray(2000)];
    const res = await sendChunked(gw.url, gw.key, chunks);
    assert.equal(res.status, 413, res.body);
    assert.match(JSON.parse(res.body).detail, /max_request_bytes/);
  });

  test("a chunked body at the limit is accepted", async () => {
    const body = bodyOfBytes(LIMIT);
    const res = await sendChunked(gw.url, gw.key, [body.subarray(0, 700), body.subarray(700)]);
    assert.equal(res.status, 200, res.body);
  });

  test("a huge chunked upload is cut off near the limit, not buffered", async () => {
    const chunk = Buffer.alloc(64 * 1024, 0x61);
    const chunks = [Buffer.from('{"state":"'), ...Array.from({ length: 64 }, () => chunk)];
    const res = await sendChunked(gw.url, gw.key, chunks).catch((err) => ({ status: -1, body: String(err), written: 0 }));
    // Either the 413 arrives or the server closes the socket after answering; it never reads 4 MiB.
    if (res.status !== -1) assert.equal(res.status, 413);
    const usage = await gw.store.listUsage(gw.orgId, { limit: 200 });
    assert.ok(usage.records.every((r) => r.outcome === "succeeded"));
  });

  test("the unauthenticated get 401 before the body is looked at", async () => {
    const res = await fetch(`${gw.url}/v1/systemone`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: bodyOfBytes(LIMIT + 100),
    });
    await errorBody(res, 401);
  });
});
