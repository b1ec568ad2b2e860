/**
 * Admin token guessing is throttled per client address, through a real listening gateway: after 10 failures in a
 * minute the address gets 429 with Retry-After (a correct token too), other addresses are not affected, and the log
 * has one warning per address per minute and no request-completed line for refused attempts. The throttle's window,
 * its warning interval, its memory bound and its IPv6 /64 keys are checked on the class with a clock of its own.
 */
import assert from "node:assert/strict";
import { request } from "node:http";
import { after, before, describe, it } from "node:test";
import pino from "pino";
import { ADMIN_AUTH_THROTTLE, AdminAuthThrottle, addressKey } from "../../src/http/admin-auth-throttle.ts";
import { tokenMatcher } from "../../src/http/token-match.ts";
import { type Gateway, startGateway } from "../support/gateway-harness.ts";

const ADMIN_TOKEN = "adm-throttle-8Kq3Zx7Lw2Nv5Bc9Rt4Hs6";
const LIMIT = ADMIN_AUTH_THROTTLE.maxFailures;

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: { detail?: string };
  requestId: string;
}

/** GET /admin/v1/organizations from `localAddress` (127.0.0.x: each is a client address of its own). */
function adminGet(url: string, authorization: string | null, localAddress = "127.0.0.1"): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = request(
      `${url}/admin/v1/organizations`,
      { localAddress, headers: authorization === null ? {} : { authorization } },
      (res) => {
        let text = "";
        res.setEncoding("utf8");
        res.on("data", (chunk) => (text += chunk));
        res.on("end", () =>
          resolve({
            status: res.statusCode ?? 0,
            headers: res.headers,
            body: JSON.parse(text) as Answer["body"],
            requestId: String(res.headers["x-service-request-id"]),
          }),
        );
      },
    );
    req.on("error", reject);
    req.end();
  });
}

describe("admin authentication failures are throttled per client address", () => {
  let gw: Gateway;
  const lines: Array<Record<string, unknown>> = [];

  before(async () => {
    const logger = pino({ level: "info" }, { write: (text: string) => void lines.push(JSON.parse(text)) });
    gw = await startGateway({ fake: false, env: { TDS_ADMIN_TOKEN: ADMIN_TOKEN }, loggerInstance: logger });
  });
  after(async () => {
    await gw.close();
  });

  it("answers 429 with Retry-After after 10 failures, a correct token too, and logs one warning per address", async () => {
    const ok = await adminGet(gw.url, `Bearer ${ADMIN_TOKEN}`);
    assert.equal(ok.status, 200, "a correct token before any failure");

    const failed: Answer[] = [];
    for (let i = 0; i < LIMIT; i++) {
      const header = i === 0 ? null : i === 1 ? "Basic abc" : `Bearer wrong-${i}`;
      failed.push(await adminGet(gw.url, header));
    }
    assert.deepEqual(
      failed.map((a) => a.status),
      Array(LIMIT).fill(401),
    );

    const refused: Answer[] = [];
    for (const token of ["wrong-again", ADMIN_TOKEN, ADMIN_TOKEN]) refused.push(await adminGet(gw.url, `Bearer ${token}`));
    for (const answer of refused) {
      assert.equal(answer.status, 429);
      assert.equal(answer.body.detail, "Too many failed admin authentications from this address; retry after the time in Retry-After.");
      const seconds = Number(answer.headers["retry-after"]);
      assert.ok(Number.isInteger(seconds) && seconds >= 1 && seconds <= 60, `Retry-After ${answer.headers["retry-after"]}`);
      assert.ok(Number(answer.headers["retry-after-ms"]) <= 60_000);
    }

    // Another address is not throttled: its correct token works, its failures are its own.
    assert.equal((await adminGet(gw.url, `Bearer ${ADMIN_TOKEN}`, "127.0.0.2")).status, 200);
    for (let i = 0; i < 3; i++) assert.equal((await adminGet(gw.url, "Bearer nope", "127.0.0.2")).status, 401);
    assert.equal((await adminGet(gw.url, `Bearer ${ADMIN_TOKEN}`, "127.0.0.2")).status, 200);

    const warnings = lines.filter((l) => l.level === 40 && "remote_address" in l);
    assert.deepEqual(
      warnings.map((w) => w.remote_address),
      ["127.0.0.1", "127.0.0.2"],
      `one warning per address: ${JSON.stringify(warnings)}`,
    );
    assert.deepEqual([warnings[0]!.failed, warnings[0]!.refused_while_throttled], [1, 0]);

    // A refused request writes Fastify's "incoming request" line and nothing else of its own.
    for (const answer of [...failed, ...refused]) {
      const own = lines.filter((l) => l.request_id === answer.requestId && l.level !== 40).map((l) => l.msg);
      assert.deepEqual(own, ["incoming request"], `request ${answer.requestId}`);
    }
    const completed = lines.filter((l) => l.request_id === ok.requestId).map((l) => l.msg);
    assert.deepEqual(completed, ["incoming request", "request completed"], "an accepted request keeps both lines");
    assert.ok(!JSON.stringify(lines).includes(ADMIN_TOKEN), "the token is never logged");
  });
});

