/** The shortest admin or metrics token accepted. */
export const MIN_SECRET_LENGTH = 32;
/** A token with fewer different characters is refused (`openssl rand -hex 32` has 16, base64 far more). */
export const MIN_DISTINCT_CHARACTERS = 10;

/**
 * Why a configured secret (an admin or metrics token) is too weak, as a sentence fragment that follows its name,
 * or null. Beyond the length: fewer than 10 different characters, a repetition of a shorter part (`abcabc…`), or
 * mostly a run of consecutive characters (`abcdef…`, `987654…`).
 */
export function weakSecretProblem(secret: string): string | null {
  const chars = [...secret];
  if (chars.length < MIN_SECRET_LENGTH) return `must be at least ${MIN_SECRET_LENGTH} characters (got ${chars.length})`;
  if (/[\s\p{Cc}]/u.test(secret)) return "must not contain whitespace or control characters";
  if (new Set(chars).size < MIN_DISTINCT_CHARACTERS)
    return `is too easy to guess: it has fewer than ${MIN_DISTINCT_CHARACTERS} different characters`;
  if (repeatsShorterPart(chars)) return "is too easy to guess: it repeats a shorter part";
  if (mostlyConsecutive(chars)) return "is too easy to guess: it is mostly a run of consecutive characters";
  return null;
}

/** True when the text is some shorter part repeated (the last repetition may be cut short). */
function repeatsShorterPart(chars: string[]): boolean {
  for (let period = 1; period <= chars.length / 2; period++) {
    let repeats = true;
    for (let i = period; i < chars.length && repeats; i++) repeats = chars[i] === chars[i - period];
    if (repeats) return true;
  }
  return false;
}

/** True when at least three quarters of the steps between neighbours go one code point up or down. */
function mostlyConsecutive(chars: string[]): boolean {
  let consecutive = 0;
  for (let i = 1; i < chars.length; i++) {
    if (Math.abs(chars[i]!.codePointAt(0)! - chars[i - 1]!.codePointAt(0)!) === 1) consecutive++;
  }
  return consecutive * 4 >= (chars.length - 1) * 3;
}
