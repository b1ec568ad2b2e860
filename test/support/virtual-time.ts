import type { RouterTimers } from "../../src/models/routing/types.ts";

/** Lets pending promise callbacks and immediates run. */
export async function flush(): Promise<void> {
  for (let i = 0; i < 3; i++) await new Promise<void>((r) => setImmediate(r));
}

/** Timers on a clock that only moves when told to: deadlines, cooldowns and checks without real waiting. */
export class VirtualTime implements RouterTimers {
  now = 0;
  private seq = 0;
  private readonly pending = new Map<number, { at: number; fn: () => void }>();
  readonly nowMs = () => this.now;
  setTimeout = (fn: () => void, ms: number): unknown => {
    const id = ++this.seq;
    this.pending.set(id, { at: this.now + Math.max(0, ms), fn });
    return id;
  };
  clearTimeout = (handle: unknown): void => {
    this.pending.delete(handle as number);
  };
  get timerCount(): number {
    return this.pending.size;
  }
  /** Moves the clock forward, firing due timers in order and letting promises settle in between. */
  async advance(ms: number): Promise<void> {
    const target = this.now + ms;
    for (;;) {
      await flush();
      let next: [number, { at: number; fn: () => void }] | undefined;
      for (const entry of this.pending) if (entry[1].at <= target && (next === undefined || entry[1].at < next[1].at)) next = entry;
      if (next === undefined) break;
      this.pending.delete(next[0]);
      this.now = next[1].at;
      next[1].fn();
    }
    this.now = target;
    await flush();
  }
}
