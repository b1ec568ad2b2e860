import { createRequire } from "node:module";
import { Worker } from "node:worker_threads";

/**
 * WAL checkpoints on a worker thread with its own connection, so that copying pages into the database file and
 * its fsyncs never run on the event loop (the serving connection sets wal_autocheckpoint = 0). Every interval a
 * PASSIVE checkpoint copies what it can without taking the write lock: the serving connection never finds the
 * database busy because of it.
 *
 * SQLite starts the WAL over (writes from its beginning again) when a writer begins while every frame has been
 * copied, and under steady writes a PASSIVE checkpoint rarely catches up with the newest frame. So once the WAL holds
 * `restartPages` pages, the thread catches up between two writes of the serving connection, which counts its write
 * transactions in shared memory (`write`, `ifOpen`: odd while one runs, and for a moment while one finds the gate
 * closed and backs off). First it waits for a write to end and checkpoints at once, in the pause before the next, until
 * a checkpoint copied the last frame with no write in between (OPPORTUNE_PASSES at most). If none did, it closes a
 * gate that the serving connection's next writes wait for asynchronously (`closed`), waits for the running write to
 * end, checkpoints, and opens the gate. The next write then starts the WAL over by itself, with no lock held by anyone
 * else; it only syncs the WAL's new header.
 *
 * When that fails too (writes from other processes) and the WAL holds `forcedPages` pages, a RESTART checkpoint
 * takes the write lock (waiting at most BUSY_MS, in this thread), and writers wait asynchronously meanwhile, as for
 * any other writer. The file on disk is bounded by `walLimitBytes`: the serving connection's journal_size_limit cuts
 * it back to that size at the first commit after a restart, and when it is found larger (a long transaction, or
 * restarts that could not happen while the writes went on) a TRUNCATE checkpoint empties it, trying again each
 * interval until one succeeds. The WAL is started over at half the limit at most and forced at three quarters at
 * most, so that restarts keep it below the limit.
 */
export const WAL_RESTART_PAGES = 8192;
/** The default bound of the WAL file on disk (TDS_SQLITE_WAL_LIMIT_MB). */
export const DEFAULT_WAL_LIMIT_BYTES = 64 * 1024 * 1024;
const BUSY_MS = 20;
const OPPORTUNE_PASSES = 20;
/** The longest a write waits for the gate (a checkpoint that takes longer fails to catch up, and is tried again). */
const GATE_WAIT_MS = 1000;
/** Indexes in the shared Int32Array: the serving connection's write count, and the gate (1: closed). */
const WRITES = 0;
const GATE = 1;

