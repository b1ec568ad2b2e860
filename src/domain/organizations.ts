/** Organizations and their API keys: what operators create and every request is authenticated against. */

export interface Organization {
  id: string;
  name: string;
  /** Paused pending billing review: every decision request gets 403. */
  paused: boolean;
  createdAtMs: number;
}

export interface ApiKeyRecord {
  id: string;
  orgId: string;
  name: string | null;
  /** sha256 of the whole raw key, lowercase hex. The raw key is never stored. */
  hash: string;
  createdAtMs: number;
  revokedAtMs: number | null;
}
