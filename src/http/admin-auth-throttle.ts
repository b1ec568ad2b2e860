import { isIPv6 } from "node:net";

export interface AdminAuthThrottleOptions {
  /** Failed authentications from one address within `windowMs` that throttle it. */
  maxFailures: number;
  windowMs: number;
  /** Addresses tracked at most; past that, the least recently seen one is forgotten. */
  maxAddresses: number;
  nowMs: () => number;
}

export const ADMIN_AUTH_THROTTLE: Omit<AdminAuthThrottleOptions, "nowMs"> = {
  maxFailures: 10,
  windowMs: 60_000,
  maxAddresses: 10_000,
};

/** What happened at one address since its last warning: logged once per window, not per attempt. */
export interface ThrottleWarning {
  /** Failed authentications since the last warning (this one included). */
  failed: number;
  /** Requests refused while throttled since the last warning. */
  refused: number;
  /** Throttled now: every request from the address is refused for this long. */
  throttledForMs: number | null;
}

interface Entry {
  /** Times of the latest failures, oldest first, at most maxFailures of them. */
  failures: number[];
  lastWarningAtMs: number | null;
  failedSinceWarning: number;
  refusedSinceWarning: number;
}

/**
 * Throttles admin authentication per client address: once an address has failed `maxFailures` times within
 * `windowMs`, every request from it is refused (a correct token too, unchecked) until the oldest of those failures
 * leaves the window. IPv6 addresses count per /64, the block one client usually holds. Memory is bounded by
 * `maxAddresses`.
 */
export class AdminAuthThrottle {
  readonly #entries = new Map<string, Entry>();

  constructor(private readonly options: AdminAuthThrottleOptions) {}

  /** How long the address is still throttled, or null when it may try. */
  retryAfterMs(address: string): number | null {
    const entry = this.#entries.get(addressKey(address));
    return entry ? this.#throttledFor(entry, this.options.nowMs()) : null;
  }

  /** A request refused while throttled; a warning when none was given for the address within the window. */
  refused(address: string): ThrottleWarning | null {
    const now = this.options.nowMs();
    const entry = this.#touch(addressKey(address));
    entry.refusedSinceWarning++;
    return this.#warning(entry, now);
  }

  /** A failed authentication; a warning when none was given for the address within the window. */
  failed(address: string): ThrottleWarning | null {
    const now = this.options.nowMs();
    const entry = this.#touch(addressKey(address));
    entry.failures.push(now);
    if (entry.failures.length > this.options.maxFailures) entry.failures.shift();
    entry.failedSinceWarning++;
    return this.#warning(entry, now);
  }

  /** A successful authentication forgets the address's failures (its warning interval stays). */
  succeeded(address: string): void {
    const entry = this.#entries.get(addressKey(address));
    if (entry) entry.failures = [];
  }

  /** How many addresses are tracked (for tests). */
  get size(): number {
    return this.#entries.size;
  }

  #throttledFor(entry: Entry, now: number): number | null {
    const { maxFailures, windowMs } = this.options;
    if (entry.failures.length < maxFailures) return null;
    const until = entry.failures[entry.failures.length - maxFailures]! + windowMs;
    return until > now ? until - now : null;
  }

  #warning(entry: Entry, now: number): ThrottleWarning | null {
    if (entry.lastWarningAtMs !== null && now - entry.lastWarningAtMs < this.options.windowMs) return null;
    const warning = {
      failed: entry.failedSinceWarning,
      refused: entry.refusedSinceWarning,
      throttledForMs: this.#throttledFor(entry, now),
    };
    entry.lastWarningAtMs = now;
    entry.failedSinceWarning = 0;
    entry.refusedSinceWarning = 0;
    return warning;
  }

  /** The address's entry, now the most recently seen; the least recently seen ones go when the map is full. */
  #touch(key: string): Entry {
    let entry = this.#entries.get(key);
    if (entry) this.#entries.delete(key);
    else {
      entry = { failures: [], lastWarningAtMs: null, failedSinceWarning: 0, refusedSinceWarning: 0 };
      while (this.#entries.size >= this.options.maxAddresses) {
        const oldest = this.#entries.keys().next().value;
        if (oldest === undefined) break;
        this.#entries.delete(oldest);
      }
    }
    this.#entries.set(key, entry);
    return entry;
  }
}

/** The address an entry is kept under: IPv4 as it is (also when IPv4-mapped), IPv6 by its /64 prefix. */
export function addressKey(address: string): string {
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  if (mapped) return mapped[1]!;
  if (!isIPv6(address)) return address;
  return `${expandIPv6(address).slice(0, 4).join(":")}::/64`;
}

/** The eight groups of an IPv6 address (no zone, no embedded IPv4 handled beyond what isIPv6 accepts). */
function expandIPv6(address: string): string[] {
  const bare = address.split("%")[0]!.toLowerCase();
  const [head, tail] = bare.includes("::") ? bare.split("::") : [bare, null];
  const left = head ? head.split(":") : [];
  const right = tail ? tail.split(":") : [];
  const missing = 8 - left.length - right.length;
  const groups = tail === null ? left : [...left, ...Array<string>(Math.max(0, missing)).fill("0"), ...right];
  return groups.map((g) => (/^[0-9a-f]{1,4}$/.test(g) ? g.replace(/^0+(?=.)/, "") : g));
}
