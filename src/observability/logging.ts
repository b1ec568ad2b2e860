import pino, { type Logger } from "pino";
import type { LogFormat, LogLevel } from "../config.ts";
import { prettyDestination } from "./pretty-log.ts";
import { traceLogFields } from "./spans.ts";

/** Never logged: an API key or admin token in a request's headers. */
export const LOG_REDACTION = { paths: ["req.headers.authorization", "req.headers.cookie"], censor: "[redacted]" };

export interface LogOutput {
  write(text: string): unknown;
  isTTY?: boolean;
}

/** Readable lines on a terminal, JSON lines otherwise; `format` (TDS_LOG_FORMAT) overrides. */
export function resolveLogFormat(format: LogFormat | null, out: LogOutput): LogFormat {
  return format ?? (out.isTTY ? "pretty" : "json");
}

/** `traced`: each line written for a traced request carries its trace_id and span_id. */
export function createLogger(
  settings: { logLevel: LogLevel; logFormat: LogFormat | null; traced?: boolean },
  out: LogOutput = process.stdout,
): Logger {
  const options = { level: settings.logLevel, redact: LOG_REDACTION, ...(settings.traced ? { mixin: traceLogFields } : {}) };
  if (resolveLogFormat(settings.logFormat, out) === "json") return pino(options, out === process.stdout ? pino.destination(1) : out);
  const colors = out.isTTY === true && !process.env.NO_COLOR;
  return pino(options, prettyDestination(out, colors));
}
