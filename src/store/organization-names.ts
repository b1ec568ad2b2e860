import { nameKey } from "../domain/name-key.ts";
import { execute, query, type SqlProgram } from "./sql-program.ts";

/**
 * Organization names are unique by nameKey (case and look-alike forms folded), stored in organizations.name_key
 * under a unique index (migration 009). Names stored before the rule may share a key: the oldest holds it, the others
 * keep none (null, like a row written by an earlier version) and keep working (lookups by name stay exact); a new
 * name is compared with the key holder and with every keyless name, so one that clashes with any of them is refused.
 */
export { nameKey };

/** The StoreConflictError message of a `requested` name that clashes with `existing` (the stored name, as spelled). */
export function nameTakenMessage(existing: string, requested: string): string {
  const taken = `An organization named ${JSON.stringify(existing)} already exists`;
  return existing === requested ? taken : `${taken} (names are unique regardless of case)`;
}

/** The key's holder and every keyless name (both through organizations_by_name_key), the holder first. */
export const NAME_CANDIDATES =
  "SELECT name FROM organizations WHERE name_key = ? OR name_key IS NULL ORDER BY name_key IS NULL, created_at_ms, id";

/** The stored name that `key` clashes with, if any: the key's holder first, then keyless names, oldest first. */
export function* nameHolder(key: string): SqlProgram<string | undefined> {
  return (yield* query(NAME_CANDIDATES, key)).map((row) => row.name as string).find((name) => nameKey(name) === key);
}

const FILL_BATCH = 500;

/** Migration 009's data step (SQL cannot compute NFKC case folding): gives every stored name its key, oldest first. */
function* fillNameKeys(): SqlProgram<void> {
  const held = new Set<string>();
  const keyed: unknown[] = [];
  for (const row of yield* query("SELECT id, name FROM organizations WHERE name_key IS NULL ORDER BY created_at_ms, id")) {
    const key = nameKey(row.name as string);
    if (held.has(key)) continue;
    held.add(key);
    keyed.push(row.id, key);
  }
  for (let i = 0; i < keyed.length; i += 2 * FILL_BATCH) {
    const batch = keyed.slice(i, i + 2 * FILL_BATCH);
    const values = Array(batch.length / 2)
      .fill("(?, ?)")
      .join(", ");
    // VALUES columns are column1, column2 in both dialects.
    yield* execute(
      `UPDATE organizations SET name_key = v.column2 FROM (VALUES ${values}) AS v WHERE organizations.id = v.column1`,
      ...batch,
    );
  }
}

/** Steps of migrations that their SQL cannot do, by file: run after the file's SQL, in its transaction. */
export const MIGRATION_DATA_STEPS: Readonly<Record<string, () => SqlProgram<void>>> = {
  "009_organization_name_keys.sql": fillNameKeys,
};
