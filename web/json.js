// JSON that keeps the order of object keys exactly as written. JavaScript objects put
// integer-like keys ("1", "2") first, which would reorder questions and options; the Playground
// builds requests from these values instead and serialises them itself.

/** An ordered JSON object: a list of [key, value] pairs. */
export class Obj {
  constructor(entries = []) {
    this.entries = entries;
  }
  get(key) {
    const found = this.entries.find(([k]) => k === key);
    return found ? found[1] : undefined;
  }
}

/** A number kept as its literal text, so 1.0 or 12345678901234567890 are sent as written. */
export class Num {
  constructor(text) {
    this.text = text;
  }
}

/** Parses JSON text into Obj / arrays / strings / Num / booleans / null. Throws SyntaxError like JSON.parse. */
export function parseOrdered(text) {
  JSON.parse(text); // the browser's own error messages for invalid input
  let i = 0;
  const ws = () => {
    while (i < text.length && " \t\n\r".includes(text[i])) i++;
  };
  const value = () => {
    ws();
    const c = text[i];
    if (c === "{") {
      i++;
      const entries = [];
      ws();
      if (text[i] === "}") {
        i++;
        return new Obj(entries);
      }
      for (;;) {
        ws();
        const key = string();
        ws();
        i++; // :
        entries.push([key, value()]);
        ws();
        if (text[i++] === "}") return new Obj(entries);
      }
    }
    if (c === "[") {
      i++;
      const items = [];
      ws();
      if (text[i] === "]") {
        i++;
        return items;
      }
      for (;;) {
        items.push(value());
        ws();
        if (text[i++] === "]") return items;
      }
    }
    if (c === '"') return string();
    const literal = /^(true|false|null|-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)/.exec(text.slice(i, i + 400));
    if (!literal) throw new SyntaxError(`Unexpected token at position ${i}`);
    i += literal[0].length;
    if (literal[0] === "true") return true;
    if (literal[0] === "false") return false;
    if (literal[0] === "null") return null;
    return new Num(literal[0]);
  };
  const string = () => {
    const start = i;
    i++;
    while (text[i] !== '"') i += text[i] === "\\" ? 2 : 1;
    i++;
    return JSON.parse(text.slice(start, i));
  };
  return value();
}

/** Converts a plain JS value (from JSON.parse or code) into the ordered representation. */
export function fromPlain(value) {
  if (Array.isArray(value)) return value.map(fromPlain);
  if (value && typeof value === "object" && !(value instanceof Obj) && !(value instanceof Num)) {
    return new Obj(Object.entries(value).map(([k, v]) => [k, fromPlain(v)]));
  }
  return value;
}

const IDENTIFIER = /^[A-Za-z_$][A-Za-z0-9_$]*$/;

/**
 * Serialises an ordered value. indent 0 → compact JSON. `js: true` writes a JavaScript/TypeScript
 * literal instead (identifier keys unquoted).
 */
export function stringify(value, { indent = 0, js = false } = {}) {
  const pad = (depth) => (indent ? `\n${" ".repeat(indent * depth)}` : "");
  const sep = indent ? ": " : ":";
  const walk = (v, depth) => {
    if (v === null || v === undefined) return "null";
    if (v instanceof Num) return v.text;
    if (typeof v === "number") return Number.isFinite(v) ? String(v) : "null";
    if (typeof v === "string" || typeof v === "boolean") return JSON.stringify(v);
    if (Array.isArray(v)) {
      if (v.length === 0) return "[]";
      return `[${v.map((x) => pad(depth + 1) + walk(x, depth + 1)).join(",")}${pad(depth)}]`;
    }
    const obj = v instanceof Obj ? v : fromPlain(v);
    const entries = obj.entries.filter(([, x]) => x !== undefined);
    if (entries.length === 0) return "{}";
    const key = (k) => (js && IDENTIFIER.test(k) ? k : JSON.stringify(k));
    return `{${entries.map(([k, x]) => pad(depth + 1) + key(k) + sep + walk(x, depth + 1)).join(",")}${pad(depth)}}`;
  };
  return walk(value, 0);
}

/** Pretty-prints JSON text, keeping its key order; returns the text unchanged if it is not JSON. */
export function prettyJson(text) {
  try {
    return stringify(parseOrdered(text), { indent: 2 });
  } catch {
    return text;
  }
}
