import { createHash, timingSafeEqual } from "node:crypto";

function digest(text: string): Buffer {
  return createHash("sha256").update(text, "utf8").digest();
}

/**
 * A check of presented tokens against one secret, in constant time: both sides are hashed first, so neither the
 * comparison nor its duration depends on the secret's length or on where the first difference is.
 */
export function tokenMatcher(secret: string): (presented: string) => boolean {
  const expected = digest(secret);
  return (presented) => timingSafeEqual(digest(presented), expected);
}
