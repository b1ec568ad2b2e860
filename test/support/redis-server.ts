import { type ChildProcess, spawn } from "node:child_process";
import { once } from "node:events";
import net from "node:net";

/** A TCP port nothing listens on at the moment. */
export async function freePort(): Promise<number> {
  const server = net.createServer();
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const { port } = server.address() as net.AddressInfo;
  server.close();
  await once(server, "close");
  return port;
}

/** A throwaway redis-server child (nothing on disk), ready when this resolves. */
export async function startRedisServer(port: number, dir: string): Promise<ChildProcess> {
  const child = spawn(
    "redis-server",
    ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir, "--logfile", ""],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  let output = "";
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => fail(new Error(`redis-server on port ${port} not ready within 5 s:\n${output}`)), 5000);
    const fail = (err: Error) => {
      clearTimeout(timer);
      child.kill("SIGKILL");
      reject(err);
    };
    child.on("error", (err) => fail(new Error(`cannot start redis-server (is the redis-server package installed?): ${err.message}`)));
    child.on("exit", (code) => fail(new Error(`redis-server exited with ${code} before it was ready:\n${output}`)));
    child.stdout!.on("data", (chunk: Buffer) => {
      output += chunk.toString();
      if (output.includes("Ready to accept connections")) {
        clearTimeout(timer);
        child.removeAllListeners("exit");
        resolve(child);
      }
    });
    child.stderr!.on("data", (chunk: Buffer) => (output += chunk.toString()));
  });
}

export async function stopRedisServer(child: ChildProcess | undefined): Promise<void> {
  if (!child || child.exitCode !== null || child.signalCode !== null) return;
  const exited = once(child, "exit");
  child.kill("SIGKILL");
  await exited;
}
