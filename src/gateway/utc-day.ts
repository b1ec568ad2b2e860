const DAY_MS = 86_400_000;

/** The UTC calendar day of an instant, "YYYY-MM-DD": preview counters are keyed by it. */
export function utcDay(nowMs: number): string {
  return new Date(nowMs).toISOString().slice(0, 10);
}

/** Milliseconds from an instant to the next 00:00:00.000 UTC (never 0: at midnight itself, a whole day). */
export function msUntilUtcMidnight(nowMs: number): number {
  return DAY_MS - (((nowMs % DAY_MS) + DAY_MS) % DAY_MS);
}
