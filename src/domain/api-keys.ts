import { createHash, randomBytes, randomFillSync, timingSafeEqual } from "node:crypto";

const KEY_PREFIX = "tds_";
const ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789";
const KEY_ID_LENGTH = 12;
const SECRET_BYTES = 32;
const RAW_KEY_PATTERN = /^tds_([a-z0-9]{12})_([A-Za-z0-9_-]{43})$/;

/** Random bytes for ids, drawn from the system in blocks (one call per ~170 request ids, not one each). */
const pool = Buffer.alloc(4096);
let used = pool.length;

function randomByte(): number {
  if (used === pool.length) {
    randomFillSync(pool);
    used = 0;
  }
  return pool[used++]!;
}

/** A random id of [a-z0-9], with rejection sampling so every character is uniform. Not for secrets. */
export function randomId(length: number): string {
  let out = "";
  while (out.length < length) {
    const byte = randomByte();
    if (byte < 252) out += ID_ALPHABET[byte % 36];
  }
  return out;
}

export function newOrganizationId(): string {
  return `org_${randomId(12)}`;
}

/** Characters of a request id that hold its time: base-36 milliseconds, sortable as text until the year 5188. */
const REQUEST_ID_TIME_CHARS = 9;
/** Its random rest (36^15, about 2^77). */
const REQUEST_ID_RANDOM_CHARS = 15;

/**
 * The id of a request (an API call or a batch request): its usage record's key and the x-service-request-id header.
 * `req_` and 24 characters of [a-z0-9]: the time in milliseconds first, then random characters. Ids made in order
 * sort in order (to the millisecond), so that each new usage record is added at the end of the primary key's index
 * instead of at a random place in it: one index page written by many requests, not one page each (with 200,000
 * records of history, bench/request-id-order.ts: SQLite's CPU per request in the books 0.81×, PostgreSQL's WAL 0.54×).
 */
export function newRequestId(): string {
  return `req_${Date.now().toString(36).padStart(REQUEST_ID_TIME_CHARS, "0")}${randomId(REQUEST_ID_RANDOM_CHARS)}`;
}

/** The id of a batch submission: the path segment of GET /v1/batches/{id}. */
export function newBatchId(): string {
  return `batch_${randomId(24)}`;
}

export interface NewApiKey {
  id: string;
  /** Shown once to the user; never stored or logged. */
  raw: string;
  hash: string;
}

/** `tds_<12-char key id>_<43-char base64url secret>`: 256 bits of entropy, recognisable by its prefix. */
export function generateApiKey(): NewApiKey {
  const id = randomId(KEY_ID_LENGTH);
  const raw = `${KEY_PREFIX}${id}_${randomBytes(SECRET_BYTES).toString("base64url")}`;
  return { id, raw, hash: hashApiKey(raw) };
}

export function hashApiKey(raw: string): string {
  return createHash("sha256").update(raw, "utf8").digest("hex");
}

/** The key id embedded in a raw key, or null when the text is not shaped like one of our keys. */
export function keyIdOf(raw: string): string | null {
  return RAW_KEY_PATTERN.exec(raw)?.[1] ?? null;
}

/** Constant-time comparison of a presented raw key with a stored hash. */
export function apiKeyMatches(raw: string, storedHash: string): boolean {
  const presented = Buffer.from(hashApiKey(raw), "hex");
  const stored = Buffer.from(storedHash, "hex");
  return stored.length === presented.length && timingSafeEqual(presented, stored);
}
