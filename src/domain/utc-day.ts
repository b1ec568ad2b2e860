/** Milliseconds in a UTC day (no leap seconds in epoch time). */
export const DAY_MS = 86_400_000;

let cached = { from: 0, to: 0, day: "1970-01-01" };

/** The UTC calendar day of an instant, "YYYY-MM-DD": preview counters are keyed by it. */
export function utcDay(nowMs: number): string {
  if (nowMs < cached.from || nowMs >= cached.to) {
    const from = nowMs - (((nowMs % DAY_MS) + DAY_MS) % DAY_MS);
    cached = { from, to: from + DAY_MS, day: new Date(from).toISOString().slice(0, 10) };
  }
  return cached.day;
}

/** Milliseconds from an instant to the next 00:00:00.000 UTC (never 0: at midnight itself, a whole day). */
export function msUntilUtcMidnight(nowMs: number): number {
  return DAY_MS - (((nowMs % DAY_MS) + DAY_MS) % DAY_MS);
}

/** The key of the UTC period an instant is in, for key budgets: its day "YYYY-MM-DD" or its month "YYYY-MM". */
export function utcPeriod(period: "day" | "month", nowMs: number): string {
  const day = utcDay(nowMs);
  return period === "day" ? day : day.slice(0, 7);
}

/** Milliseconds from an instant to the start of the next UTC day or calendar month (never 0). */
export function msUntilPeriodEnd(period: "day" | "month", nowMs: number): number {
  if (period === "day") return msUntilUtcMidnight(nowMs);
  const d = new Date(nowMs);
  return Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1) - nowMs;
}