const WORKER = `
const { statSync } = require("node:fs");
const { parentPort, workerData } = require("node:worker_threads");
const Database = require(workerData.driver);
const db = new Database(workerData.path, { fileMustExist: true, timeout: workerData.busyMs });
const limit = workerData.walLimitBytes;
db.pragma("journal_size_limit = " + limit);
const limitPages = Math.floor(limit / db.pragma("page_size", { simple: true }));
const restartPages = Math.max(1, Math.min(workerData.restartPages, Math.floor(limitPages / 2)));
const forcedPages = Math.max(restartPages, Math.min(2 * restartPages, Math.floor((limitPages * 3) / 4)));
const shared = new Int32Array(workerData.shared);
const [WRITES, GATE] = [${WRITES}, ${GATE}];
const walBytes = () => statSync(workerData.path + "-wal", { throwIfNoEntry: false })?.size ?? 0;
const passive = () => db.pragma("wal_checkpoint(PASSIVE)")[0];

// The write count once no write runs, waiting at most until the deadline, or null. Waits for every odd count it reads:
// the running write, then, when woken late, the next one, or one that found the gate closed and is backing off.
function betweenWrites(deadline) {
  for (;;) {
    const seen = Atomics.load(shared, WRITES);
    if (seen % 2 === 0) return seen;
    const left = deadline - Date.now();
    if (left <= 0) return null;
    Atomics.wait(shared, WRITES, seen, left);
  }
}

// A PASSIVE checkpoint between two writes; its result, with log 0 when the next write starts the WAL over: it copied
// the last frame, and no write started meanwhile (none can while the gate is closed; the count may still read odd then).
function passBetween(seen, gated) {
  const result = passive();
  const noWriteSince = gated || Atomics.load(shared, WRITES) === seen;
  return result.checkpointed === result.log && noWriteSince ? { ...result, log: 0 } : result;
}

function catchUp(first) {
  const deadline = Date.now() + workerData.catchUpMs;
  let result = first;
  for (let pass = 0; pass < workerData.opportunePasses && Date.now() < deadline; pass++) {
    const seen = betweenWrites(deadline);
    if (seen === null) continue;
    result = passBetween(seen, false);
    if (result.log < restartPages) return result;
  }
  Atomics.store(shared, GATE, 1);
  try {
    const seen = betweenWrites(Date.now() + workerData.gateWaitMs);
    return seen === null ? result : passBetween(seen, true);
  } finally {
    Atomics.store(shared, GATE, 0);
    Atomics.notify(shared, GATE);
  }
}

let reported = { message: "", at: 0 };
const timer = setInterval(() => {
  try {
    let result = passive();
    if (walBytes() > limit) db.pragma("wal_checkpoint(TRUNCATE)");
    else if (result.log >= restartPages) {
      result = catchUp(result);
      if (result.log >= forcedPages) db.pragma("wal_checkpoint(RESTART)");
    }
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

type WaitAsync = (
  array: Int32Array,
  index: number,
  value: number,
  timeoutMs: number,
) => { async: false; value: string } | { async: true; value: Promise<string> };
const waitAsync = (Atomics as unknown as { waitAsync: WaitAsync }).waitAsync;

export interface Checkpointer {
  /**
   * Runs one synchronous write of the serving connection, counted so that the thread can checkpoint between two; at
   * once when the gate is open, else once it opens (or GATE_WAIT_MS passed).
   */
  write<T>(write: () => T): T | Promise<T>;
  /**
   * The same, synchronously, for a caller that waited for `closed()` itself: runs the write when the gate is open,
   * else returns `{ ran: false }` without running it (the gate closed again meanwhile: wait for `closed()` again).
   */
  ifOpen<T>(write: () => T): { ran: true; value: T } | { ran: false };
  /** While the thread checkpoints with the gate closed: when it opens (or GATE_WAIT_MS passed). Null when open. */
  closed(): Promise<void> | null;
  stop(): Promise<void>;
}

export function startCheckpointer(
  path: string,
  options: { intervalMs: number; restartPages?: number; walLimitBytes?: number; onError?: (message: string) => void },
): Checkpointer {
  const onError = options.onError ?? (() => {});
  const driver = createRequire(import.meta.url).resolve("better-sqlite3");
  const shared = new Int32Array(new SharedArrayBuffer(8));
  const worker = new Worker(WORKER, {
    eval: true,
    execArgv: [],
    workerData: {
      path,
      intervalMs: options.intervalMs,
      driver,
      busyMs: BUSY_MS,
      // Most of an interval, so that the next one starts on time.
      catchUpMs: Math.ceil(options.intervalMs * 0.8),
      opportunePasses: OPPORTUNE_PASSES,
      gateWaitMs: GATE_WAIT_MS,
      restartPages: options.restartPages ?? WAL_RESTART_PAGES,
      walLimitBytes: options.walLimitBytes ?? DEFAULT_WAL_LIMIT_BYTES,
      shared: shared.buffer,
    },
  });
  worker.unref();
  worker.on("message", (m: { error?: string }) => {
    if (m.error) onError(m.error);
  });
  worker.on("error", (err: unknown) => onError(err instanceof Error ? err.message : String(err)));
  const exited = new Promise<void>((resolve) =>
    worker.once("exit", () => {
      // A thread that ended with the gate closed (an error) does not hold the writes back.
      Atomics.store(shared, GATE, 0);
      Atomics.notify(shared, GATE);
      resolve();
    }),
  );
  let stopped: Promise<void> | null = null;
  const closed = () => {
    if (Atomics.load(shared, GATE) === 0) return null;
    const wait = waitAsync(shared, GATE, 1, GATE_WAIT_MS);
    return wait.async ? wait.value.then(() => {}) : null;
  };
  const ended = () => {
    Atomics.add(shared, WRITES, 1);
    Atomics.notify(shared, WRITES);
  };
  const ifOpen = <T>(write: () => T): { ran: true; value: T } | { ran: false } => {
    // Counted as started before the gate is read, and the thread reads the count after closing it: either this
    // write sees the gate closed, or the thread sees the write running and waits for its end.
    Atomics.add(shared, WRITES, 1);
    if (Atomics.load(shared, GATE) === 0) {
      try {
        return { ran: true, value: write() };
      } finally {
        ended();
      }
    }
    // Not started after all: the count is as before, so that a checkpoint meanwhile still counts as between two writes.
    Atomics.sub(shared, WRITES, 1);
    Atomics.notify(shared, WRITES);
    return { ran: false };
  };
  const whenOpen = async <T>(write: () => T): Promise<T> => {
    for (;;) {
      await closed();
      const result = ifOpen(write);
      if (result.ran) return result.value;
    }
  };
  return {
    write(write) {
      const result = ifOpen(write);
      return result.ran ? result.value : whenOpen(write);
    },
    ifOpen,
    closed,
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
