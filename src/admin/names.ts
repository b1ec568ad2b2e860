export const MAX_NAME_LENGTH = 100;
const ORG_ID_SHAPE = /^org_[a-z0-9]{12}$/;

/**
 * A name for an organization, a key or a note: trimmed, 1 to 100 characters (code points), no control characters.
 * Returns the trimmed name, or the problem as a sentence fragment ("must not be empty").
 */
export function checkName(raw: string): { name: string } | { problem: string } {
  const name = raw.trim();
  if (name.length === 0) return { problem: "must not be empty" };
  if ([...name].length > MAX_NAME_LENGTH) return { problem: `must be at most ${MAX_NAME_LENGTH} characters` };
  if (/[\p{Cc}\u2028\u2029]/u.test(name)) return { problem: "must not contain control characters" };
  return { name };
}

/** An organization name may not look like an organization id: a lookup by id or name must be unambiguous. */
export function looksLikeOrganizationId(name: string): boolean {
  return ORG_ID_SHAPE.test(name);
}
