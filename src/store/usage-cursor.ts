import { StoreInputError } from "./store-errors.ts";

/**
 * The usage paging cursor: base64url of `createdAtMs:requestId`, the position of the last record of a page.
 * Nothing in it is dialect-specific, so the PostgreSQL adapter can use it as it is.
 */
export interface UsageCursor {
  createdAtMs: number;
  requestId: string;
}

export function encodeUsageCursor(cursor: UsageCursor): string {
  return Buffer.from(`${cursor.createdAtMs}:${cursor.requestId}`, "utf8").toString("base64url");
}

/** Throws StoreInputError (field `cursor`) for anything encodeUsageCursor could not have produced. */
export function decodeUsageCursor(text: string): UsageCursor {
  const bad = () => new StoreInputError("cursor is not a cursor returned by a previous page", "cursor");
  if (!/^[A-Za-z0-9_-]{1,4096}$/.test(text)) throw bad();
  const buffer = Buffer.from(text, "base64url");
  if (buffer.toString("base64url") !== text) throw bad();
  const decoded = buffer.toString("utf8");
  // A round trip through UTF-8 catches bytes that are not valid UTF-8 (decoded as U+FFFD).
  if (Buffer.from(decoded, "utf8").toString("base64url") !== text) throw bad();
  const colon = decoded.indexOf(":");
  if (colon < 1) throw bad();
  const timeText = decoded.slice(0, colon);
  const requestId = decoded.slice(colon + 1);
  const createdAtMs = Number(timeText);
  if (!/^(0|[1-9][0-9]*)$/.test(timeText) || !Number.isSafeInteger(createdAtMs) || requestId.length === 0) throw bad();
  return { createdAtMs, requestId };
}
