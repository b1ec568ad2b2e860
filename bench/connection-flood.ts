/**
 * Idle keep-alive connection floods against a real gateway process with its default connection settings
 * (TDS_MAX_CONNECTIONS 4096, TDS_MAX_CONNECTIONS_PER_ADDRESS 256, TDS_KEEP_ALIVE_TIMEOUT_MS 5000): how many flood
 * connections are served or refused, how long a new client from another address waits for its GET /healthz, and how
 * long the idle flood connections stay open.
 *
 *   npx tsx bench/connection-flood.ts [--connections 4200] [--addresses 1,20]
 *
 * Each flood opens `--connections` connections spread over N local addresses (127.0.1.x; all of 127.0.0.0/8 is
 * loopback on Linux), 64 at a time, each sending one GET /healthz and then staying open and idle. The new client
 * connects from 127.0.0.3. Loopback only; every connection is closed at the end.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { exchange, HEALTH_REQUEST, type RawAnswer, type RawConnection } from "../test/support/raw-client.ts";
import { startGateway } from "./support.ts";

const { values } = parseArgs({
  options: {
    connections: { type: "string", default: "4200" },
    addresses: { type: "string", default: "1,20" },
  },
});
const CONNECTIONS = Number(values.connections);
const ADDRESS_COUNTS = values.addresses.split(",").map(Number);

async function flood(url: string, addresses: number): Promise<(RawConnection & RawAnswer)[]> {
  const out: (RawConnection & RawAnswer)[] = [];
  let next = 0;
  const worker = async () => {
    while (next < CONNECTIONS) {
      const i = next++;
      out.push(await exchange(url, HEALTH_REQUEST, `127.0.1.${10 + (i % addresses)}`, 120_000));
    }
  };
  await Promise.all(Array.from({ length: 64 }, worker));
  return out;
}

const dir = mkdtempSync(join(tmpdir(), "tds-flood-"));
const gateway = await startGateway({
  TDS_DATABASE_URL: `sqlite:${join(dir, "tds.sqlite")}`,
  // Never called: only GET /healthz is sent (and no in-process engine is loaded).
  TDS_MODEL_SERVICE_URL: "http://127.0.0.1:9",
});
try {
  console.log(`gateway defaults; flood of ${CONNECTIONS} idle keep-alive connections (one GET /healthz each)\n`);
  console.log(
    "| addresses | served | refused | still open after the flood | new client's GET /healthz | flood closed by keep-alive after |",
  );
  console.log("| ---: | ---: | ---: | ---: | ---: | ---: |");
  for (const addresses of ADDRESS_COUNTS) {
    const started = performance.now();
    const connections = await flood(gateway.url, addresses);
    const floodMs = performance.now() - started;
    const served = connections.filter((c) => c.status === 200).length;
    const open = connections.filter((c) => !c.isClosed()).length;
    const t0 = performance.now();
    const newcomer = await exchange(gateway.url, HEALTH_REQUEST, "127.0.0.3", 60_000);
    const newcomerMs = performance.now() - t0;
    newcomer.socket.destroy();
    const t1 = performance.now();
    await Promise.all(connections.map((c) => c.closed));
    const closedMs = performance.now() - t1;
    console.log(
      `| ${addresses} | ${served} | ${CONNECTIONS - served} | ${open} | ${newcomer.status ?? "refused"} in ${newcomerMs.toFixed(1)} ms | ${(closedMs / 1000).toFixed(1)} s |`,
    );
    console.error(`(flood of ${addresses} address(es) took ${(floodMs / 1000).toFixed(1)} s)`);
  }
} finally {
  await gateway.stop();
  rmSync(dir, { recursive: true, force: true });
}
