import assert from "node:assert/strict";
import { connect } from "node:net";
import { test } from "node:test";
import { startGateway } from "../support/gateway-harness.ts";

/** Sends raw bytes and collects everything the server answers until it closes the connection. */
function raw(url: string, bytes: string): Promise<string> {
  return new Promise((resolve) => {
    const socket = connect(Number(new URL(url).port), "127.0.0.1");
    let out = "";
    socket.on("data", (d) => (out += d.toString("latin1")));
    socket.on("close", () => resolve(out));
    socket.on("error", () => undefined);
    socket.write(bytes);
    setTimeout(() => socket.destroy(), 2000);
  });
}

test("malformed HTTP framing gets a 400 with the contract's {detail} body", async () => {
  const gw = await startGateway();
  try {
    const answer = await raw(gw.url, "POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}");
    assert.match(answer, /^HTTP\/1\.1 400 /);
    const body = JSON.parse(answer.slice(answer.indexOf("\r\n\r\n") + 4));
    assert.deepEqual(Object.keys(body), ["detail"]);
    assert.match(body.detail, /Malformed HTTP request/);
    assert.equal((await fetch(`${gw.url}/healthz`)).status, 200, "the server is unaffected");
  } finally {
    await gw.close();
  }
});
