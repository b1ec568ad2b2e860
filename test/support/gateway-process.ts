import { type ChildProcess, spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));

export interface GatewayProcess {
  url: string;
  child: ChildProcess;
  /** Log lines printed so far (JSON lines from pino). */
  lines: string[];
  stop(): Promise<void>;
}

/** Starts `src/server.ts` as a real separate process on a free port; resolves once it listens. */
export async function startGatewayProcess(env: Record<string, string>, timeoutMs = 20_000): Promise<GatewayProcess> {
  const child = spawn(process.execPath, ["--import", "tsx", "src/server.ts"], {
    cwd: ROOT,
    env: {
      PATH: process.env.PATH ?? "",
      HOME: process.env.HOME ?? "/tmp",
      HOST: "127.0.0.1",
      PORT: "0",
      LOG_LEVEL: "info",
      TDS_BOOTSTRAP: "false",
      // Generous per-minute limits unless a test is about them: how many polls a test needs depends on how busy the
      // machine is, and its own limit must never be what answers it.
      TDS_REQUESTS_PER_MINUTE: "100000",
      TDS_READ_REQUESTS_PER_MINUTE: "100000",
      ...env,
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const lines: string[] = [];
  let stderr = "";
  child.stderr!.on("data", (d) => (stderr += d));
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`gateway did not start in ${timeoutMs} ms:\n${stderr}\n${lines.join("\n")}`)),
      timeoutMs,
    );
    child.on("exit", (code) => reject(new Error(`gateway exited with ${code}:\n${stderr}\n${lines.join("\n")}`)));
    createInterface({ input: child.stdout! }).on("line", (line) => {
      lines.push(line);
      const match = /Server listening at (http:\/\/127\.0\.0\.1:\d+)/.exec(line);
      if (match) {
        clearTimeout(timer);
        resolve(match[1]!);
      }
    });
  });
  return {
    url,
    child,
    lines,
    stop: () =>
      new Promise<void>((resolve) => {
        if (child.exitCode !== null || child.signalCode !== null) return resolve();
        child.once("exit", () => resolve());
        child.kill("SIGTERM");
        setTimeout(() => child.kill("SIGKILL"), 5000).unref();
      }),
  };
}

/**
 * Polls the gateway's /readyz until it answers 200: the database takes writes and every model has a deployment that
 * takes calls. A gateway listens before its first model list; on a busy machine that list can time out and leave
 * the only deployment cooling down for a moment, which a test must not mistake for the behaviour it checks.
 */
export async function waitUntilReady(gateway: Pick<GatewayProcess, "url" | "lines">, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = "";
  while (Date.now() < deadline) {
    try {
      const res = await fetch(`${gateway.url}/readyz`, { signal: AbortSignal.timeout(5000) });
      last = `${res.status} ${await res.text()}`;
      if (res.status === 200) return;
    } catch (err) {
      last = String(err);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`gateway ${gateway.url} not ready in ${timeoutMs} ms (last: ${last}):\n${gateway.lines.join("\n")}`);
}
