import type pg from "pg";
import type { Writability, WriteCheck } from "../store.ts";
import { SharedCheck, WriteOutcomes } from "../write-outcomes.ts";
import { observeOutcomes, pgCode, sessionReadOnly } from "./postgres-connection.ts";
import { postgresFailureKind } from "./postgres-errors.ts";

/** What a PostgreSQL error says about writing: null for an error that is not about the storage. */
export function postgresWritability(err: unknown): Writability | null {
  switch (pgCode(err)) {
    case "25006":
      return "read_only";
    case "53100":
      return "disk_full";
    case "58030":
      return "cannot_write";
  }
  return postgresFailureKind(err) === "unavailable" ? "unavailable" : null;
}

function describe(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  const code = (err as { code?: unknown }).code;
  return typeof code === "string" ? `${code}: ${err.message}` : err.message;
}

/**
 * The write check of a store's pools (the session checked on the first; the transactions of all heard): a session that
 * is read-only (the database or role set default_transaction_read_only, or the server is a standby) is `read_only`; no
 * connection is `unavailable`; then what the latest transactions met (a full disk, 53100, shows only there), shared by
 * the calls of a second (see SharedCheck). PostgreSQL needs no reopening: broken and read-only sessions are discarded,
 * and the pools open new ones.
 */
export function postgresWriteCheck(pool: pg.Pool, ...otherPools: pg.Pool[]): () => Promise<WriteCheck> {
  const outcomes = new WriteOutcomes();
  const shared = new SharedCheck(async () => {
    try {
      if (await sessionReadOnly(pool)) return { state: "read_only", reason: "the session is read-only (transaction_read_only = on)" };
    } catch (err) {
      return { state: postgresWritability(err) ?? "unavailable", reason: describe(err) };
    }
    return outcomes.latest() ?? { state: "ok" };
  });
  for (const observed of [pool, ...otherPools]) {
    observeOutcomes(observed, (failure) => {
      if (failure === null) return outcomes.succeeded();
      const state = postgresWritability(failure);
      if (state !== null) shared.invalidate();
      if (state !== null && state !== "unavailable") outcomes.failed({ state, reason: describe(failure) });
    });
    // An idle connection lost (the server restarted, the database dropped, a failover): check anew at the next call.
    observed.on("error", () => shared.invalidate());
  }
  return () => shared.check();
}
