/**
 * The key under which organization names are unique: compatibility-normalised (NFKC: full-width and other look-alike
 * forms become plain ones), then case-folded. `default`, `DEFAULT` and `ｄｅｆａｕｌｔ` share one key. The key of a
 * name of printable ASCII is its lower case, so a store can find clashes with SQL's ASCII lower() plus the names
 * that are not printable ASCII.
 */
export function nameKey(name: string): string {
  return name.normalize("NFKC").toUpperCase().toLowerCase();
}

/** True when every character is printable ASCII (space to tilde): then nameKey(name) is name's ASCII lower case. */
export function isPrintableAscii(name: string): boolean {
  return /^[\x20-\x7e]*$/.test(name);
}
