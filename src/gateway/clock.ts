export interface Clock {
  /** Wall-clock time in epoch milliseconds (quota days, reservation expiry, record times). */
  nowMs(): number;
}

export const systemClock: Clock = { nowMs: () => Date.now() };

/** A clock for tests: starts at the given time and moves only when told. */
export class FixedClock implements Clock {
  constructor(private current: number) {}
  nowMs(): number {
    return this.current;
  }
  set(ms: number): void {
    this.current = ms;
  }
  advance(ms: number): void {
    this.current += ms;
  }
}
