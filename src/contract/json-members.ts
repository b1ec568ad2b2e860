/**
 * One pass over a JSON text, before it is parsed, allocating nothing per value: whether arrays and objects nest
 * deeper than a limit (so that a deep body is refused without being parsed), and the original text of chosen
 * members of the top-level object, so that a value can be forwarded exactly as the client sent it (JSON.parse turns
 * 12345678901234567890 into 12345678901234567000 and 1e999999 into Infinity, which JSON.stringify writes as null).
 *
 * On valid JSON the answers are exact; on invalid JSON they are meaningless, and JSON.parse refuses it next. For a
 * member named twice the last one counts, as in JSON.parse.
 */
export interface ScannedJson {
  deeperThanLimit: boolean;
  members: Map<string, string>;
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_OBJECT = 0x7b;
const CLOSE_OBJECT = 0x7d;
const OPEN_ARRAY = 0x5b;
const CLOSE_ARRAY = 0x5d;
const COLON = 0x3a;
const COMMA = 0x2c;

export function scanJson(text: string, maxDepth: number, names: readonly string[]): ScannedJson {
  const members = new Map<string, string>();
  let depth = 0;
  // The current top-level member: its name once read, and where its value starts once the colon is passed.
  let key: string | null = null;
  let valueStart = -1;
  const memberEnds = (end: number) => {
    if (key !== null && valueStart >= 0 && names.includes(key)) members.set(key, text.slice(valueStart, end).trim());
    key = null;
    valueStart = -1;
  };
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === QUOTE) {
      const end = endOfString(text, i);
      if (depth === 1 && valueStart < 0) key = nameOf(text.slice(i, end));
      i = end - 1;
    } else if (c === OPEN_OBJECT || c === OPEN_ARRAY) {
      if (++depth > maxDepth) return { deeperThanLimit: true, members };
    } else if (c === CLOSE_OBJECT || c === CLOSE_ARRAY) {
      if (depth === 1) memberEnds(i);
      depth--;
    } else if (depth === 1) {
      if (c === COLON) valueStart = i + 1;
      else if (c === COMMA) memberEnds(i);
    }
  }
  return { deeperThanLimit: false, members };
}

/** `i` is at an opening quote; the index after the closing one (the end of the text if there is none). */
function endOfString(text: string, i: number): number {
  let from = i + 1;
  for (;;) {
    const quote = text.indexOf('"', from);
    if (quote < 0) return text.length;
    let backslashes = 0;
    while (text.charCodeAt(quote - 1 - backslashes) === BACKSLASH) backslashes++;
    if (backslashes % 2 === 0) return quote + 1;
    from = quote + 1;
  }
}

/** A member name's value from its JSON string text; null for text that is not one. */
function nameOf(raw: string): string | null {
  if (!raw.includes("\\")) return raw.slice(1, -1);
  try {
    return JSON.parse(raw) as string;
  } catch {
    return null;
  }
}
