export interface Clock {
  /** Wall-clock time in epoch milliseconds (quota days, reservation expiry, record times). */
  nowMs(): number;
}

export const systemClock: Clock = { nowMs: () => Date.now() };
