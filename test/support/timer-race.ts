/**
 * Timing relations a busy machine cannot break. A test never asserts how long something took; when "it does not
 * wait for X" is the point, it races the work against a timer started at the same moment instead. Timers of one
 * process fire in the order they are due however late the process runs, so work bounded by a shorter timer of
 * its own (a command timeout, a deadline), or by nothing but promises, settles first under any load.
 */

/** True when `work` settles (resolves or rejects) before a timer of `ms`, started now, fires. */
export async function settlesBefore(work: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const guard = new Promise<false>((resolve) => {
    timer = setTimeout(() => resolve(false), ms);
  });
  try {
    return await Promise.race([
      work.then(
        () => true,
        () => true,
      ),
      guard,
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/** Polls `probe` until it returns a value other than undefined; fails after `limitMs` (a bound against hanging, not a claim). */
export async function eventually<T>(
  what: string,
  probe: () => Promise<T | undefined> | T | undefined,
  limitMs = 60_000,
  everyMs = 20,
): Promise<T> {
  const until = Date.now() + limitMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > until) throw new Error(`gave up waiting for ${what} after ${limitMs} ms`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}
