/**
 * Client connections through a real listening gateway: the per-address cap, idle connections closed first when the
 * server nears its global cap (so a flood of idle keep-alive connections cannot keep a new client out), and the idle
 * keep-alive timeout. Clients are told apart by their local address (127.0.0.2, .3, .4: all loopback on Linux).
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import pino from "pino";
import { ConfigError, loadConfig } from "../../src/config.ts";
import { eventually } from "../support/books.ts";
import { sampleRequest, startGateway } from "../support/gateway-harness.ts";
import {
  exchange,
  HEALTH_REQUEST,
  headerOf,
  jsonRequest,
  type RawAnswer,
  type RawConnection,
  rawConnection,
} from "../support/raw-client.ts";

async function openMany(url: string, count: number, localAddress: string): Promise<(RawConnection & RawAnswer)[]> {
  const out: (RawConnection & RawAnswer)[] = [];
  for (let i = 0; i < count; i++) out.push(await exchange(url, HEALTH_REQUEST, localAddress));
  return out;
}

const stillOpen = (list: RawConnection[]) => list.filter((c) => !c.isClosed()).length;

test("a flood of idle keep-alive connections is capped per address and shed to make room for new clients", async () => {
  const warnings: Record<string, unknown>[] = [];
  const logger = pino({ level: "warn" }, { write: (line: string) => warnings.push(JSON.parse(line)) });
  // Keep-alive far longer than the test: only the guard can make room.
  const gw = await startGateway({
    fake: false,
    loggerInstance: logger as never,
    env: { TDS_MAX_CONNECTIONS: "200", TDS_MAX_CONNECTIONS_PER_ADDRESS: "120", TDS_KEEP_ALIVE_TIMEOUT_MS: "600000" },
  });
  const all: RawConnection[] = [];
  try {
    // One address opens 130 connections, one GET /healthz each, and keeps them open: 120 are served, 10 refused.
    const flood = await openMany(gw.url, 130, "127.0.0.2");
    all.push(...flood);
    assert.equal(flood.filter((c) => c.status === 200).length, 120, "served up to the per-address cap");
    const refused = flood.filter((c) => c.status === null);
    assert.equal(refused.length, 10, "past it, new connections of that address are refused");
    await Promise.all(refused.map((c) => c.closed));
    assert.equal(stillOpen(flood), 120);

    // A second address brings the server to 210 connections: past 90% of the cap (180), the flood's idle
    // connections are closed, not the newcomers.
    const second = await openMany(gw.url, 90, "127.0.0.4");
    all.push(...second);
    assert.equal(second.filter((c) => c.status === 200).length, 90);

    // A new client is served at once, while the flood's connections are still open.
    const newcomer = await exchange(gw.url, HEALTH_REQUEST, "127.0.0.3");
    all.push(newcomer);
    assert.equal(newcomer.status, 200, newcomer.answer);
    assert.match(newcomer.answer, /\{"status":"ok"\}$/);

    await eventually("the server holds at most 180 connections", async () => stillOpen(all) === 180);
    assert.equal(stillOpen(second), 90, "the second address kept every connection");
    assert.ok(!newcomer.isClosed(), "the newcomer kept its connection");
    assert.equal(stillOpen(flood), 89, "the busiest address's idle connections were closed to make room");
    const served = await new Promise<number>((resolve, reject) =>
      gw.app.server.getConnections((err, n) => (err ? reject(err) : resolve(n))),
    );
    assert.equal(served, 180, "the server's own count agrees");
    // One warning (at most one a minute), at the first refusal, naming the busiest address.
    const pressure = warnings.filter((w) => /client connections refused or idle ones closed/.test(String(w.msg)));
    assert.equal(pressure.length, 1, JSON.stringify(warnings));
    assert.equal(pressure[0]!.refusedPerAddress, 1);
    assert.deepEqual(pressure[0]!.busiest, { address: "127.0.0.2", connections: 120 });
  } finally {
    for (const c of all) c.socket.destroy();
    await gw.close();
  }
});

test("connections in the middle of a request are never closed to make room; with none idle, a new one is refused", async () => {
  const gw = await startGateway({
    fake: true,
    shutdownGraceMs: 100,
    env: { TDS_MAX_CONNECTIONS: "10", TDS_MAX_CONNECTIONS_PER_ADDRESS: "10", TDS_KEEP_ALIVE_TIMEOUT_MS: "600000" },
  });
  const all: RawConnection[] = [];
  try {
    const hanging = sampleRequest({ state: { ticket: "never answered", fake_behavior: "hang" } });
    const decision = jsonRequest("POST", "/v1/systemone", hanging, { authorization: `Bearer ${gw.key}` });
    // Nine decisions whose model calls hang: their connections are busy.
    const busy = Array.from({ length: 9 }, () => rawConnection(gw.url, "127.0.0.2"));
    all.push(...busy);
    for (const c of busy) void c.send(decision);
    await eventually("the nine model calls arrived", async () => gw.fake!.calls.decide === 9);
    // One idle connection from elsewhere: ten open, the cap.
    const idle = await exchange(gw.url, HEALTH_REQUEST, "127.0.0.4");
    all.push(idle);
    assert.equal(idle.status, 200);

    // A newcomer: the idle connection is closed to make room, not a busy one.
    const newcomer = await exchange(gw.url, HEALTH_REQUEST, "127.0.0.3");
    all.push(newcomer);
    assert.equal(newcomer.status, 200, newcomer.answer);
    await idle.closed;
    assert.equal(stillOpen(busy), 9, "no busy connection was closed");

    // The newcomer's connection becomes busy too: ten busy connections, none idle, so the next one is refused.
    void newcomer.send(decision);
    await eventually("the tenth model call arrived", async () => gw.fake!.calls.decide === 10);
    const refused = await exchange(gw.url, HEALTH_REQUEST, "127.0.0.5");
    all.push(refused);
    assert.equal(refused.status, null, refused.answer);
    await refused.closed;
    assert.equal(stillOpen(busy), 9);
    assert.ok(!newcomer.isClosed());
  } finally {
    for (const c of all) c.socket.destroy();
    await gw.close();
  }
});

test("an idle keep-alive connection is closed after the keep-alive timeout, and the answer says so", async () => {
  assert.equal(loadConfig({}).connections.keepAliveTimeoutMs, 5000, "the default is a few seconds");
  const byDefault = await startGateway({ fake: false });
  try {
    const c = await exchange(byDefault.url, HEALTH_REQUEST);
    assert.equal(headerOf(c.answer, "keep-alive"), "timeout=5");
    c.socket.destroy();
  } finally {
    await byDefault.close();
  }

  const gw = await startGateway({ fake: false, env: { TDS_KEEP_ALIVE_TIMEOUT_MS: "1000" } });
  try {
    const c = await exchange(gw.url, HEALTH_REQUEST, "127.0.0.1", 20_000);
    assert.equal(c.status, 200);
    assert.equal(headerOf(c.answer, "keep-alive"), "timeout=1");
    assert.ok(!c.isClosed(), "kept open after the answer");
    await c.closed;
    assert.ok(c.socket.readableEnded, "closed by the server (its FIN), not by the client's safety net");
  } finally {
    await gw.close();
  }
});

test("a request that arrived while the event loop was busy past the keep-alive timeout is served, not reset", async () => {
  // Node closes an idle connection at the timeout plus its own 1 s buffer: 1.2 s here.
  const gw = await startGateway({ fake: false, env: { TDS_KEEP_ALIVE_TIMEOUT_MS: "200" } });
  try {
    const c = await exchange(gw.url, HEALTH_REQUEST);
    assert.equal(c.status, 200);
    const next = c.send(HEALTH_REQUEST);
    // The request is on its way; this process (server included) is then busy until well past the timeout.
    const until = performance.now() + 2000;
    while (performance.now() < until);
    const answer = await next;
    assert.equal(answer.status, 200, `answered on the same connection: ${JSON.stringify(answer.answer)}`);
    c.socket.destroy();
  } finally {
    await gw.close();
  }
});

test("the connection settings: defaults, the config file's keys, the environment winning, and clear refusals", () => {
  assert.deepEqual(loadConfig({}).connections, { keepAliveTimeoutMs: 5000, maxConnections: 4096, maxConnectionsPerAddress: 256 });
  const dir = mkdtempSync(join(tmpdir(), "tds-connections-"));
  try {
    const file = join(dir, "config.json");
    writeFileSync(
      file,
      JSON.stringify({
        keep_alive_timeout_ms: 2000,
        max_connections: 1000,
        max_connections_per_address: 50,
        trusted_proxies: ["10.0.0.0/8"],
      }),
    );
    const fromFile = loadConfig({ TDS_CONFIG: file });
    assert.deepEqual(fromFile.connections, { keepAliveTimeoutMs: 2000, maxConnections: 1000, maxConnectionsPerAddress: 50 });
    assert.deepEqual(fromFile.trustedProxies, ["10.0.0.0/8"]);
    const overridden = loadConfig({ TDS_CONFIG: file, TDS_MAX_CONNECTIONS_PER_ADDRESS: "80", TDS_TRUSTED_PROXIES: "loopback" });
    assert.equal(overridden.connections.maxConnectionsPerAddress, 80);
    assert.deepEqual(overridden.trustedProxies, ["loopback"]);
    writeFileSync(file, JSON.stringify({ trusted_proxies: ["10.0.0.0/8", "not-an-address"] }));
    assert.throws(
      () => loadConfig({ TDS_CONFIG: file }),
      (err: unknown) => err instanceof ConfigError && err.problems.some((p) => /^trusted_proxies: "not-an-address" is neither/.test(p)),
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  for (const [env, message] of [
    [{ TDS_KEEP_ALIVE_TIMEOUT_MS: "0" }, /TDS_KEEP_ALIVE_TIMEOUT_MS must be a whole number from 100 to 600000/],
    [{ TDS_MAX_CONNECTIONS: "many" }, /TDS_MAX_CONNECTIONS must be a whole number/],
    [
      { TDS_MAX_CONNECTIONS: "100", TDS_MAX_CONNECTIONS_PER_ADDRESS: "101" },
      /TDS_MAX_CONNECTIONS_PER_ADDRESS \(101\) must not exceed TDS_MAX_CONNECTIONS \(100\)/,
    ],
  ] as const) {
    assert.throws(
      () => loadConfig(env),
      (err: unknown) => err instanceof ConfigError && err.problems.some((p) => message.test(p)),
      JSON.stringify(env),
    );
  }
});
