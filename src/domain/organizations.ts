/** Organizations and their API keys: what operators create and every request is authenticated against. */

export interface Organization {
  id: string;
  name: string;
  /** Paused pending billing review: every decision request gets 403. */
  paused: boolean;
  createdAtMs: number;
}

/** The UTC period a key's budget counts spend in. */
export type BudgetPeriod = "day" | "month";

export interface KeyBudget {
  /** The most the key may spend (settled and reserved together) in one period, in microUSD. */
  limitMicrousd: number;
  period: BudgetPeriod;
}

/** A key's own limits, within its organization's: set at creation, changed later (null clears). */
export interface KeySettings {
  /** Refused from this time (401). */
  expiresAtMs: number | null;
  /** The public model names the key may use (403 for another); null: every model. */
  models: string[] | null;
  /** The key's own per-minute request limit (429), counted beside its organization's; null: only the organization's. */
  requestsPerMinute: number | null;
  /** Paid mode: the most the key may spend per UTC day or month (402), reserved at admission like credits. */
  budget: KeyBudget | null;
}

export const NO_KEY_SETTINGS: KeySettings = Object.freeze({ expiresAtMs: null, models: null, requestsPerMinute: null, budget: null });

export interface ApiKeyRecord extends KeySettings {
  id: string;
  orgId: string;
  name: string | null;
  /** sha256 of the whole raw key, lowercase hex. The raw key is never stored. */
  hash: string;
  createdAtMs: number;
  revokedAtMs: number | null;
  /**
   * The id of the first key of its chain of rotations (its own id when it replaced no key): a key and the keys that
   * replaced it share one budget spend and one per-minute count.
   */
  lineageId: string;
  /** Rotated: the id of the key that replaced it. */
  replacedBy: string | null;
  /** Rotated: the end of its grace period, from which it is refused (401). */
  retiresAtMs: number | null;
  /** The last request it authenticated, written about once a minute per instance; null: none recorded. */
  lastUsedAtMs: number | null;
}
