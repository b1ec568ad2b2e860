import type { Store } from "../store/store.ts";
import type { Output } from "./output.ts";

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
  /** Opens the database on first use (applying pending migrations); the CLI closes it afterwards. */
  store(): Promise<Store>;
  out: Output;
  nowMs(): number;
}

export interface Command {
  name: string;
  /** Names of the required positional arguments, in order, such as ["NAME"]. */
  positionals: string[];
  /** Command-specific options; --json, --database and --help are added to every command. */
  options?: Record<string, OptionSpec>;
  /** The synopsis after `tds <group> <name>`; defaults to the positionals and options. */
  synopsis?: string;
  summary: string;
  run(ctx: CommandContext, input: CommandInput): Promise<void>;
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

export function stringOption(input: CommandInput, name: string): string | undefined {
  const value = input.options[name];
  return typeof value === "string" ? value : undefined;
}

export function requiredOption(input: CommandInput, name: string): string {
  const value = stringOption(input, name);
  if (value === undefined) throw new UsageError(`--${name} is required`);
  return value;
}
