/**
 * When a download's progress is worth a log line: plain lines (no carriage-return bar, which would interleave with the
 * request log and break in files), each after a step of `stepPercent`, but not more often than every `minIntervalMs`;
 * after `maxSilenceMs` without a line, one more even without a step (a slow download still shows it moves); and always
 * the last one (100%).
 */
export interface ProgressLogOptions {
  stepPercent: number;
  minIntervalMs: number;
  maxSilenceMs: number;
  now: () => number;
}

export const DEFAULT_PROGRESS_LOG: Omit<ProgressLogOptions, "now"> = { stepPercent: 10, minIntervalMs: 3000, maxSilenceMs: 30_000 };

/** A function that answers, for each progress event, whether to log it. */
export function progressLogGate(options: ProgressLogOptions): (downloadedBytes: number, totalBytes: number) => boolean {
  const startedAt = options.now();
  let lastAt = startedAt;
  let lastStep = 0;
  let finished = false;
  return (downloadedBytes, totalBytes) => {
    if (finished || totalBytes <= 0) return false;
    const now = options.now();
    if (downloadedBytes >= totalBytes) {
      finished = true;
      return true;
    }
    const step = Math.floor((downloadedBytes / totalBytes) * (100 / options.stepPercent));
    const due = (step > lastStep && now - lastAt >= options.minIntervalMs) || now - lastAt >= options.maxSilenceMs;
    if (!due) return false;
    lastAt = now;
    lastStep = step;
    return true;
  };
}
