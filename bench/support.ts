import { type ChildProcess, spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import autocannon from "autocannon";
import { generateApiKey, newOrganizationId } from "../src/domain/api-keys.ts";
import { openStore } from "../src/store/open-store.ts";
import { freePort } from "../test/support/redis-server.ts";

export const ROOT = fileURLToPath(new URL("../", import.meta.url));

/** A realistic decision request: a ~2 KB state and three questions of each type. */
export function realisticRequest(): Record<string, unknown> {
  const history = Array.from({ length: 12 }, (_, i) => ({
    at: `2026-11-${String(10 + i).padStart(2, "0")}T09:${String(i * 4).padStart(2, "0")}:00Z`,
    from: i % 2 ? "agent" : "customer",
    text:
      i % 2
        ? "Thanks for reaching out, we are looking into your invoice."
        : "I was charged twice for the Pro plan this month, please refund one.",
  }));
  const state = { ticket: { id: "T-48213", plan: "pro", tier: "gold", country: "DE", history } };
  const questions: Record<string, unknown> = {};
  for (let i = 0; i < 3; i++) {
    questions[`topic_${i}`] = {
      type: "choice",
      instructions: "What is the ticket mainly about?",
      criteria: { billing: "Payments, invoices, refunds", bug: "Something is broken", account: "Login or profile", other: null },
    };
    questions[`urgency_${i}`] = { type: "score", instructions: "How urgent is it?", criteria: ["can wait", "this week", "today", "now"] };
    questions[`refund_${i}`] = { type: "noul", instructions: "Does the customer ask for money back?" };
  }
  return { state, questions };
}

export interface Started {
  url: string;
  child: ChildProcess;
  stop(): Promise<void>;
}

/** Runs a command from the project root and waits for a line matching `ready` (its first group is the URL). */
export function startProcess(args: string[], env: Record<string, string>, ready: RegExp, timeoutMs = 30_000): Promise<Started> {
  const child = spawn(process.execPath, ["--import", "tsx", ...args], {
    cwd: ROOT,
    env: { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? "/tmp", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  child.stderr!.on("data", (d) => (output += d));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${args.join(" ")} did not start:\n${output}`)), timeoutMs);
    child.on("exit", (code) => reject(new Error(`${args.join(" ")} exited with ${code}:\n${output}`)));
    createInterface({ input: child.stdout! }).on("line", (line) => {
      output += `${line}\n`;
      const m = ready.exec(line);
      if (m) {
        clearTimeout(timer);
        child.removeAllListeners("exit");
        resolve({
          url: m[1]!,
          child,
          stop: () =>
            new Promise((r) => {
              if (child.exitCode !== null) return r();
              child.once("exit", () => r());
              child.kill("SIGTERM");
              setTimeout(() => child.kill("SIGKILL"), 5000).unref();
            }),
        });
      }
    });
  });
}

/** bench/precomputed-model.ts: a model server that answers every request with one precomputed answer. */
export function startPrecomputedModel(): Promise<Started> {
  return startProcess(["bench/precomputed-model.ts", "--port", "0"], {}, /listening on (http:\/\/127\.0\.0\.1:\d+)/);
}

/** bench/passthrough-proxy.ts in front of `upstream`: the baseline of the gateway benches. */
export function startPassthroughProxy(upstream: string): Promise<Started> {
  return startProcess(
    ["bench/passthrough-proxy.ts", "--upstream", upstream, "--port", "0"],
    {},
    /listening on (http:\/\/127\.0\.0\.1:\d+)/,
  );
}

export function startFakeModel(): Promise<Started> {
  return startProcess(["test/fixtures/fake-model-server.ts", "--port", "0"], {}, /listening on (http:\/\/127\.0\.0\.1:\d+)/);
}

/**
 * A gateway process on a free port, ready once GET /api/config answers. Logs at warn: per-request info lines are not
 * measured. `nodeArgs` go before the script (--cpu-prof cannot go in NODE_OPTIONS).
 */
/** `cwd`: the checkout whose src/server.ts runs (another one, such as the code before a change, to compare with). */
export async function startGateway(env: Record<string, string>, nodeArgs: string[] = [], cwd = ROOT): Promise<Started> {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const child = spawn(process.execPath, [...nodeArgs, "--import", "tsx", "src/server.ts"], {
    cwd,
    env: {
      PATH: process.env.PATH ?? "",
      HOME: process.env.HOME ?? "/tmp",
      HOST: "127.0.0.1",
      PORT: String(port),
      LOG_LEVEL: "warn",
      TDS_BOOTSTRAP: "false",
      ...env,
    },
    stdio: ["ignore", "inherit", "inherit"],
  });
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`gateway exited with ${child.exitCode}`);
    try {
      if ((await fetch(`${url}/api/config`)).ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) throw new Error("gateway did not start within 30 s");
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    url,
    child,
    stop: () =>
      new Promise((r) => {
        if (child.exitCode !== null) return r();
        child.once("exit", () => r());
        child.kill("SIGTERM");
        // Long enough for a profiled process to write its profile.
        setTimeout(() => child.kill("SIGKILL"), 15_000).unref();
      }),
  };
}

/** An organization with one key (and credits, for paid mode) in the given database. */
export async function provisionOrg(databaseUrl: string, creditsMicrousd = 0): Promise<string> {
  const store = await openStore(databaseUrl);
  const org = await store.createOrganization({
    id: newOrganizationId(),
    name: `bench-${Date.now()}-${Math.random().toString(36).slice(2, 8)}`,
    nowMs: Date.now(),
  });
  const key = generateApiKey();
  await store.createApiKey({ id: key.id, orgId: org.id, name: "bench", hash: key.hash, nowMs: Date.now() });
  if (creditsMicrousd > 0) await store.grantCredits({ orgId: org.id, amountMicrousd: creditsMicrousd, nowMs: Date.now() });
  await store.close();
  return key.raw;
}

export interface LoadResult {
  rps: number;
  p50: number;
  p99: number;
  requests: number;
  errors: number;
  non2xx: number;
}

export async function load(options: {
  url: string;
  path: string;
  body?: string;
  key?: string;
  connections: number;
  seconds: number;
  rate?: number;
}): Promise<LoadResult> {
  const result = await autocannon({
    url: `${options.url}${options.path}`,
    method: options.body ? "POST" : "GET",
    headers: { "content-type": "application/json", ...(options.key ? { authorization: `Bearer ${options.key}` } : {}) },
    ...(options.body ? { body: options.body } : {}),
    connections: options.connections,
    duration: options.seconds,
    ...(options.rate ? { overallRate: options.rate } : {}),
  });
  return {
    rps: result.requests.average,
    p50: result.latency.p50,
    p99: result.latency.p99,
    requests: result.requests.total,
    errors: result.errors,
    non2xx: result.non2xx,
  };
}

export function row(name: string, r: LoadResult): string {
  return `| ${name} | ${r.rps.toFixed(0)} | ${r.p50.toFixed(1)} | ${r.p99.toFixed(1)} | ${r.requests} | ${r.errors + r.non2xx} |`;
}

export const TABLE_HEAD = "| setup | req/s | p50 ms | p99 ms | requests | errors + non-2xx |\n| --- | ---: | ---: | ---: | ---: | ---: |";

/** Generous limits so the benchmark measures the gateway, not its quotas. */
export const OPEN_LIMITS = {
  TDS_REQUESTS_PER_MINUTE: "1000000",
  TDS_PREVIEW_REQUEST_LIMIT: "1000000000",
  TDS_PREVIEW_GLOBAL_REQUEST_LIMIT: "1000000000",
};
