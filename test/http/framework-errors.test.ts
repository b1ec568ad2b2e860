/**
 * Requests refused by Fastify or Node before any route runs (an overlong path parameter, oversized headers, a URL that
 * cannot be decoded, malformed HTTP) get the catalogue's status and `{detail}` body through a real listening gateway,
 * and never an echo of what was sent.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { ERROR_CATALOGUE, type ErrorCode } from "../../src/domain/errors.ts";
import { startGateway } from "../support/gateway-harness.ts";
import { bodyOf, exchange, headerOf } from "../support/raw-client.ts";

const MARK = "zq7MARKzq7";

const CASES: { name: string; request: string; code: ErrorCode }[] = [
  {
    name: "a path parameter past maxParamLength",
    request: `GET /v1/usage/${MARK}${"a".repeat(140)} HTTP/1.1\r\nHost: tds.test\r\n\r\n`,
    code: "uri_too_long",
  },
  {
    name: "a 40 KB header",
    request: `GET /healthz HTTP/1.1\r\nHost: tds.test\r\nX-Big: ${MARK}${"b".repeat(40_000)}\r\n\r\n`,
    code: "headers_too_large",
  },
  {
    name: "a path that cannot be percent-decoded",
    request: `GET /v1/usage/${MARK}%E0%A4%A HTTP/1.1\r\nHost: tds.test\r\n\r\n`,
    code: "invalid_url",
  },
  {
    name: "an invalid Content-Length",
    request: `POST /v1/systemone HTTP/1.1\r\nHost: tds.test\r\nContent-Length: ${MARK}\r\n\r\n{}`,
    code: "malformed_http",
  },
  {
    name: "both Content-Length and Transfer-Encoding",
    request: `POST /v1/systemone HTTP/1.1\r\nHost: tds.test\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\nX-Mark: ${MARK}\r\n\r\n{}`,
    code: "malformed_http",
  },
  { name: "a request line that is not HTTP", request: `${MARK} /\r\n\r\n`, code: "malformed_http" },
  {
    name: "a header name with a space",
    request: `GET /healthz HTTP/1.1\r\nHost: tds.test\r\nX ${MARK}: 1\r\n\r\n`,
    code: "malformed_http",
  },
];

test("framework errors answer the catalogue's status and {detail}, echoing nothing of the request", async () => {
  const gw = await startGateway({ fake: false });
  try {
    for (const c of CASES) {
      const { answer, status, socket } = await exchange(gw.url, c.request);
      socket.destroy();
      const entry = ERROR_CATALOGUE[c.code];
      assert.equal(status, entry.status, `${c.name}: ${answer.slice(0, 300)}`);
      assert.equal(headerOf(answer, "content-type"), "application/json; charset=utf-8", c.name);
      const body = JSON.parse(bodyOf(answer)) as Record<string, unknown>;
      assert.deepEqual(Object.keys(body), ["detail"], c.name);
      assert.ok(String(body.detail).startsWith(entry.detail.replace(/\.$/, "")), `${c.name}: ${body.detail}`);
      assert.ok(!answer.includes(MARK), `${c.name}: the answer echoes the request: ${answer.slice(0, 300)}`);
      assert.ok(!answer.includes("FST_"), `${c.name}: Fastify's own error code leaked`);
    }
    const uriTooLong = await exchange(gw.url, CASES[0]!.request);
    uriTooLong.socket.destroy();
    assert.match(JSON.parse(bodyOf(uriTooLong.answer)).detail, /at most 100 characters/);
    assert.match(headerOf(uriTooLong.answer, "x-service-request-id") ?? "", /^req_/, "the request id is sent as on every answer");
    const headers = await exchange(gw.url, CASES[1]!.request);
    headers.socket.destroy();
    assert.match(JSON.parse(bodyOf(headers.answer)).detail, /at most 16384 bytes/);
    assert.equal((await fetch(`${gw.url}/healthz`)).status, 200, "the server is unaffected");
  } finally {
    await gw.close();
  }
});
