import type pg from "pg";
import type { PreviewQuotaResult } from "../store.ts";
import { checkCount, checkDay, checkPreviewOrg, GLOBAL_PREVIEW_SCOPE } from "../input-checks.ts";
import { hasNul, Rollback, transaction, withClient, type Client } from "./postgres-connection.ts";

interface ConsumeInput {
  orgId: string;
  day: string;
  orgLimit: number;
  globalLimit: number;
}

/**
 * Adds one to a (scope, day) counter only while it is below `limit`, creating it at 1; false when the limit is
 * reached. The upsert locks the row until the transaction ends, and a concurrent one waits for it and then
 * evaluates `count < limit` on the committed row, so concurrent instances never push a counter past its limit.
 */
const BUMP =
  "INSERT INTO preview_counters (scope, day, count) VALUES ($1, $2, 1) " +
  "ON CONFLICT (scope, day) DO UPDATE SET count = preview_counters.count + 1 WHERE preview_counters.count < $3";

async function bump(c: Client, scope: string, day: string, limit: number): Promise<boolean> {
  // A new row starts at 1, which a limit of 0 does not allow.
  if (limit <= 0) return false;
  return (await c.query(BUMP, [scope, day, limit])).rowCount === 1;
}

/**
 * Preview day quotas in PostgreSQL: one counter per (scope, UTC day), scope being an organization id or `*` for
 * the whole service (the same rows and answers as SqlitePreviewQuotas). consume bumps the organization's counter,
 * then the service's, in one transaction; when the second is at its limit the first bump is rolled back, so
 * both count or neither does. Every transaction locks the organization row before the `*` row: no deadlock.
 */
export class PostgresPreviewQuotas {
  readonly #pool: pg.Pool;

  constructor(pool: pg.Pool) {
    this.#pool = pool;
  }

  async consume(input: ConsumeInput): Promise<PreviewQuotaResult> {
    checkPreviewOrg(input.orgId);
    checkDay(input.day);
    checkCount(input.orgLimit, "orgLimit");
    checkCount(input.globalLimit, "globalLimit");
    return transaction(this.#pool, async (c): Promise<PreviewQuotaResult> => {
      // The organization's limit is reported first when both are reached, as in SQLite.
      if (!(await bump(c, input.orgId, input.day, input.orgLimit))) throw new Rollback<PreviewQuotaResult>("org_exhausted");
      if (!(await bump(c, GLOBAL_PREVIEW_SCOPE, input.day, input.globalLimit))) throw new Rollback<PreviewQuotaResult>("global_exhausted");
      return "ok";
    });
  }

  async usage(orgId: string, day: string): Promise<{ org: number; global: number }> {
    checkPreviewOrg(orgId);
    checkDay(day);
    // Both counters from one statement, so from one snapshot.
    const rows = await withClient(this.#pool, async (c) =>
      (await c.query<{ scope: string; count: number }>("SELECT scope, count FROM preview_counters WHERE day = $1 AND scope = ANY($2::text[])", [
        day,
        hasNul(orgId) ? [GLOBAL_PREVIEW_SCOPE] : [orgId, GLOBAL_PREVIEW_SCOPE],
      ])).rows,
    );
    return {
      org: rows.find((r) => r.scope === orgId)?.count ?? 0,
      global: rows.find((r) => r.scope === GLOBAL_PREVIEW_SCOPE)?.count ?? 0,
    };
  }
}
