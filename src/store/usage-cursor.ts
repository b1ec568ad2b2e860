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
  return encodeCursorText(`${cursor.createdAtMs}:${cursor.requestId}`);
}

/** Throws StoreInputError (field `cursor`) for anything encodeUsageCursor could not have produced. */
export function decodeUsageCursor(text: string): UsageCursor {
  const decoded = decodeCursorText(text);
  const colon = decoded.indexOf(":");
  if (colon < 1) throw badCursor();
  const timeText = decoded.slice(0, colon);
  const requestId = decoded.slice(colon + 1);
  const createdAtMs = Number(timeText);
  if (!/^(0|[1-9][0-9]*)$/.test(timeText) || !Number.isSafeInteger(createdAtMs) || requestId.length === 0) throw badCursor();
  return { createdAtMs, requestId };
}

/** An opaque cursor: base64url of the UTF-8 text. */
export function encodeCursorText(text: string): string {
  return Buffer.from(text, "utf8").toString("base64url");
}

/** The text of a cursor made by encodeCursorText; throws StoreInputError (field `cursor`) for anything else. */
export function decodeCursorText(text: string): string {
  if (typeof text !== "string" || !/^[A-Za-z0-9_-]{1,4096}$/.test(text)) throw badCursor();
  const buffer = Buffer.from(text, "base64url");
  if (buffer.toString("base64url") !== text) throw badCursor();
  const decoded = buffer.toString("utf8");
  // A round trip through UTF-8 catches bytes that are not valid UTF-8 (decoded as U+FFFD).
  if (Buffer.from(decoded, "utf8").toString("base64url") !== text) throw badCursor();
  return decoded;
}

export function badCursor(): StoreInputError {
  return new StoreInputError("cursor is not a cursor returned by a previous page", "cursor");
}
