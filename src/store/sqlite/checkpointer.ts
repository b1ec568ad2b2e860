import { createRequire } from "node:module";
import { Worker } from "node:worker_threads";

/**
 * WAL checkpoints on a worker thread with its own connection, so that copying pages into the database file and
 * its fsync never run on the event loop (the serving connection sets wal_autocheckpoint = 0). A PASSIVE
 * checkpoint never waits for a lock and never blocks a writer; the WAL is rewound by the next writer once
 * everything in it is checkpointed.
 */
const WORKER = `
const { parentPort, workerData } = require("node:worker_threads");
const Database = require(workerData.driver);
const db = new Database(workerData.path, { fileMustExist: true, timeout: 0 });
let reported = { message: "", at: 0 };
const timer = setInterval(() => {
  try {
    db.pragma("wal_checkpoint(PASSIVE)");
  } catch (err) {
    // Told once per minute at most, not every interval.
    const message = String((err && err.message) || err);
    if (message !== reported.message || Date.now() - reported.at > 60000) {
      reported = { message, at: Date.now() };
      parentPort.postMessage({ error: message });
    }
  }
}, workerData.intervalMs);
parentPort.on("message", (m) => { if (m === "stop") { clearInterval(timer); db.close(); parentPort.close(); } });
`;

export interface Checkpointer {
  stop(): Promise<void>;
}

export function startCheckpointer(path: string, intervalMs: number, onError: (message: string) => void = () => {}): Checkpointer {
  const driver = createRequire(import.meta.url).resolve("better-sqlite3");
  const worker = new Worker(WORKER, { eval: true, execArgv: [], workerData: { path, intervalMs, driver } });
  worker.unref();
  worker.on("message", (m: { error?: string }) => {
    if (m.error) onError(m.error);
  });
  worker.on("error", (err: unknown) => onError(err instanceof Error ? err.message : String(err)));
  const exited = new Promise<void>((resolve) => worker.once("exit", () => resolve()));
  let stopped: Promise<void> | null = null;
  return {
    stop() {
      if (!stopped) {
        // Held until it has closed its connection (an exited worker ignores the message).
        worker.ref();
        worker.postMessage("stop");
        stopped = exited;
      }
      return stopped;
    },
  };
}
