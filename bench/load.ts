import autocannon from "autocannon";
import { Pool } from "undici";

/** Load generators of the benchmarks: a closed loop (autocannon) and an open loop at an even pace (undici). */

export function median(xs: number[]): number {
  const s = xs.filter(Number.isFinite).sort((a, b) => a - b);
  if (s.length === 0) return Number.NaN;
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

export function percentile(times: number[], p: number): number {
  if (times.length === 0) return Number.NaN;
  const sorted = Float64Array.from(times).sort();
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]!;
}

export interface Endpoint {
  url: string;
  /** The API keys the requests take in turn (none: no authorization header). */
  keys?: readonly string[];
}

/** What a load saw: every 2xx response time (ms), the requests answered, the failures, the wall time. */
export interface Samples {
  times: number[];
  requests: number;
  failures: number;
  seconds: number;
}

/** The headers of a target's `n`th request. */
export const headersOf = (t: Endpoint, n = 0) => {
  const key = t.keys?.length ? t.keys[n % t.keys.length] : undefined;
  return { "content-type": "application/json", ...(key ? { authorization: `Bearer ${key}` } : {}) };
};

/** Closed loop at `connections` (autocannon): `amount` requests, or for `seconds`. */
export async function saturate(
  target: Endpoint,
  body: string,
  opts: { connections: number; amount?: number; seconds?: number },
): Promise<Samples> {
  let sentByAutocannon = 0;
  const times: number[] = [];
  let answered = 0;
  const t0 = performance.now();
  let instance!: autocannon.Instance;
  const done = new Promise<autocannon.Result>((resolve, reject) => {
    instance = autocannon(
      {
        url: `${target.url}/v1/systemone`,
        method: "POST",
        headers: headersOf(target),
        body,
        // Several keys: each request takes the next (one key: the same headers throughout, as before).
        ...((target.keys?.length ?? 0) > 1
          ? { requests: [{ setupRequest: (req: autocannon.Request) => ({ ...req, headers: headersOf(target, sentByAutocannon++) }) }] }
          : {}),
        connections: opts.connections,
        ...(opts.amount ? { amount: opts.amount } : { duration: opts.seconds ?? 1 }),
      },
      (err, result) => (err ? reject(err) : resolve(result)),
    );
  });
  instance.on("response", (_client: unknown, status: number, _bytes: number, ms: number) => {
    answered++;
    if (status >= 200 && status < 300) times.push(ms);
  });
  const result = await done;
  return { times, requests: answered, failures: result.errors + result.non2xx, seconds: (performance.now() - t0) / 1000 };
}

/**
 * Open loop at an even pace (one request every 1000/rate ms, whatever the answers do), with undici; unlike
 * autocannon's overallRate, which lets each connection send its share of a second back to back.
 */
export async function paced(target: Endpoint, body: string, opts: { seconds: number; rate: number }): Promise<Samples> {
  const pool = new Pool(target.url, { connections: 64, pipelining: 1 });
  const times: number[] = [];
  let failures = 0;
  const one = async (n: number) => {
    const t0 = performance.now();
    try {
      const res = await pool.request({ method: "POST", path: "/v1/systemone", headers: headersOf(target, n), body });
      await res.body.arrayBuffer();
      if (res.statusCode >= 200 && res.statusCode < 300) times.push(performance.now() - t0);
      else failures++;
    } catch {
      failures++;
    }
  };
  const { sent, seconds } = await evenly(one, opts);
  await pool.close();
  return { times, requests: sent, failures, seconds };
}

/**
 * Calls `one(0)`, `one(1)`, … `rate` times a second for `seconds`, evenly (open loop: a call does not wait for the
 * ones before it), and waits for every call to end: how many were made, and the seconds from the first to the end.
 * `one` handles its own failures (a rejection would go unhandled until every call has been made).
 */
export async function evenly(
  one: (n: number) => Promise<void>,
  opts: { seconds: number; rate: number },
): Promise<{ sent: number; seconds: number }> {
  let sent = 0;
  const total = Math.round(opts.rate * opts.seconds);
  const inFlight = new Set<Promise<void>>();
  const start = performance.now();
  await new Promise<void>((resolve) => {
    const tick = setInterval(() => {
      const due = Math.min(total, Math.floor(((performance.now() - start) * opts.rate) / 1000) + 1);
      while (sent < due) {
        const p = one(sent++).finally(() => inFlight.delete(p));
        inFlight.add(p);
      }
      if (sent >= total) {
        clearInterval(tick);
        resolve();
      }
    }, 1);
  });
  await Promise.all(inFlight);
  return { sent, seconds: (performance.now() - start) / 1000 };
}
