/**
 * Admin token guessing against one gateway (in process, SQLite, JSON logs at info counted, not written): how many
 * guesses a client gets answered per second, how many of them were checked against the token (401) rather than
 * refused by the throttle (429), and how many log bytes and lines the whole run wrote.
 * Run: npx tsx bench/admin-guessing.ts [seconds] [connections]
 */
import autocannon from "autocannon";
import pino from "pino";
import { startGateway } from "../test/support/gateway-harness.ts";

const SECONDS = Number(process.argv[2] ?? 5);
const CONNECTIONS = Number(process.argv[3] ?? 10);

let bytes = 0;
let lines = 0;
let warnings = 0;
const logger = pino(
  { level: "info" },
  {
    write: (text: string) => {
      bytes += Buffer.byteLength(text);
      lines++;
      if (text.includes('"level":40')) warnings++;
    },
  },
);
const gw = await startGateway({ fake: false, env: { TDS_ADMIN_TOKEN: "adm-bench-4Kq8Zx2Lw7Nv1Bc5Rt9Hs3Pd6" }, loggerInstance: logger });
const result = await autocannon({
  url: `${gw.url}/admin/v1/organizations`,
  connections: CONNECTIONS,
  duration: SECONDS,
  headers: { authorization: "Bearer a-wrong-guess-of-the-admin-token-0000" },
});
await gw.close();
const answered = result.requests.total;
console.log(
  JSON.stringify(
    {
      seconds: SECONDS,
      connections: CONNECTIONS,
      answered,
      per_second: Math.round(answered / SECONDS),
      status_401: result["4xx"] - (result.statusCodeStats?.["429"]?.count ?? 0),
      status_429: result.statusCodeStats?.["429"]?.count ?? 0,
      log_lines: lines,
      log_bytes: bytes,
      log_bytes_per_request: Math.round(bytes / Math.max(1, answered)),
      warnings,
    },
    null,
    2,
  ),
);
