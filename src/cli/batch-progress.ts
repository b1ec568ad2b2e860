import type { Batch } from "../contract/batches.ts";
import { safeText, type TextSink } from "./output.ts";

/** The most often a progress line is printed when the output is not a terminal. */
export const PLAIN_PROGRESS_INTERVAL_MS = 5000;
const BAR_WIDTH = 24;

export interface ProgressView {
  /** The batch as last polled. */
  update(batch: Batch): void;
  /** The batch at its end: its last state is shown, and a terminal's line is ended. */
  finish(batch: Batch): void;
}

/** The share of requests done, rounded down: 100 only when every request has its result (an empty batch too). */
export function percentDone(batch: Batch): number {
  const { total, succeeded, failed } = batch.request_counts;
  return total === 0 ? 100 : Math.floor(((succeeded + failed) * 100) / total);
}

/** `42/100 done (42%), 40 succeeded, 2 failed, cost 0.0042 USD` */
export function progressText(batch: Batch): string {
  const { total, succeeded, failed } = batch.request_counts;
  return `${succeeded + failed}/${total} done (${percentDone(batch)}%), ${succeeded} succeeded, ${failed} failed, cost ${batch.cost_usd} USD`;
}

function bar(batch: Batch): string {
  const filled = Math.floor((percentDone(batch) * BAR_WIDTH) / 100);
  return `[${"#".repeat(filled)}${".".repeat(BAR_WIDTH - filled)}]`;
}

/**
 * Progress on `sink` (stderr, so stdout keeps only the command's result): on a terminal one line redrawn in place;
 * otherwise a line when the progress changes, at most every PLAIN_PROGRESS_INTERVAL_MS (a new status at once).
 */
export function progressView(sink: TextSink & { isTTY?: boolean }, nowMs: () => number): ProgressView {
  const line = (batch: Batch) => `${safeText(batch.id)} ${batch.status}: ${progressText(batch)}`;
  if (sink.isTTY === true) {
    let shown = "";
    const draw = (batch: Batch) => {
      const text = `${bar(batch)} ${line(batch)}`;
      if (text !== shown) sink.write(`\r\x1b[2K${text}`);
      shown = text;
    };
    return {
      update: draw,
      finish: (batch) => {
        draw(batch);
        sink.write("\n");
      },
    };
  }
  let shown = "";
  let shownStatus = "";
  let shownAtMs = Number.NEGATIVE_INFINITY;
  const print = (batch: Batch, text: string) => {
    sink.write(`${text}\n`);
    shown = text;
    shownStatus = batch.status;
    shownAtMs = nowMs();
  };
  return {
    update: (batch) => {
      const text = line(batch);
      if (text === shown) return;
      if (batch.status !== shownStatus || nowMs() - shownAtMs >= PLAIN_PROGRESS_INTERVAL_MS) print(batch, text);
    },
    finish: (batch) => {
      const text = line(batch);
      if (text !== shown) print(batch, text);
    },
  };
}
