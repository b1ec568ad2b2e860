import type { Parsed, Parser } from "./parsers.ts";
import type { Setting, ValueOf } from "./setting.ts";
import { SETTINGS } from "./settings-table.ts";

type Env = Record<string, string | undefined>;
type Table = typeof SETTINGS;
type ParsedKey = { [K in keyof Table]: Table[K] extends { parse: Parser<unknown> } ? K : never }[keyof Table];

/** Every parsed setting's value: from the environment, else the config file, else the table's default. */
export type SettingValues = { [K in ParsedKey]: ValueOf<Table[K]> };
/** Where each value came from: the variable's or the file key's name (messages name it), or null for the default. */
export type SettingSources = { [K in ParsedKey]: string | null };

/** An environment variable's text, trimmed; undefined when unset or blank. */
export function envText(env: Env, name: string): string | undefined {
  const raw = env[name]?.trim();
  return raw ? raw : undefined;
}

/** The value at a dotted path of the config file (`limits.max_questions`); undefined when absent. */
export function fileValue(file: object, path: string): unknown {
  let at: unknown = file;
  for (const part of path.split(".")) at = at !== null && typeof at === "object" ? (at as Record<string, unknown>)[part] : undefined;
  return at;
}

/** Problems start with the label; one that starts with ":" follows it directly. */
function addProblems(parsed: Parsed<unknown>, label: string, problems: string[]): void {
  if (!("problems" in parsed)) return;
  for (const p of parsed.problems) problems.push(p.startsWith(":") ? `${label}${p}` : `${label} ${p}`);
}

interface Read<T> {
  value: T | null | undefined;
  source: string | null;
}

/** One setting: a value that does not parse is a problem, and the next source (file, then default) is used instead. */
function readOne<T>(setting: Setting<T>, parse: Parser<T>, env: Env, file: object, problems: string[]): Read<T> {
  let fromEnv: Read<T> | null = null;
  const given = setting.env === null ? undefined : envText(env, setting.env);
  if (given !== undefined && setting.env !== null) {
    const parsed = parse.fromText(given);
    addProblems(parsed, setting.env, problems);
    if ("value" in parsed) fromEnv = { value: parsed.value, source: setting.env };
  }
  if (fromEnv !== null && setting.merge === undefined) return fromEnv;
  const stored = setting.file === null ? undefined : fileValue(file, setting.file);
  if (stored !== undefined && setting.file !== null) {
    const parsed = parse.fromFile(stored);
    addProblems(parsed, setting.file, problems);
    if ("value" in parsed) {
      if (fromEnv === null) return { value: parsed.value, source: setting.file };
      return { value: setting.merge!(parsed.value, fromEnv.value as T), source: fromEnv.source };
    }
  }
  return fromEnv ?? { value: setting.default, source: null };
}

/** Every setting of the table that has a parser, with where its value came from. */
export function readSettings(env: Env, file: object, problems: string[]): { values: SettingValues; sources: SettingSources } {
  const values: Record<string, unknown> = {};
  const sources: Record<string, string | null> = {};
  for (const [key, setting] of Object.entries(SETTINGS) as Array<[string, Setting<unknown>]>) {
    if (setting.parse === undefined) continue;
    const read = readOne(setting, setting.parse, env, file, problems);
    values[key] = read.value;
    sources[key] = read.source;
  }
  return { values: values as SettingValues, sources: sources as SettingSources };
}
