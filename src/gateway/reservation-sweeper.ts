import type { Store } from "../store/store.ts";
import type { Clock } from "./clock.ts";

const BATCH = 500;

/**
 * Returns the funds of reservations whose time ran out (a crashed or stuck request). Runs every
 * `intervalMs`; each pass expires due reservations in batches until none is left.
 */
export function startReservationSweeper(
  store: Store,
  clock: Clock,
  intervalMs: number,
  onError: (err: unknown) => void,
): { stop(): Promise<void>; sweepNow(): Promise<number> } {
  let running: Promise<number> | null = null;
  const sweepNow = () => {
    running ??= (async () => {
      let total = 0;
      try {
        for (;;) {
          const n = await store.expireReservations({ nowMs: clock.nowMs(), limit: BATCH });
          total += n;
          if (n < BATCH) return total;
        }
      } finally {
        running = null;
      }
    })();
    return running;
  };
  const timer = setInterval(() => sweepNow().catch(onError), intervalMs);
  timer.unref();
  return {
    sweepNow,
    async stop() {
      clearInterval(timer);
      await running?.catch(() => undefined);
    },
  };
}
