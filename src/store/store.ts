import type { AuditActor } from "../domain/audit.ts";
import type { AdmitCommand, AdmitResult, CompleteCommand, CompleteResult, PurgeResult, SweepResult } from "../domain/bookkeeping.ts";
import type { Balance, LedgerEntry, Reservation } from "../domain/credits.ts";
import type { ApiKeyRecord, KeySettings, Organization } from "../domain/organizations.ts";
import type { UsageOutcome, UsageRecord } from "../domain/usage-records.ts";
import type { AdministrationStore } from "./administration.ts";
import type { BatchStore } from "./batches.ts";
import type { StoreFailureKind } from "./store-errors.ts";

export interface UsageQuery {
  /** Inclusive lower bound of createdAtMs. */
  fromMs?: number;
  /** Exclusive upper bound of createdAtMs. */
  toMs?: number;
  outcome?: UsageOutcome;
  /** Opaque cursor from a previous page. */
  cursor?: string;
  /** 1 to 200. */
  limit: number;
}

export interface UsagePage {
  records: UsageRecord[];
  /** Present when more records follow (newest first). */
  nextCursor: string | null;
}

/** Organizations and their API keys: written by operators, read on every request. */
export interface AccountStore {
  /** Throws StoreConflictError when the name is taken. With `audit`, records "organization.created" in the same transaction. */
  createOrganization(input: { id: string; name: string; nowMs: number; audit?: AuditActor }): Promise<Organization>;
  /** Finds by id or by unique name. */
  findOrganization(idOrName: string): Promise<Organization | null>;
  listOrganizations(): Promise<Organization[]>;
  countOrganizations(): Promise<number>;
  /**
   * Returns false when no such organization exists, true when it does, whether or not its state changed (pausing a
   * paused organization is fine). With `audit` (and `nowMs`), records "organization.paused" or "organization.resumed"
   * in the same transaction only when the state changed; concurrent calls with one state record it once.
   */
  setOrganizationPaused(orgId: string, paused: boolean, audit?: { actor: AuditActor; nowMs: number }): Promise<boolean>;

  /** With `audit`, records "key.created" in the same transaction. `settings` absent: none of its own. */
  createApiKey(input: {
    id: string;
    orgId: string;
    name: string | null;
    hash: string;
    nowMs: number;
    settings?: KeySettings;
    audit?: AuditActor;
  }): Promise<ApiKeyRecord>;
  /**
   * Changes a key's name or settings (a field absent is kept, null clears it); null when no such key exists. With
   * `audit`, records "key.updated" (the changed fields) in the same transaction.
   */
  updateApiKey(input: {
    keyId: string;
    changes: Partial<KeySettings> & { name?: string | null };
    nowMs: number;
    audit?: AuditActor;
  }): Promise<ApiKeyRecord | null>;
  /**
   * Replaces a key that is neither revoked nor retired by a new one (`newId`, `hash`) with the same organization, name
   * and settings, and the same lineage (one budget spend and per-minute count), in one transaction: the old key gets
   * `replacedBy` and `retiresAtMs`. Null when no such key exists;
   * StoreConflictError when it is revoked or already rotated. With `audit`, records "key.rotated" on the old key.
   */
  rotateApiKey(input: {
    keyId: string;
    newId: string;
    hash: string;
    nowMs: number;
    retiresAtMs: number;
    audit?: AuditActor;
  }): Promise<{ old: ApiKeyRecord; created: ApiKeyRecord } | null>;
  /** Moves each key's last_used_at forward to the time given (never back); unknown keys are skipped. One transaction. */
  recordKeyUse(uses: readonly { keyId: string; atMs: number }[]): Promise<void>;
  /** The key and its organization, revoked or not (the caller decides), as the database holds them now. */
  findApiKey(keyId: string): Promise<{ key: ApiKeyRecord; org: Organization } | null>;
  /**
   * The same, for authenticating a request: kept for cacheKeyLookups' time once found (read every time until then).
   */
  findApiKeyForRequest(keyId: string): Promise<{ key: ApiKeyRecord; org: Organization } | null>;
  /**
   * From now on findApiKeyForRequest keeps a found key (and its organization) for `ttlMs` (0: never, the default). A
   * change to keys or organizations made through this store drops what is kept at once; one made through another
   * store (another instance, the tds command on the database) is seen within `ttlMs`.
   */
  cacheKeyLookups(ttlMs: number): void;
  listApiKeys(orgId: string): Promise<ApiKeyRecord[]>;
  /** Returns false when no such key exists or it was already revoked. With `audit`, records "key.revoked" in the same transaction when it was revoked now. */
  revokeApiKey(keyId: string, nowMs: number, audit?: AuditActor): Promise<boolean>;
}

/**
 * The books of accepted requests: usage records, preview day counters, credits (balances, reservations, ledger)
 * and idempotency keys. A request touches them in two durable steps, admission and completion; `commitBatch`
 * commits the steps of many requests in one transaction, each decided on its own (one's rejection never
 * fails another). Times are the caller's epoch milliseconds.
 */
