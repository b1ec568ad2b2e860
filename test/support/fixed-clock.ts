import type { Clock } from "../../src/domain/clock.ts";

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
