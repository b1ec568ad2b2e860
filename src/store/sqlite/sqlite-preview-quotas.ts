import type Database from "better-sqlite3";
import type { Statement } from "better-sqlite3";
import type { PreviewQuotaResult } from "../store.ts";
import { checkCount, checkDay, checkPreviewOrg, GLOBAL_PREVIEW_SCOPE } from "../input-checks.ts";

interface ConsumeInput {
  orgId: string;
  day: string;
  orgLimit: number;
  globalLimit: number;
}

/**
 * Preview day quotas in SQLite: one counter per (scope, UTC day), scope being an organization id or `*`
 * for the whole service. consume reads both counters and increments both, or neither, in one
 * BEGIN IMMEDIATE transaction, so concurrent processes never push a counter past its limit.
 */
export class SqlitePreviewQuotas {
  readonly #count: Statement<[string, string], { count: number }>;
  readonly #increment: Statement<[string, string]>;
  readonly #consumeTx: Database.Transaction<(input: ConsumeInput) => PreviewQuotaResult>;
  readonly #usageTx: Database.Transaction<(orgId: string, day: string) => { org: number; global: number }>;

  constructor(db: Database.Database) {
    this.#count = db.prepare("SELECT count FROM preview_counters WHERE scope = ? AND day = ?");
    this.#increment = db.prepare(
      "INSERT INTO preview_counters (scope, day, count) VALUES (?, ?, 1) ON CONFLICT (scope, day) DO UPDATE SET count = count + 1",
    );
    const read = (orgId: string, day: string) => ({
      org: this.#count.get(orgId, day)?.count ?? 0,
      global: this.#count.get(GLOBAL_PREVIEW_SCOPE, day)?.count ?? 0,
    });
    this.#consumeTx = db.transaction((input: ConsumeInput): PreviewQuotaResult => {
      const used = read(input.orgId, input.day);
      if (used.org >= input.orgLimit) return "org_exhausted";
      if (used.global >= input.globalLimit) return "global_exhausted";
      this.#increment.run(input.orgId, input.day);
      this.#increment.run(GLOBAL_PREVIEW_SCOPE, input.day);
      return "ok";
    });
    // Both counters from one snapshot.
    this.#usageTx = db.transaction(read);
  }

  consume(input: ConsumeInput): PreviewQuotaResult {
    checkPreviewOrg(input.orgId);
    checkDay(input.day);
    checkCount(input.orgLimit, "orgLimit");
    checkCount(input.globalLimit, "globalLimit");
    return this.#consumeTx.immediate(input);
  }

  usage(orgId: string, day: string): { org: number; global: number } {
    checkPreviewOrg(orgId);
    checkDay(day);
    return this.#usageTx.deferred(orgId, day);
  }
}
