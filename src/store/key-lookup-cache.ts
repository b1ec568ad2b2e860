/** Entries kept at most; past it the cache starts empty again (keys in use are read again at their next request). */
const MAX_ENTRIES = 10_000;

/**
 * Found keys (with their organization) kept for `ttlMs` after they were read, so that a key's every request does not
 * read it again. Only found keys are kept: an unknown key is read every time. `changed()` (a write to keys or
 * organizations through this store) drops every entry, and a read that began before it is not kept, so a change made
 * through this store shows at once; one made elsewhere (another instance, the CLI on the database) within `ttlMs`.
 * A ttlMs of 0 keeps nothing.
 */
export class KeyLookupCache<V> {
  readonly #entries = new Map<string, { untilMs: number; found: Promise<V> }>();
  #generation = 0;

  constructor(
    private ttlMs = 0,
    private readonly nowMs: () => number = () => performance.now(),
  ) {}

  setTtl(ttlMs: number): void {
    if (!Number.isInteger(ttlMs) || ttlMs < 0) throw new RangeError("the key lookup cache's ttlMs must be an integer of 0 or more");
    this.ttlMs = ttlMs;
    this.#entries.clear();
  }

  /** The kept value of `key`, or `read()`'s, kept when it is found (not undefined) and no change happened meanwhile. */
  get(key: string, read: () => Promise<V | undefined>): Promise<V | undefined> {
    if (this.ttlMs === 0) return read();
    const now = this.nowMs();
    const hit = this.#entries.get(key);
    if (hit !== undefined && now < hit.untilMs) return hit.found;
    if (hit !== undefined) this.#entries.delete(key);
    const generation = this.#generation;
    const found = read();
    found.then(
      (value) => {
        if (value === undefined || generation !== this.#generation) return;
        if (this.#entries.size >= MAX_ENTRIES) this.#entries.clear();
        this.#entries.set(key, { untilMs: now + this.ttlMs, found: Promise.resolve(value) });
      },
      () => undefined,
    );
    return found;
  }

  changed(): void {
    this.#generation++;
    this.#entries.clear();
  }
}
