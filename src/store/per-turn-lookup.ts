/**
 * Lookups by key gathered over one event-loop turn and answered by one query: every request that arrives in the
 * same turn costs the database one round trip together, not one each. Each caller gets its own row (or
 * undefined) or the query's error.
 */
export function perTurnLookup<V>(load: (keys: string[]) => Promise<Map<string, V>>): (key: string) => Promise<V | undefined> {
  let pending: Map<string, { resolve: (v: V | undefined) => void; reject: (e: unknown) => void }[]> | null = null;
  const flush = async (batch: NonNullable<typeof pending>) => {
    try {
      const found = await load([...batch.keys()]);
      for (const [key, waiters] of batch) for (const w of waiters) w.resolve(found.get(key));
    } catch (err) {
      for (const waiters of batch.values()) for (const w of waiters) w.reject(err);
    }
  };
  return (key) =>
    new Promise((resolve, reject) => {
      if (!pending) {
        const batch = new Map<string, { resolve: (v: V | undefined) => void; reject: (e: unknown) => void }[]>();
        pending = batch;
        setImmediate(() => {
          pending = null;
          void flush(batch);
        });
      }
      const waiters = pending.get(key);
      if (waiters) waiters.push({ resolve, reject });
      else pending.set(key, [{ resolve, reject }]);
    });
}
