/**
 * CPU time of processes from /proc, for bench/gateway.ts: what a process consumed does not depend on how the two
 * cores were shared with the load generator and the other processes, unlike its throughput.
 *
 * A process's CPU is the sum over its threads of the first field of /proc/<pid>/task/<tid>/schedstat (nanoseconds
 * on a CPU; Node's main thread, libuv pool, V8 GC helpers and worker threads such as the SQLite checkpointer all
 * count). utime + stime of /proc/<pid>/stat (clock ticks, 10 ms) is read too as a coarse cross-check.
 */
import { execFileSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";

const CLK_TCK = (() => {
  try {
    return Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;
  } catch {
    return 100;
  }
})();

function readOr(path: string, fallback: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return fallback;
  }
}

/** Fields of /proc/<pid>/stat after the command name (which may contain spaces): [0] is field 3 (state). */
function statFields(pid: number): string[] | null {
  const text = readOr(`/proc/${pid}/stat`, "");
  const close = text.lastIndexOf(")");
  return close < 0 ? null : text.slice(close + 2).split(" ");
}

/** Nanoseconds on a CPU of every live thread of the process (schedstat), 0 once it is gone. */
export function processCpuNs(pid: number): number {
  let tids: string[];
  try {
    tids = readdirSync(`/proc/${pid}/task`);
  } catch {
    return 0;
  }
  let ns = 0;
  for (const tid of tids) ns += Number(readOr(`/proc/${pid}/task/${tid}/schedstat`, "0").split(" ")[0]);
  return ns;
}

/** utime and stime of the whole process (all threads, also exited ones) in nanoseconds, at clock-tick resolution. */
export function processTicksNs(pid: number): { user: number; system: number } {
  const f = statFields(pid);
  return f ? { user: (Number(f[11]) * 1e9) / CLK_TCK, system: (Number(f[12]) * 1e9) / CLK_TCK } : { user: 0, system: 0 };
}

/** The readings of one process at one moment: schedstat, and utime/stime (user and kernel time, coarse). */
export interface CpuReading {
  ns: number;
  userTicksNs: number;
  systemTicksNs: number;
}

export function readCpu(pid: number): CpuReading {
  const ticks = processTicksNs(pid);
  return { ns: processCpuNs(pid), userTicksNs: ticks.user, systemTicksNs: ticks.system };
}

export const cpuSince = (before: CpuReading, after: CpuReading): CpuReading => ({
  ns: after.ns - before.ns,
  userTicksNs: after.userTicksNs - before.userTicksNs,
  systemTicksNs: after.systemTicksNs - before.systemTicksNs,
});

export const addCpu = (a: CpuReading, b: CpuReading): CpuReading => ({
  ns: a.ns + b.ns,
  userTicksNs: a.userTicksNs + b.userTicksNs,
  systemTicksNs: a.systemTicksNs + b.systemTicksNs,
});

// ── PostgreSQL ───────────────────────────────────────────────────────────────────────────────

/** CPU nanoseconds of PostgreSQL processes by pid: the backends of one database, and the server's own processes. */
export interface PostgresCpu {
  backends: Map<number, number>;
  background: Map<number, number>;
}

/**
 * PostgreSQL's processes on this machine by their titles (`postgres: 15/main: USER DB HOST(PORT) STATE` for a
 * backend): the backends connected to `database`, and the processes that serve every database (postmaster,
 * walwriter, checkpointer, background writer, autovacuum…). Backends of other databases (other people's tests)
 * are left out; the background processes are shared with them.
 */
export function readPostgresCpu(database: string): PostgresCpu {
  const backends = new Map<number, number>();
  const background = new Map<number, number>();
  for (const entry of readdirSync("/proc")) {
    const pid = Number(entry);
    if (!Number.isInteger(pid) || !readOr(`/proc/${pid}/comm`, "").startsWith("postgres")) continue;
    const title = readOr(`/proc/${pid}/cmdline`, "").replace(/\0/g, " ").trim();
    const ns = Number(readOr(`/proc/${pid}/schedstat`, "0").split(" ")[0]);
    if (isClientBackend(title)) {
      if (title.split(/\s+/)[3] === database) backends.set(pid, ns);
    } else {
      background.set(pid, ns);
    }
  }
  return { backends, background };
}

/** Client backends have a HOST(PORT) or [local] in their title; the server's own processes do not. */
function isClientBackend(title: string): boolean {
  return /\(\d+\)|\[local\]/.test(title) && !/autovacuum|walwriter|checkpointer|background writer|launcher|archiver|walsender/.test(title);
}

/** CPU nanoseconds spent between two readings, process by process (a process that exited meanwhile is lost). */
export function postgresCpuSince(before: PostgresCpu, after: PostgresCpu): { backendsNs: number; backgroundNs: number } {
  const since = (a: Map<number, number>, b: Map<number, number>) => {
    let ns = 0;
    for (const [pid, v] of b) ns += v - (a.get(pid) ?? 0);
    return ns;
  };
  return { backendsNs: since(before.backends, after.backends), backgroundNs: since(before.background, after.background) };
}
