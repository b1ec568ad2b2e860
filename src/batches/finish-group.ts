import { type FinishInput, MAX_FINISHES_PER_CALL } from "../store/batches.ts";

interface Waiting {
  input: FinishInput;
  resolve: (written: boolean) => void;
  reject: (err: unknown) => void;
}

/**
 * The results of batch requests written together: those finished while a write is in progress (or in the same
 * event-loop turn) go in the next transaction, up to MAX_FINISHES_PER_CALL, so that a running batch costs one write
 * per group of results instead of one per request. Each finish resolves once its transaction committed.
 */
export class FinishGroup {
  #waiting: Waiting[] = [];
  #writing = false;
  #scheduled = false;

  constructor(private readonly write: (inputs: readonly FinishInput[]) => Promise<boolean[]>) {}

  finish(input: FinishInput): Promise<boolean> {
    return new Promise((resolve, reject) => {
      this.#waiting.push({ input, resolve, reject });
      this.#schedule();
    });
  }

  #schedule(): void {
    if (this.#writing || this.#scheduled) return;
    this.#scheduled = true;
    setImmediate(() => {
      this.#scheduled = false;
      void this.#flush();
    });
  }

  async #flush(): Promise<void> {
    const group = this.#waiting.splice(0, MAX_FINISHES_PER_CALL);
    if (group.length === 0) return;
    this.#writing = true;
    try {
      const written = await this.write(group.map((w) => w.input));
      for (const [i, w] of group.entries()) w.resolve(written[i] === true);
    } catch (err) {
      for (const w of group) w.reject(err);
    } finally {
      this.#writing = false;
      if (this.#waiting.length > 0) this.#schedule();
    }
  }
}
