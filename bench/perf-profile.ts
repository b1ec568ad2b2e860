/**
 * On-CPU profile of one process with Linux `perf` (cpu-clock samples), for bench/gateway.ts --perf. Unlike V8's
 * profiler, whose samples weigh wall time while not idle (a thread preempted inside a syscall, e.g. writev waking
 * the receiving process on loopback, piles up samples there), perf samples only what ran on a CPU, and sees the
 * kernel (the network stack, syscalls) and native code (SQLite, V8's runtime and GC) too. The process must run with
 * `node --perf-basic-prof` so that JIT-compiled JavaScript has names (perf reads /tmp/perf-<pid>.map).
 */
import { execFileSync, spawn } from "node:child_process";
import { rmSync } from "node:fs";

/** True when `perf` can be run here. */
export function perfAvailable(): boolean {
  try {
    execFileSync("perf", ["--version"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}

/** Samples the process (all its threads) for `seconds` into `file`; resolves when perf has written it. */
export function perfRecord(pid: number, seconds: number, file: string): Promise<void> {
  const perf = spawn("perf", ["record", "-e", "cpu-clock", "-F", "999", "-p", String(pid), "-o", file, "--", "sleep", String(seconds)], {
    stdio: "ignore",
  });
  return new Promise((resolve, reject) => {
    perf.once("error", reject);
    perf.once("exit", (code) => (code === 0 ? resolve() : reject(new Error(`perf record exited with ${code}`))));
  });
}

function report(file: string, sort: string, limit: number): string[] {
  const text = execFileSync("perf", ["report", "-i", file, "--stdio", "-q", "--sort", sort, "--percent-limit", String(limit)], {
    encoding: "utf8",
    maxBuffer: 64 * 1024 * 1024,
    stdio: ["ignore", "pipe", "ignore"],
  });
  return text.split("\n").filter((l) => l.trim() !== "");
}

/** "[JIT] tid 1234" → a stable name; long JIT symbol names lose their file:// prefix. */
const tidy = (line: string) =>
  line
    .replace(/\[JIT\] tid \d+/, "[JIT: V8-compiled JS]")
    .replace(/file:\/\/\S*?\/(src|node_modules)\//g, "$1/")
    .replace(/\s{2,}/g, "  ")
    .trim();

/** Node options for a process to profile: JIT symbols in /tmp/perf-<pid>.map, and V8's log (which they turn on) into `logFile`. */
export const perfNodeArgs = (logFile: string) => ["--perf-basic-prof", "--no-logfile-per-isolate", `--logfile=${logFile}`];

/** Removes the JIT symbol map node wrote for perf. */
export const removePerfMap = (pid: number) => rmSync(`/tmp/perf-${pid}.map`, { force: true });

/** What a sampled symbol is, by its binary and name: the first rule that matches. */
const KINDS: Array<[string, (dso: string, sym: string) => boolean]> = [
  [
    "kernel: TCP/IP on loopback, sockets, softirq",
    (d, s) => d.includes("kernel") && /tcp|skb|sock|inet|ip_|ipv|net_|netif|__dev|loopback|softirq|sendmsg|recvmsg|nf_|rcv/.test(s),
  ],
  [
    "kernel: scheduler, wake-ups, futexes, epoll",
    (d, s) =>
      d.includes("kernel") &&
      /sched|switch|spin_unlock|wake|futex|epoll|ep_|enqueue|dequeue|update_|select_task|ttwu|pick_next|idle/.test(s),
  ],
  ["kernel: other (syscall entry, file I/O and locks, page faults)", (d) => d.includes("kernel")],
  ["SQLite (better_sqlite3.node)", (d) => d.includes("better_sqlite3")],
  [
    "V8 garbage collection",
    (d, s) =>
      d === "node" &&
      /Scaveng|MarkCompact|Marking|Sweep|Evacuat|Heap::|GCTracer|MemoryAllocator|MinorM|GC|Remembered|SlotSet|Compactor/.test(s),
  ],
  ["V8 JSON.parse / JSON.stringify", (d, s) => d === "node" && /Json(Stringifier|Parser)|JsonParse|JsonStringify/.test(s)],
  [
    "V8 compilers (TurboFan, Maglev, Sparkplug, parser)",
    (d, s) => d === "node" && /compiler::|maglev|baseline::|Parser|Scanner|Compile|Turbo/.test(s),
  ],
  ["V8 builtins (interpreter, inline caches, promises, strings)", (d, s) => d === "node" && /^Builtins_/.test(s)],
  [
    "V8 runtime: property lookups, object shapes",
    (d, s) =>
      d === "node" &&
      /LookupIterator|Map::|MigrateToMap|Transition|Descriptor|Dictionary|PropertyArray|JSObject::|Object::Set|Object::Get|KeyAccumulator|FastKeyAccumulator/.test(
        s,
      ),
  ],
  [
    "V8 runtime: strings and numbers (UTF-8, hashing, dtoa)",
    (d, s) => d === "node" && /String|Utf8|Dtoa|Strtod|Internaliz|Hash|NumberTo|DoubleTo/.test(s),
  ],
  ["HTTP parsing (llhttp)", (d, s) => d === "node" && /llhttp/.test(s)],
  ["V8-compiled JavaScript (JIT code)", (d) => d.startsWith("[JIT")],
  ["libc (malloc/free, memcpy)", (d) => d.startsWith("libc")],
  ["node/V8 C++ runtime, libuv, OpenSSL", () => true],
];

/** Shares of the samples by kind (see KINDS), summed over every symbol. */
function byKind(file: string): string[] {
  const shares = new Map<string, number>();
  for (const line of report(file, "dso,sym", 0)) {
    const m = /^\s*([\d.]+)%\s+(\S.*?)\s+\[[.k]\]\s+(.*)$/.exec(line);
    if (!m) continue;
    const dso = m[2]!.startsWith("[JIT]") ? "[JIT]" : m[2]!.trim();
    const kind = KINDS.find(([, test]) => test(dso, m[3]!))![0];
    shares.set(kind, (shares.get(kind) ?? 0) + Number(m[1]));
  }
  return [...shares].sort((a, b) => b[1] - a[1]).map(([kind, share]) => `| ${share.toFixed(1)} % | ${kind} |`);
}

/** Shares of the samples by binary (kernel, node, JIT code, native addons, libc), by kind, and the top symbols (needs the map file). */
export function perfSummary(file: string, top = 25): string {
  const byDso = report(file, "dso", 0.5).map((l) => `| ${tidy(l).replace(/^(\S+%)\s+/, "$1 | ")} |`);
  const bySymbol = report(file, "dso,sym", 0.4)
    .slice(0, top)
    .map(
      (l) =>
        `| ${tidy(l)
          .replace(/^(\S+%)\s+/, "$1 | ")
          .replace(/\s+\[([.k])\]\s+/, " | [$1] ")} |`,
    );
  return [
    "| on-CPU samples | binary |",
    "| ---: | --- |",
    ...byDso,
    "",
    "| on-CPU samples | kind |",
    "| ---: | --- |",
    ...byKind(file),
    "",
    "| on-CPU samples | binary | [k]ernel / [.] user: symbol |",
    "| ---: | --- | --- |",
    ...bySymbol,
  ].join("\n");
}
