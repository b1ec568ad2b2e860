/** Printing for the `tds` CLI: one JSON document, or text and tables for people. */

export interface TextSink {
  write(text: string): unknown;
}

export interface Output {
  /** True when --json was given: commands print exactly one JSON document with `json()`. */
  readonly jsonMode: boolean;
  /** Prints one JSON document (pretty, newline-terminated) on stdout. */
  json(value: unknown): void;
  /** Prints lines of text on stdout. */
  line(...lines: string[]): void;
  /** Prints an aligned table on stdout; cells are made safe for a terminal. */
  table(headers: string[], rows: string[][]): void;
  /** Prints a note or warning on stderr (never on stdout, so --json output stays one document). */
  note(text: string): void;
}

export function createOutput(stdout: TextSink, stderr: TextSink, jsonMode: boolean): Output {
  return {
    jsonMode,
    json: (value) => stdout.write(`${JSON.stringify(value, null, 2)}\n`),
    line: (...lines) => stdout.write(lines.map((l) => `${l}\n`).join("")),
    table: (headers, rows) => stdout.write(formatTable(headers, rows)),
    note: (text) => stderr.write(`${text}\n`),
  };
}

/** Control characters (including escape sequences a name could carry) shown as \u{..} instead of acting on the terminal. */
export function safeText(text: string): string {
  return text.replace(/[\p{Cc}\u2028\u2029]/gu, (c) => `\\u{${c.codePointAt(0)!.toString(16)}}`);
}

function width(text: string): number {
  return [...text].length;
}

export function formatTable(headers: string[], rows: string[][]): string {
  const cells = [headers, ...rows.map((row) => row.map(safeText))];
  const widths = headers.map((_, i) => Math.max(...cells.map((row) => width(row[i] ?? ""))));
  return cells
    .map((row) =>
      row
        .map((cell, i) => (i === row.length - 1 ? cell : cell + " ".repeat((widths[i] ?? 0) - width(cell))))
        .join("  ")
        .trimEnd(),
    )
    .map((line) => `${line}\n`)
    .join("");
}

/** ISO-8601 UTC, as in all JSON output. */
export function isoTime(ms: number): string {
  return new Date(ms).toISOString();
}

/** `"Acme"` style quoting for names inside human-readable sentences. */
export function quoted(text: string): string {
  return `"${safeText(text)}"`;
}
