/**
 * TDS_TRUSTED_PROXIES through a real listening gateway: the client address recorded in the audit log comes from
 * X-Forwarded-For only when the connection comes from a trusted proxy, and trusted proxies are not held to the
 * per-address connection cap. Clients are told apart by their local address (127.0.0.2, .3: loopback on Linux).
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { ConfigError, loadConfig } from "../../src/config.ts";
import { type Gateway, startGateway } from "../support/gateway-harness.ts";
import { bodyOf, exchange, HEALTH_REQUEST, jsonRequest, type RawConnection } from "../support/raw-client.ts";

const ADMIN_TOKEN = "adm-Proxy9Lr4Tz8Kw1Nc6Hs3Bd5Fg0JmQx";

/** Creates an organization over the admin API from `localAddress`; returns the address its audit entry recorded. */
async function recordedAddress(gw: Gateway, name: string, localAddress: string, forwardedFor?: string): Promise<string> {
  const created = await exchange(
    gw.url,
    jsonRequest(
      "POST",
      "/admin/v1/organizations",
      { name },
      {
        authorization: `Bearer ${ADMIN_TOKEN}`,
        connection: "close",
        ...(forwardedFor === undefined ? {} : { "x-forwarded-for": forwardedFor }),
      },
    ),
    localAddress,
  );
  assert.equal(created.status, 201, created.answer);
  const orgId = JSON.parse(bodyOf(created.answer)).id as string;
  const audit = await fetch(`${gw.url}/admin/v1/audit?org=${orgId}`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
  const entries = (await audit.json()) as { data: { action: string; remote_address: string }[] };
  assert.equal(entries.data.length, 1);
  assert.equal(entries.data[0]!.action, "organization.created");
  return entries.data[0]!.remote_address;
}

describe("trusted proxies", () => {
  test("from a trusted proxy the client is the nearest untrusted address of X-Forwarded-For; otherwise the socket's", async () => {
    const gw = await startGateway({ fake: false, env: { TDS_ADMIN_TOKEN: ADMIN_TOKEN, TDS_TRUSTED_PROXIES: "127.0.0.2, 10.0.0.0/8" } });
    try {
      assert.equal(await recordedAddress(gw, "p1", "127.0.0.2", "203.0.113.7"), "203.0.113.7");
      // A client-supplied entry in front of the proxies' is not believed: the nearest untrusted hop is the client.
      assert.equal(await recordedAddress(gw, "p2", "127.0.0.2", "198.51.100.1, 203.0.113.7, 10.1.2.3"), "203.0.113.7");
      assert.equal(await recordedAddress(gw, "p3", "127.0.0.2"), "127.0.0.2", "no header: the proxy itself");
      assert.equal(await recordedAddress(gw, "p4", "127.0.0.3", "203.0.113.9"), "127.0.0.3", "not a trusted proxy: header ignored");
    } finally {
      await gw.close();
    }
  });

  test("unset (the default), X-Forwarded-For is ignored", async () => {
    assert.deepEqual(loadConfig({}).trustedProxies, []);
    const gw = await startGateway({ fake: false, env: { TDS_ADMIN_TOKEN: ADMIN_TOKEN } });
    try {
      assert.equal(await recordedAddress(gw, "d1", "127.0.0.2", "203.0.113.7"), "127.0.0.2");
    } finally {
      await gw.close();
    }
  });

  test("a trusted proxy is not held to the per-address connection cap; other addresses are", async () => {
    const gw = await startGateway({
      fake: false,
      env: { TDS_TRUSTED_PROXIES: "127.0.0.2", TDS_MAX_CONNECTIONS_PER_ADDRESS: "2", TDS_KEEP_ALIVE_TIMEOUT_MS: "600000" },
    });
    const all: RawConnection[] = [];
    try {
      const open = async (localAddress: string) => {
        const c = await exchange(gw.url, HEALTH_REQUEST, localAddress);
        all.push(c);
        return c.status;
      };
      assert.deepEqual([await open("127.0.0.2"), await open("127.0.0.2"), await open("127.0.0.2")], [200, 200, 200]);
      assert.deepEqual([await open("127.0.0.3"), await open("127.0.0.3"), await open("127.0.0.3")], [200, 200, null]);
    } finally {
      for (const c of all) c.socket.destroy();
      await gw.close();
    }
  });

  test("the setting is validated: addresses, CIDR ranges and the names loopback, linklocal, uniquelocal", () => {
    assert.deepEqual(loadConfig({ TDS_TRUSTED_PROXIES: " 10.0.0.0/8 ,loopback,fd00::/8, 192.0.2.1," }).trustedProxies, [
      "10.0.0.0/8",
      "loopback",
      "fd00::/8",
      "192.0.2.1",
    ]);
    for (const [value, message] of [
      ["10.0.0.0/33", /TDS_TRUSTED_PROXIES: "10\.0\.0\.0\/33" has a prefix length that is not 0 to 32/],
      ["proxy.internal", /TDS_TRUSTED_PROXIES: "proxy\.internal" is neither an IP address/],
      ["::1/129", /prefix length that is not 0 to 128/],
    ] as const) {
      assert.throws(
        () => loadConfig({ TDS_TRUSTED_PROXIES: value }),
        (err: unknown) => err instanceof ConfigError && err.problems.some((p) => message.test(p)),
        value,
      );
    }
  });
});
