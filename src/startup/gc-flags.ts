import { setFlagsFromString } from "node:v8";

/**
 * V8's allocation-site pretenuring, off in the gateway's process. When most objects made at one place in the code
 * survive a young-generation collection, V8 allocates that place's later objects in the old generation directly.
 * After saturating load the bookkeeping's objects (a batch's column arrays, its statements' values, the rows pg
 * parses) had met that bar, and the decision stayed when the load fell: at 300 req/s on PostgreSQL the old
 * generation then filled at about 6.5 MB/s and a full collection ran every 2–3 s (pauses of 2–15 ms, marking steps
 * of up to 8 ms), each making a burst of slow requests behind the bookkeeping transaction in flight. Those objects
 * live for a transaction, a few milliseconds, so they belong in the young generation (`npx tsx bench/paced-tail.ts`,
 * docs/benchmarks.md).
 *
 * Applied before any other module of the server is evaluated (src/server.ts imports this module first). The flag on
 * node's command line, either way and in any spelling V8 reads (`node --allocation-site-pretenuring dist/server.js`),
 * wins; NODE_OPTIONS may not carry it.
 */
export const PRETENURING_OFF = "--no-allocation-site-pretenuring";

/** V8's spellings of the flag: one or two dashes, `no`, `no-` or `no_`, dashes or underscores. */
const PRETENURING = /^--?(no[-_]?)?allocation[-_]site[-_]pretenuring$/;

/** The V8 flag to set, or null when node's command line already says. */
export function pretenuringFlag(execArgv: readonly string[]): string | null {
  return execArgv.some((arg) => PRETENURING.test(arg)) ? null : PRETENURING_OFF;
}

/** Sets the flag unless node's command line says; returns what it set. */
export function applyPretenuringFlag(execArgv: readonly string[], set: (flags: string) => void = setFlagsFromString): string | null {
  const flag = pretenuringFlag(execArgv);
  if (flag !== null) set(flag);
  return flag;
}

/** What this process set as this module was evaluated (null: node's command line chose). */
export const PRETENURING_APPLIED = applyPretenuringFlag(process.execArgv);
