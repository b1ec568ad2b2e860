/**
 * Units of a shared counter (the service-wide preview counter) that this process added to the counter and has not
 * used yet. A transaction that needs a unit and finds none here adds a block of them to the counter (within its
 * limit) and keeps the rest, so most transactions neither read nor lock the counter's row (docs/architecture.md,
 * "The service-wide counter in blocks"). The counter therefore holds the units handed out, never fewer than the
 * requests counted; units held here when the process stops without returning them stay counted for their day.
 */
export class SharedBlock {
  #day = "";
  #left = 0;

  /** Takes up to `n` units of `day`; returns how many it took. */
  take(day: string, n: number): number {
    if (day !== this.#day) return 0;
    const taken = Math.min(n, this.#left);
    this.#left -= taken;
    return taken;
  }

  /** Keeps `n` units of `day` that the counter holds and no request used. A later day's units replace an earlier day's. */
  give(day: string, n: number): void {
    if (n <= 0 || day < this.#day) return;
    if (day > this.#day) [this.#day, this.#left] = [day, 0];
    this.#left += n;
  }

  /** Everything held, emptied: what a stopping process gives back to the counter. */
  drain(): { day: string; count: number } | null {
    if (this.#left === 0) return null;
    const held = { day: this.#day, count: this.#left };
    this.#left = 0;
    return held;
  }
}

/**
 * How many units a transaction adds to the counter when it holds none: `block`, but never more than an eighth of what
 * is left below the limit (and at least 1), so that near the limit the last units go one at a time to the process
 * whose request needs them, not into another process's block.
 */
export function blockSize(leftBelowLimit: number, block: number): number {
  return Math.max(1, Math.min(block, Math.floor(leftBelowLimit / 8)));
}

/**
 * One transaction's use of a SharedBlock, by day: the units it took before it ran, how many of them it used, and the
 * units it added to the counter beyond what it used. Unused units go back to the block as soon as the decisions are
 * made (they were never the transaction's); the added ones once it committed; the used ones if it surely rolled back.
 */
export class BlockUse {
  readonly #days = new Map<string, { taken: number; used: number; added: number }>();

  constructor(private readonly block: SharedBlock) {}

  #day(day: string) {
    const d = this.#days.get(day) ?? { taken: 0, used: 0, added: 0 };
    this.#days.set(day, d);
    return d;
  }

  /** Takes up to `n` units of `day` from the block for this transaction; returns how many it took. */
  reserve(day: string, n: number): number {
    const d = this.#day(day);
    const taken = this.block.take(day, n);
    d.taken += taken;
    return taken;
  }

  /** True when this transaction holds a unit of `day` (taken or added) not yet used. */
  holds(day: string): boolean {
    const d = this.#days.get(day);
    return d !== undefined && (d.used < d.taken || d.added > 0);
  }

  /** Uses one unit of `day` it holds, a taken one first; false when it holds none. */
  use(day: string): boolean {
    const d = this.#days.get(day);
    if (d && d.used < d.taken) d.used += 1;
    else if (d && d.added > 0) d.added -= 1;
    else return false;
    return true;
  }

  /** Added `n` units of `day` to the counter, one of them used now. */
  add(day: string, n: number): void {
    this.#day(day).added += n - 1;
  }

  /** The decisions are made: the taken units it did not use go back to the block. */
  decided(): void {
    for (const [day, d] of this.#days) {
      this.block.give(day, d.taken - d.used);
      d.taken = d.used;
    }
  }

  /** Committed: the units it added and did not use are the block's. */
  committed(): void {
    for (const [day, d] of this.#days) this.block.give(day, d.added);
    this.#days.clear();
  }

  /** Surely rolled back (nothing it wrote holds): the taken units it used are free again. */
  rolledBack(): void {
    for (const [day, d] of this.#days) this.block.give(day, d.used);
    this.#days.clear();
  }
}
