/** Turns pino's JSON lines into one readable line each (a terminal's log format). */

const LEVELS: Record<number, { label: string; color: string }> = {
  10: { label: "TRACE", color: "\x1b[90m" },
  20: { label: "DEBUG", color: "\x1b[36m" },
  30: { label: "INFO ", color: "\x1b[32m" },
  40: { label: "WARN ", color: "\x1b[33m" },
  50: { label: "ERROR", color: "\x1b[31m" },
  60: { label: "FATAL", color: "\x1b[41m" },
};
const RESET = "\x1b[0m";
const DIM = "\x1b[2m";
/** Shown in the line's head, or dropped (`startup` repeats the start-up summary's text): the rest follow as key=value. */
const HEAD_FIELDS = new Set(["level", "time", "pid", "hostname", "msg", "component", "err", "v", "startup"]);

function time(ms: unknown): string {
  const d = typeof ms === "number" ? new Date(ms) : new Date();
  return d.toISOString().slice(11, 23);
}

function value(v: unknown): string {
  if (typeof v === "string") return /^[^\s"=]+$/.test(v) ? v : JSON.stringify(v);
  return JSON.stringify(v) ?? String(v);
}

/** A request's log fields, shortened: `GET /v1/models 200 1.2 ms`. */
function requestSummary(record: Record<string, unknown>): string | null {
  const req = record.req as { method?: string; url?: string } | undefined;
  const res = record.res as { statusCode?: number } | undefined;
  if (!req && !res) return null;
  const parts = [
    req?.method,
    req?.url,
    res?.statusCode,
    typeof record.responseTime === "number" ? `${record.responseTime.toFixed(1)} ms` : undefined,
  ];
  const text = parts.filter((p) => p !== undefined).join(" ");
  return text === "" ? null : text;
}

export function formatLogLine(line: string, colors: boolean): string {
  let record: Record<string, unknown>;
  try {
    record = JSON.parse(line) as Record<string, unknown>;
  } catch {
    return line.endsWith("\n") ? line : `${line}\n`;
  }
  const level = LEVELS[record.level as number] ?? { label: String(record.level).padEnd(5), color: "" };
  const head = colors ? `${DIM}${time(record.time)}${RESET} ${level.color}${level.label}${RESET}` : `${time(record.time)} ${level.label}`;
  const component = typeof record.component === "string" ? `[${record.component}] ` : "";
  const request = requestSummary(record);
  const rest = Object.entries(record)
    .filter(([k]) => !HEAD_FIELDS.has(k) && !(request !== null && (k === "req" || k === "res" || k === "responseTime")))
    .map(([k, v]) => `${k}=${value(v)}`);
  const text = [component + String(record.msg ?? ""), request, ...rest].filter((p) => p !== null && p !== "").join("  ");
  const err = record.err as { stack?: string; message?: string } | undefined;
  const errText = err ? `\n    ${(err.stack ?? err.message ?? JSON.stringify(err)).split("\n").join("\n    ")}` : "";
  return `${head} ${text}${errText}\n`;
}

/** A pino destination writing readable lines to `out`. */
export function prettyDestination(out: { write(text: string): unknown }, colors: boolean): { write(line: string): void } {
  return { write: (line) => void out.write(formatLogLine(line, colors)) };
}