describe("AdminAuthThrottle", () => {
  const clock = () => {
    let now = 1_000_000;
    return {
      nowMs: () => now,
      advance: (ms: number) => {
        now += ms;
      },
    };
  };

  it("throttles after maxFailures within the window, until the oldest of them leaves it", () => {
    const c = clock();
    const t = new AdminAuthThrottle({ maxFailures: 3, windowMs: 60_000, maxAddresses: 100, nowMs: c.nowMs });
    t.failed("10.0.0.1");
    c.advance(10_000);
    t.failed("10.0.0.1");
    assert.equal(t.retryAfterMs("10.0.0.1"), null);
    c.advance(10_000);
    t.failed("10.0.0.1");
    assert.equal(t.retryAfterMs("10.0.0.1"), 40_000, "the first failure leaves the window 40 s from now");
    assert.equal(t.retryAfterMs("10.0.0.2"), null);
    c.advance(39_999);
    assert.equal(t.retryAfterMs("10.0.0.1"), 1);
    c.advance(1);
    assert.equal(t.retryAfterMs("10.0.0.1"), null, "two failures left in the window");
    t.failed("10.0.0.1");
    assert.equal(t.retryAfterMs("10.0.0.1"), 10_000);
  });

  it("warns once per address per window, with what happened since the last warning", () => {
    const c = clock();
    const t = new AdminAuthThrottle({ maxFailures: 2, windowMs: 60_000, maxAddresses: 100, nowMs: c.nowMs });
    assert.deepEqual(t.failed("a"), { failed: 1, refused: 0, throttledForMs: null });
    assert.equal(t.failed("a"), null);
    assert.equal(t.refused("a"), null);
    assert.equal(t.refused("a"), null);
    assert.deepEqual(t.failed("b"), { failed: 1, refused: 0, throttledForMs: null }, "another address has its own");
    c.advance(60_000);
    assert.deepEqual(t.failed("a"), { failed: 2, refused: 2, throttledForMs: null });
    assert.equal(t.failed("a"), null);
    c.advance(60_000);
    assert.deepEqual(t.refused("a"), { failed: 1, refused: 1, throttledForMs: null });
  });

  it("reports the throttle in the warning when the address is throttled", () => {
    const c = clock();
    const t = new AdminAuthThrottle({ maxFailures: 1, windowMs: 60_000, maxAddresses: 100, nowMs: c.nowMs });
    assert.deepEqual(t.failed("a"), { failed: 1, refused: 0, throttledForMs: 60_000 });
  });

  it("a success forgets the failures", () => {
    const c = clock();
    const t = new AdminAuthThrottle({ maxFailures: 2, windowMs: 60_000, maxAddresses: 100, nowMs: c.nowMs });
    t.failed("a");
    t.succeeded("a");
    t.failed("a");
    assert.equal(t.retryAfterMs("a"), null);
  });

  it("keeps at most maxAddresses, forgetting the least recently seen", () => {
    const c = clock();
    const t = new AdminAuthThrottle({ maxFailures: 1, windowMs: 60_000, maxAddresses: 3, nowMs: c.nowMs });
    for (let i = 0; i < 1000; i++) t.failed(`10.0.${i >> 8}.${i & 255}`);
    assert.equal(t.size, 3);
    assert.ok(t.retryAfterMs("10.0.3.231") !== null, "the most recent address is still throttled");
    assert.equal(t.retryAfterMs("10.0.0.0"), null, "the oldest was forgotten");
  });

  it("counts IPv6 addresses per /64 and IPv4-mapped ones as IPv4", () => {
    assert.equal(addressKey("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::/64");
    assert.equal(addressKey("2001:0db8:0001:0002:ffff:0:0:9"), "2001:db8:1:2::/64");
    assert.equal(addressKey("::1"), "0:0:0:0::/64");
    assert.equal(addressKey("::ffff:192.0.2.7"), "192.0.2.7");
    assert.equal(addressKey("192.0.2.7"), "192.0.2.7");
    const c = clock();
    const t = new AdminAuthThrottle({ maxFailures: 2, windowMs: 60_000, maxAddresses: 100, nowMs: c.nowMs });
    t.failed("2001:db8:1:2::1");
    t.failed("2001:db8:1:2::2");
    assert.notEqual(t.retryAfterMs("2001:db8:1:2:ffff::3"), null);
    assert.equal(t.retryAfterMs("2001:db8:1:3::1"), null);
  });
});

describe("tokenMatcher", () => {
  it("accepts only the exact token, whatever the length of the guess", () => {
    const matches = tokenMatcher("metrics-7Hq2Lw9Xv4Rk8Tz1Nb6Mc3Pd5F");
    assert.equal(matches("metrics-7Hq2Lw9Xv4Rk8Tz1Nb6Mc3Pd5F"), true);
    for (const guess of ["", "m", "metrics-7Hq2Lw9Xv4Rk8Tz1Nb6Mc3Pd5", "metrics-7Hq2Lw9Xv4Rk8Tz1Nb6Mc3Pd5FF", "x".repeat(10_000)]) {
      assert.equal(matches(guess), false, guess.slice(0, 40));
    }
  });
});
