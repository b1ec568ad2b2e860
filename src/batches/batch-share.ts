/** How often the share is adjusted. */
const TICK_MS = 100;
/** Above this event-loop utilization, with interactive requests arriving, the share is halved. */
const BUSY_ABOVE = 0.75;

/**
 * How many batch requests this instance may run beside its interactive ones, so that interactive requests go first:
 * halved every TICK_MS in which interactive requests arrived while the event loop was busy (above BUSY_ABOVE of the
 * tick), grown by one in a tick when they arrived and it was not, and by a quarter of the most when none arrived.
 */
export class BatchShare {
  #share: number;
  #timer: NodeJS.Timeout | null = null;
  #lastStarts = 0;
  #lastLoop = performance.eventLoopUtilization();

  constructor(
    private readonly most: number,
    /** Interactive requests started so far in this process (a count that only grows). */
    private readonly interactiveStarts: () => number,
  ) {
    this.#share = most;
    this.#lastStarts = interactiveStarts();
  }

  get share(): number {
    return this.#share;
  }

  start(): void {
    this.stop();
    this.#lastStarts = this.interactiveStarts();
    this.#lastLoop = performance.eventLoopUtilization();
    this.#timer = setInterval(() => this.adjust(), TICK_MS);
    this.#timer.unref();
  }

  stop(): void {
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = null;
  }

  /** One tick: `utilization` of the event loop since the last (measured when not given). */
  adjust(utilization?: number): void {
    const loop = performance.eventLoopUtilization();
    const busy = utilization ?? performance.eventLoopUtilization(loop, this.#lastLoop).utilization;
    this.#lastLoop = loop;
    const starts = this.interactiveStarts();
    const interactive = starts !== this.#lastStarts;
    this.#lastStarts = starts;
    if (interactive && busy > BUSY_ABOVE) this.#share = Math.max(1, Math.floor(this.#share / 2));
    else if (interactive) this.#share = Math.min(this.most, this.#share + 1);
    else this.#share = Math.min(this.most, this.#share + Math.max(1, Math.floor(this.most / 4)));
  }
}
