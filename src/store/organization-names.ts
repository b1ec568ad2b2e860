/**
 * Organization names are unique by nameKey (case and look-alike forms folded), checked by each adapter inside the
 * transaction that creates the organization. Names stored before the rule may share a key: they keep working (lookups
 * by name stay exact), and only a new name that clashes with one of them is refused.
 */
export { nameKey } from "../domain/name-key.ts";

/** The StoreConflictError message of a `requested` name that clashes with `existing` (the stored name, as spelled). */
export function nameTakenMessage(existing: string, requested: string): string {
  const taken = `An organization named ${JSON.stringify(existing)} already exists`;
  return existing === requested ? taken : `${taken} (names are unique regardless of case)`;
}
