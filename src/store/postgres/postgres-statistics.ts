import type pg from "pg";
import { isConnectionFailure, pgCode } from "./postgres-connection.ts";

/**
 * Planner statistics the gateway keeps fresh itself. Its statements are prepared once per connection, and PostgreSQL
 * may keep a generic plan of one for good (the bookkeeping connections always use generic plans: force_generic_plan):
 * a plan made while the tables were small scans them whole, even once they are large, until something invalidates it.
 * ANALYZE does (a prepared statement is planned again after the statistics of a table it uses were updated), so a
 * serving gateway's store (keepStatisticsFresh) analyzes its tables as they grow, by autovacuum's analyze rule, on
 * servers where autovacuum is off as well as on (where it rarely finds anything left to do).
 */

/** Every table of the gateway's migrations, but schema_migrations. */
export const GATEWAY_TABLES = [
  "admin_audit",
  "admin_idempotency",
  "api_keys",
  "batch_requests",
  "batches",
  "gateway_instances",
  "idempotency_keys",
  "key_spend",
  "ledger_entries",
  "org_balances",
  "organizations",
  "preview_counters",
  "usage_daily",
  "usage_records",
] as const;

/** autovacuum_analyze_threshold and autovacuum_analyze_scale_factor's defaults. */
export const ANALYZE_THRESHOLD_ROWS = 50;
export const ANALYZE_SCALE_FACTOR = 0.1;

/** How often the store looks for tables to analyze. */
export const STATISTICS_REFRESH_INTERVAL_MS = 10_000;

/**
 * The gateway's tables (of the connection's current schema) whose statistics are due: never analyzed and holding
 * rows, or changed by more than the threshold since their last ANALYZE (or autovacuum's).
 */
const DUE_TABLES =
  "SELECT s.relname AS name, format('%I.%I', s.schemaname, s.relname) AS qualified " +
  "FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid " +
  "WHERE s.schemaname = current_schema() AND s.relname = ANY($1::text[]) AND (" +
  "(s.last_analyze IS NULL AND s.last_autoanalyze IS NULL AND s.n_live_tup >= $2) " +
  "OR s.n_mod_since_analyze >= $2 + $3 * greatest(c.reltuples, 0)) ORDER BY s.relname";

/** 55P03: ANALYZE (SKIP_LOCKED) skipped a table another session holds (another instance analyzing it). */
const LOCK_NOT_AVAILABLE = "55P03";
/** 25006: a read-only session or a standby; nothing can be analyzed there. */
const READ_ONLY_TRANSACTION = "25006";

/** The fields of a server notice (pg's NoticeMessage) read here. */
interface Notice {
  severity?: string | undefined;
  code?: string | undefined;
  message?: string | undefined;
}

export interface StatisticsRefresh {
  /** The tables analyzed. */
  analyzed: string[];
  /** Due, but held by another session (another instance analyzing them): left for a later refresh. */
  locked: string[];
  /** Due and not analyzed, with PostgreSQL's message: the role may not analyze the table (it only warns), or it failed. */
  failed: { table: string; message: string }[];
}

/**
 * Analyzes the gateway's tables that are due (DUE_TABLES), one `ANALYZE (SKIP_LOCKED)` each on one pooled connection,
 * under its statement_timeout: instances refreshing at once never wait for each other. Rejects only when the
 * connection fails or the session is read-only; what happened to each due table is in the result.
 */
export async function refreshStatistics(pool: pg.Pool): Promise<StatisticsRefresh> {
  const client = await pool.connect();
  let broken: Error | undefined;
  const onError = (err: Error) => (broken ??= err);
  let warnings: Notice[] = [];
  const onNotice = (notice: Notice) => warnings.push(notice);
  client.on("error", onError);
  client.on("notice", onNotice);
  const refresh: StatisticsRefresh = { analyzed: [], locked: [], failed: [] };
  try {
    const due = await client.query<{ name: string; qualified: string }>(DUE_TABLES, [
      GATEWAY_TABLES,
      ANALYZE_THRESHOLD_ROWS,
      ANALYZE_SCALE_FACTOR,
    ]);
    for (const table of due.rows) {
      warnings = [];
      try {
        await client.query(`ANALYZE (SKIP_LOCKED) ${table.qualified}`);
      } catch (err) {
        if (isConnectionFailure(err) || pgCode(err) === READ_ONLY_TRANSACTION) throw err;
        refresh.failed.push({ table: table.name, message: err instanceof Error ? err.message : String(err) });
        continue;
      }
      const warning = warnings.find((notice) => notice.severity === "WARNING");
      if (warning === undefined) refresh.analyzed.push(table.name);
      else if (warning.code === LOCK_NOT_AVAILABLE) refresh.locked.push(table.name);
      else refresh.failed.push({ table: table.name, message: warning.message ?? "skipped" });
    }
    return refresh;
  } catch (err) {
    if (isConnectionFailure(err) || pgCode(err) === READ_ONLY_TRANSACTION) broken ??= err instanceof Error ? err : new Error(String(err));
    throw err;
  } finally {
    client.off("error", onError);
    client.off("notice", onNotice);
    client.release(broken ?? false);
  }
}

/**
 * The store's periodic refresh: one at once, then every STATISTICS_REFRESH_INTERVAL_MS (the timer does not keep the
 * process alive), one at a time. A refresh that fails, and each distinct message of a table left unanalyzed, go to
 * `onProblem` (a table the role may not analyze is reported once, not every minute).
 */
export class StatisticsRefresher {
  readonly #pool: pg.Pool;
  readonly #onProblem: (message: string) => void;
  readonly #reported = new Set<string>();
  #timer: NodeJS.Timeout | null = null;
  #running: Promise<StatisticsRefresh> | null = null;

  constructor(pool: pg.Pool, onProblem: (message: string) => void = () => {}) {
    this.#pool = pool;
    this.#onProblem = onProblem;
  }

  /** Starts the refresh; settles (never rejects) when the first one did, with its result (null when it failed). */
  start(): Promise<StatisticsRefresh | null> {
    const tick = () =>
      this.#running === null
        ? this.refreshNow().then(
            (refresh) => refresh,
            () => null,
          )
        : Promise.resolve(null);
    const first = tick();
    this.#timer = setInterval(tick, STATISTICS_REFRESH_INTERVAL_MS);
    this.#timer.unref();
    return first;
  }

  /** One refresh, after the one in flight (if any); its problems are reported as well as returned. */
  refreshNow(): Promise<StatisticsRefresh> {
    const previous = this.#running ?? Promise.resolve(null);
    const run = previous
      .catch(() => null)
      .then(() => refreshStatistics(this.#pool))
      .then(
        (refresh) => {
          for (const { table, message } of refresh.failed) this.#reportOnce(`ANALYZE of ${table} did not run: ${message}`);
          return refresh;
        },
        (err: unknown) => {
          this.#onProblem(
            `The refresh of the tables' planner statistics failed; it runs again in ${STATISTICS_REFRESH_INTERVAL_MS / 1000} s: ${
              err instanceof Error ? err.message : String(err)
            }`,
          );
          throw err;
        },
      );
    this.#running = run;
    const settled = () => {
      if (this.#running === run) this.#running = null;
    };
    run.then(settled, settled);
    return run;
  }

  /** Stops the timer and waits for a refresh in flight. */
  async stop(): Promise<void> {
    if (this.#timer !== null) clearInterval(this.#timer);
    this.#timer = null;
    await this.#running?.catch(() => undefined);
  }

  #reportOnce(message: string): void {
    if (this.#reported.has(message)) return;
    this.#reported.add(message);
    this.#onProblem(message);
  }
}
