/**
 * A child process that polls GET /healthz one request at a time, 1 ms apart, on its own keep-alive connection, so
 * that the latencies it sees are the gateway's and not the delays of a benchmark process busy sending large bodies.
 *
 * Started with fork() and the gateway's URL as its argument; the parent sends "start" to begin a window and "stop" to
 * end it, and gets back the latencies (ms) of the polls of that window. Exits when the parent disconnects.
 */
import { Agent, request } from "node:http";

const url = new URL("/healthz", process.argv[2]);
const agent = new Agent({ keepAlive: true, maxSockets: 1 });

function pollOnce(): Promise<void> {
  return new Promise((resolve, reject) => {
    const req = request(url, { agent }, (res) => {
      res.resume();
      res.on("end", () => (res.statusCode === 200 ? resolve() : reject(new Error(`/healthz answered ${res.statusCode}`))));
    });
    req.on("error", reject);
    req.end();
  });
}

let running = false;
let latencies: number[] = [];
let loop: Promise<void> = Promise.resolve();

process.on("message", async (message) => {
  if (message === "start" && !running) {
    running = true;
    latencies = [];
    loop = (async () => {
      while (running) {
        const t0 = performance.now();
        try {
          await pollOnce();
        } catch (err) {
          process.stderr.write(`health-poller: ${(err as Error).message}\n`);
          latencies.push(Number.POSITIVE_INFINITY);
          continue;
        }
        latencies.push(performance.now() - t0);
        await new Promise((r) => setTimeout(r, 1));
      }
    })();
  } else if (message === "stop") {
    running = false;
    await loop;
    process.send!(latencies);
  }
});
process.on("disconnect", () => process.exit(0));
