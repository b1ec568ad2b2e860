import type { Parser } from "./parsers.ts";

/** The parts of .env.example, in order. */
export const SECTIONS = {
  configFile: "Configuration file",
  server: "Server",
  connections: 'Connections and reverse proxies (docs/deployment.md, "Behind a reverse proxy")',
  database: "Database",
  limits: "Rate limits and quotas",
  paid: "Service mode and paid mode",
  batches: "Batch decisions",
  models: "Models",
  engine: "In-process engine (node-llama-cpp, an optional dependency)",
  admin: "Administration and metrics",
  logging: "Logging",
  tracing: 'Tracing: OpenTelemetry, off unless an OTLP endpoint is set (docs/deployment.md, "Tracing")',
  bootstrap: "Bootstrap (first start with an empty database)",
  cli: "tds CLI (read by the command, not by the server)",
} as const;
export type Section = keyof typeof SECTIONS;

/** One row of the settings table: where a setting comes from, its default, its parser and what it means. */
export interface Setting<T = unknown> {
  /** The environment variable; null: the config file only. */
  env: string | null;
  /** The dotted path in the TDS_CONFIG file; null: the environment only. */
  file: string | null;
  /** The README's "File key" cell when the file holds it in another form (models[] entries). */
  fileDocs?: string;
  /** Absent for a setting another part reads itself (the tds CLI, the engine, logging, the models' structure). */
  parse?: Parser<T>;
  /** null: none; undefined: derived from other settings (see defaultText). */
  default: T | null | undefined;
  /** The default as the docs say it (markdown), when it is not the value itself: "none (in-memory)". */
  defaultText?: string;
  /** The value .env.example shows, when it is not the default. */
  example?: string;
  section: Section;
  /** The README table's "Meaning" cell (markdown, one line). */
  summary: string;
  /** The comment above it in .env.example (one paragraph, wrapped when written). */
  details: string;
  /** How a value in both places is combined; without it the environment's wins. */
  merge?: (fromFile: T, fromEnv: T) => T;
  /** Also read from the file named by `<env>_FILE`; `note` ends that variable's comment. */
  secretFile?: { note?: string };
  /** In the config file, a secret whose file other users must not read: always, or when the URL has a password. */
  secret?: "value" | "url-password";
}

/** A setting whose value lands in Config: T with a default, T | null without one, T | undefined when derived. */
export function setting<T, const D extends T | null | undefined>(
  row: Omit<Setting<NoInfer<T>>, "default"> & { parse: Parser<T>; default: D },
): Omit<Setting<T>, "default"> & { parse: Parser<T>; default: D } {
  return row as Omit<Setting<T>, "default"> & { parse: Parser<T>; default: D };
}

/** A setting documented here but read elsewhere (no parser, no Config value). */
export function documented(row: Omit<Setting<never>, "parse">): Setting<never> {
  return row;
}

/** The value a table row gives Config. */
export type ValueOf<S> = S extends { parse: Parser<infer T>; default: infer D } ? T | D : never;