export interface BookkeepingStore {
  /**
   * One transaction: the completions first (settle or release, the final usage record, the idempotency entry),
   * then the admissions in order (idempotency claim, preview quotas or credit reservation, the in-flight usage
   * record). Results are in the order of the commands. Throws when the transaction fails as a whole.
   */
  commitBatch(batch: { admissions: readonly AdmitCommand[]; completions: readonly CompleteCommand[] }): Promise<{
    admissions: AdmitResult[];
    completions: CompleteResult[];
  }>;

  /**
   * Completes requests that stayed in flight past `inFlightBeforeMs` (created before it) as `gateway_error`
   * with nothing charged, at `nowMs`, their reservations expired; at most `limit`.
   */
  sweep(input: { nowMs: number; inFlightBeforeMs: number; limit: number }): Promise<SweepResult>;
  /**
   * Completes at once the requests in flight whose gateway process is gone, as the sweep does (`gateway_error`,
   * nothing charged) but releasing their reservations: those admitted by another instance than `instanceId` whose
   * lease ended at or before `nowMs`, and, with `createdBeforeMs` (a database one process serves: SQLite), every other
   * one created before it. At most `limit`; rows another transaction holds are skipped.
   */
  releaseOrphans(input: {
    instanceId: string;
    nowMs: number;
    createdBeforeMs: number | null;
    limit: number;
  }): Promise<{ released: number }>;
  /**
   * Records or extends the lease of a gateway instance (one serving process): until `leaseUntilMs` the requests it
   * admitted are its own; a lease that has ended marks it gone (a clean shutdown ends its lease at once). Leases that
   * ended a day before `nowMs` and hold no request in flight are deleted.
   */
  renewLease(input: { instanceId: string; startedAtMs: number; leaseUntilMs: number; nowMs: number }): Promise<void>;
  /** Deletes idempotency entries expired at `nowMs` and preview counters of days before `keepFromDay`; at most `limit` of each. */
  purge(input: { nowMs: number; keepFromDay: string; limit: number }): Promise<PurgeResult>;

  /** Adds credits (amount > 0) and a `grant` ledger entry; creates the balance when missing. With `audit`, records "credits.granted" in the same transaction. */
  grantCredits(input: { orgId: string; amountMicrousd: number; nowMs: number; note?: string; audit?: AuditActor }): Promise<Balance>;
  /** All zeros for an organization that never had credits. */
  getBalance(orgId: string): Promise<Balance>;
  getReservation(reservationId: string): Promise<Reservation | null>;
  /** Oldest first. */
  listLedger(orgId: string): Promise<LedgerEntry[]>;
  /**
   * The preview requests counted on one UTC day ("YYYY-MM-DD"): the organization's, and every organization's together
   * (`global`: not the service-wide counter's row, which also holds the units instances keep in blocks).
   */
  previewUsage(orgId: string, day: string): Promise<{ org: number; global: number }>;
  /** The organization's preview requests counted on one UTC day: one key lookup (previewUsage reads the day's rows). */
  previewCount(orgId: string, day: string): Promise<number>;

  /**
   * A key lineage's spend (`keyId`: ApiKeyRecord.lineageId, shared by a key and the keys that replaced it) in one
   * budget period ("YYYY-MM-DD" or "YYYY-MM"): zeros when it has none.
   */
  keySpend(keyId: string, period: string): Promise<{ reservedMicrousd: number; spentMicrousd: number }>;

  /** Scoped to the organization: another organization's record is null. */
  getUsage(orgId: string, requestId: string): Promise<UsageRecord | null>;
  /** Newest first (createdAtMs, then requestId, descending). */
  listUsage(orgId: string, query: UsageQuery): Promise<UsagePage>;
}

/**
 * Whether the database takes writes now: `ok`, `read_only` (the file or the server refuses writes), `disk_full`,
 * `cannot_write` (I/O errors, the file cannot be opened for writing) or `unavailable` (no connection).
 */
export type Writability = "ok" | "read_only" | "disk_full" | "cannot_write" | "unavailable";

export interface WriteCheck {
  state: Writability;
  /** The driver's own words when not ok: for the server log only (they may name the database or its host). */
  reason?: string;
}

/** Everything the service keeps. One interface, one adapter per database. */
export interface Store extends AccountStore, BookkeepingStore, AdministrationStore {
  readonly dialect: "sqlite" | "postgres";
  /** Batch submissions and their requests (issue 23). */
  readonly batches: BatchStore;
  close(): Promise<void>;
  /**
   * How an error thrown by one of this store's calls reads, from its own driver's codes: busy storage that can be run
   * again, storage unavailable, or `other` (see StoreFailureKind). The group commit retries the first; the API
   * answers both with 503.
   */
  classifyFailure(err: unknown): StoreFailureKind;
  /**
   * A cheap check that the database takes writes (nothing is committed), combined with what the latest writes met
   * (a full disk shows only there). A database found not writable is opened again when it can be (SQLite: a new
   * connection once the file is writable; PostgreSQL: read-only sessions are discarded from the pool).
   */
  checkWritable?(): Promise<WriteCheck>;
  /** Connection pool figures, for metrics (adapters with a pool). */
  connectionStats?(): { total: number; idle: number; waiting: number };
}
