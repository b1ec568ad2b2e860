export const MAX_NAME_LENGTH = 100;
const ORG_ID_SHAPE = /^org_[a-z0-9]{12}$/;

/** A zero-width joiner inside an emoji sequence (👩‍💻): the one invisible formatting character a name may hold. */
const EMOJI_JOINER = /(?<=\p{Extended_Pictographic}\uFE0F?)\u200D(?=\p{Extended_Pictographic})/gu;

/**
 * A name for an organization, a key or a note: trimmed, normalised to NFC, 1 to 100 characters (code points), with no
 * control characters, no invisible formatting characters (zero-width characters, bidirectional overrides and
 * isolates: category Cf, but the joiner of an emoji sequence) and no unpaired surrogates, so that a name cannot pass
 * for another one on a screen. Returns the name, or the problem as a sentence fragment ("must not be empty").
 */
export function checkName(raw: string): { name: string } | { problem: string } {
  const name = raw.trim().normalize("NFC");
  if (name.length === 0) return { problem: "must not be empty" };
  if ([...name].length > MAX_NAME_LENGTH) return { problem: `must be at most ${MAX_NAME_LENGTH} characters` };
  if (/[\p{Cc}\u2028\u2029]/u.test(name)) return { problem: "must not contain control characters" };
  if (/\p{Cf}/u.test(name.replace(EMOJI_JOINER, "")))
    return { problem: "must not contain invisible formatting characters (zero-width or bidirectional controls)" };
  if (/\p{Cs}/u.test(name)) return { problem: "must not contain unpaired surrogate code points" };
  return { name };
}

/** An organization name may not look like an organization id: a lookup by id or name must be unambiguous. */
export function looksLikeOrganizationId(name: string): boolean {
  return ORG_ID_SHAPE.test(name);
}
