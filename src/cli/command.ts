import { checkName } from "../admin/names.ts";
import type { AdminOperations } from "../admin/operations.ts";
import type { Store } from "../store/store.ts";
import type { Output, TextSink } from "./output.ts";

/**
 * The shape of the `tds` command table. A command group (org, key, and later credits, usage, …) is one file
 * exporting a CommandGroup, listed once in COMMAND_GROUPS (src/cli/cli.ts).
 */
export interface OptionSpec {
  type: "string" | "boolean";
  short?: string;
  /** Shown in help, such as `ORG` for `--org ORG`. */
  valueName?: string;
  description: string;
}

export interface CommandInput {
  positionals: string[];
  options: Record<string, string | boolean | undefined>;
}

export interface CommandContext {
  /**
   * The administration the command runs on, opened on first use: the database (changes recorded in the audit log
   * with source "cli"), or the gateway's admin API with --url / TDS_URL.
   */
  admin(): Promise<AdminOperations>;
  /**
   * The database itself, opened on first use (applying pending migrations); the CLI closes it afterwards.
   * Null over the admin API: only commands marked `databaseOnly` can count on it.
   */
  store(): Promise<Store | null>;
  out: Output;
  nowMs(): number;
  /** The environment the CLI runs in. */
  env: Record<string, string | undefined>;
  /** stdout and stderr themselves (isTTY on a terminal), for commands that stream output or redraw a progress line. */
  stdout: TextSink & { isTTY?: boolean };
  stderr: TextSink & { isTTY?: boolean };
}

export interface Command {
  name: string;
  /** Names of the required positional arguments, in order, such as ["NAME"]. */
  positionals: string[];
  /** Command-specific options; --json, --database, --url and --help are added to every command. */
  options?: Record<string, OptionSpec>;
  /** The synopsis after `tds <group> <name>`; defaults to the positionals and options. */
  synopsis?: string;
  summary: string;
  /** Works on the database only (tds migrate): with --url or TDS_URL it is a usage error. */
  databaseOnly?: boolean;
  /** May create a new SQLite database (tds init); every other command needs an existing one. */
  createsDatabase?: boolean;
  /** Appended to a "not found" failure, such as "See: tds org list" (the default). */
  notFoundHint?: string;
  /**
   * Works through the gateway's /v1 API with an API key (tds batch): neither the database nor the admin API is
   * opened, TDS_URL asks for no admin token, and --database is a usage error.
   */
  usesApiKey?: boolean;
  /** The exit code when it returns one (default 0); a CliError is 1, a UsageError 2. */
  // biome-ignore lint/suspicious/noConfusingVoidType: most commands return nothing
  run(ctx: CommandContext, input: CommandInput): Promise<void | number>;
}

export interface CommandGroup {
  name: string;
  summary: string;
  commands: Command[];
}

/** Bad usage: the message, then the usage text, go to stderr; exit code 2. */
export class UsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "UsageError";
  }
}

/** A failure the user can act on (unknown organization, name taken, …): message on stderr; exit code 1. */
export class CliError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "CliError";
  }
}

/** A name given on the command line (organization, key, note), checked as the admin API checks it. */
export function nameArgument(label: string, raw: string): string {
  const checked = checkName(raw);
  if ("problem" in checked) throw new UsageError(`${label} ${checked.problem}`);
  return checked.name;
}

export function stringOption(input: CommandInput, name: string): string | undefined {
  const value = input.options[name];
  return typeof value === "string" ? value : undefined;
}

export function requiredOption(input: CommandInput, name: string): string {
  const value = stringOption(input, name);
  if (value === undefined) throw new UsageError(`--${name} is required`);
  return value;
}
