import { createRequire } from "node:module";
import { Worker } from "node:worker_threads";

/**
 * WAL checkpoints on a worker thread with its own connection, so that copying pages into the database file and
 * its fsync never run on the event loop (the serving connection sets wal_autocheckpoint = 0). A PASSIVE checkpoint
 * copies what it can without waiting for a lock or blocking a writer. Under steady writes it never catches up
 * with the newest frames, so the WAL would never be rewound and would grow without end: once it holds more than
 * `restartPages` pages, a RESTART checkpoint takes the write lock (waiting at most BUSY_MS, in this thread), copies
 * the few frames written since the PASSIVE one and makes the next writer start the file over. Meanwhile the serving
 * connection's writes find the database busy and wait asynchronously, as for any other writer: a few ms, rarely.
 * (TRUNCATE would also shrink the file, but truncating many MB held the lock 30 ms and more; the file is reused.)
 *
 * The file on disk is bounded by `walLimitBytes`: the serving connection's journal_size_limit cuts it back to that
 * size at the first commit after a restart, and when it is found larger (a long transaction, or restarts that could
 * not get the lock while the writes went on) a TRUNCATE checkpoint empties it, trying again each interval until one
 * succeeds. The WAL is restarted at half the limit at most, so that restarts keep it below the limit.
 */
export const WAL_RESTART_PAGES = 4096;
/** The default bound of the WAL file on disk (TDS_SQLITE_WAL_LIMIT_MB). */
export const DEFAULT_WAL_LIMIT_BYTES = 64 * 1024 * 1024;
const BUSY_MS = 20;

const WORKER = `
const { statSync } = require("node:fs");
const { parentPort, workerData } = require("node:worker_threads");
const Database = require(workerData.driver);
const db = new Database(workerData.path, { fileMustExist: true, timeout: workerData.busyMs });
const limit = workerData.walLimitBytes;
db.pragma("journal_size_limit = " + limit);
const restartPages = Math.max(1, Math.min(workerData.restartPages, Math.floor(limit / db.pragma("page_size", { simple: true }) / 2)));
const walBytes = () => statSync(workerData.path + "-wal", { throwIfNoEntry: false })?.size ?? 0;
let reported = { message: "", at: 0 };
const timer = setInterval(() => {
  try {
    const [passive] = db.pragma("wal_checkpoint(PASSIVE)");
    if (walBytes() > limit) db.pragma("wal_checkpoint(TRUNCATE)");
    else if (passive && passive.log >= restartPages) db.pragma("wal_checkpoint(RESTART)");
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

export function startCheckpointer(
  path: string,
  options: { intervalMs: number; restartPages?: number; walLimitBytes?: number; onError?: (message: string) => void },
): Checkpointer {
  const onError = options.onError ?? (() => {});
  const driver = createRequire(import.meta.url).resolve("better-sqlite3");
  const worker = new Worker(WORKER, {
    eval: true,
    execArgv: [],
    workerData: {
      path,
      intervalMs: options.intervalMs,
      driver,
      busyMs: BUSY_MS,
      restartPages: options.restartPages ?? WAL_RESTART_PAGES,
      walLimitBytes: options.walLimitBytes ?? DEFAULT_WAL_LIMIT_BYTES,
    },
  });
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
