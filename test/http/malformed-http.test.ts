import assert from "node:assert/strict";
import { connect } from "node:net";
import { test } from "node:test";
import pino from "pino";
import { eventually } from "../support/books.ts";
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

/** Opens a connection, writes `head` then `trickle` one byte every `everyMs`; resolves with what came back and when it closed. */
function slowClient(
  url: string,
  head: string,
  trickle = "",
  everyMs = 200,
): Promise<{ answer: string; closedAfterMs: number; unsent: number }> {
  return new Promise((resolve) => {
    const started = performance.now();
    const socket = connect(Number(new URL(url).port), "127.0.0.1");
    let out = "";
    let i = 0;
    const timer = setInterval(() => {
      if (i < trickle.length && socket.writable) socket.write(trickle[i++]!);
    }, everyMs);
    socket.on("data", (d) => (out += d.toString("latin1")));
    socket.on("error", () => undefined);
    socket.on("close", () => {
      clearInterval(timer);
      resolve({ answer: out, closedAfterMs: performance.now() - started, unsent: trickle.length - i });
    });
    socket.write(head);
    // A safety net far beyond every deadline of these tests.
    setTimeout(() => socket.destroy(), 20_000).unref();
  });
}

test("deadlines hold: a lying Content-Length, a trickling body and headers that never end are cut off with 408", async () => {
  const gw = await startGateway({ requestTimeoutMs: 2000, headersTimeoutMs: 1000 });
  try {
    const post = (length: number) =>
      `POST /v1/systemone HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${gw.key}\r\nContent-Type: application/json\r\nContent-Length: ${length}\r\n\r\n`;
    const cases = [
      { name: "lying Content-Length", run: slowClient(gw.url, `${post(1000)}{"state":`), deadline: 2000 },
      { name: "trickling body", run: slowClient(gw.url, post(1000), "x".repeat(1000), 100), deadline: 2000 },
      {
        name: "endless headers",
        run: slowClient(gw.url, "POST /v1/systemone HTTP/1.1\r\nHost: x\r\n", "X-Slow: 1\r\n".repeat(100), 100),
        deadline: 1000,
      },
    ];
    for (const c of cases) {
      const { answer, closedAfterMs, unsent } = await c.run;
      // Not before the deadline (a lower bound: a timer never fires early); that the server cut the client off is its
      // 408, sent while the trickling clients still had most of their bytes to send (10 s and 100 s of them).
      assert.ok(closedAfterMs >= c.deadline - 50, `${c.name}: closed after ${closedAfterMs} ms`);
      if (c.name !== "lying Content-Length") assert.ok(unsent > 0, `${c.name}: closed only after the client sent everything`);
      assert.match(answer, /^HTTP\/1\.1 408 /, `${c.name}: ${answer}`);
      assert.match(JSON.parse(answer.slice(answer.indexOf("\r\n\r\n") + 4)).detail, /did not arrive in time/);
    }
    assert.equal((await fetch(`${gw.url}/healthz`)).status, 200);
    assert.equal((await gw.store.listUsage(gw.orgId, { limit: 10 })).records.length, 0);
  } finally {
    await gw.close();
  }
});

test("a client that goes away in the middle of its body is logged at info as such, not as an error", async () => {
  const lines: { level: number; msg: string }[] = [];
  const logger = pino({ level: "info" }, { write: (line: string) => lines.push(JSON.parse(line)) });
  const gw = await startGateway({ loggerInstance: logger as never });
  try {
    const socket = connect(Number(new URL(gw.url).port), "127.0.0.1");
    socket.on("error", () => undefined);
    socket.write(
      `POST /v1/systemone HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${gw.key}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"state":`,
    );
    await new Promise<void>((resolve) => socket.on("ready", () => setTimeout(resolve, 100)));
    socket.destroy();
    await eventually("the abort is logged", async () => lines.some((l) => /client closed the connection/.test(l.msg)));
    const abort = lines.find((l) => /client closed the connection/.test(l.msg))!;
    assert.equal(abort.level, 30, "info");
    assert.deepEqual(
      lines.filter((l) => l.level >= 40).map((l) => l.msg),
      [],
      "no warning or error for it",
    );
  } finally {
    await gw.close();
  }
});
