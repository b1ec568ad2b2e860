import { parseArgs } from "node:util";
import { AdminError } from "../admin/admin-error.ts";
import { operatorProblem, osOperator } from "../admin/operator.ts";
import { SERVICE_NAME, SERVICE_VERSION } from "../version.ts";
import { auditCommands } from "./audit-command.ts";
import { batchCommands } from "./batch-commands.ts";
import { CliError, type Command, type CommandGroup, type CommandInput, type OptionSpec, UsageError } from "./command.ts";
import { type Connection, chooseTransport, connect } from "./connection.ts";
import { creditCommands } from "./credit-commands.ts";
import { initCommands } from "./init-command.ts";
import { keyCommands } from "./key-commands.ts";
import { migrateCommands } from "./migrate-command.ts";
import { orgCommands } from "./org-commands.ts";
import { createOutput, quoted, type TextSink } from "./output.ts";
import { closest } from "./suggest.ts";
import { usageCommands } from "./usage-commands.ts";

/**
 * Every command group, in help order. A new group is a new file and one line here.
 * A group whose only command has the empty name is itself the command: `tds usage --org ORG`.
 */
export const COMMAND_GROUPS: CommandGroup[] = [
  initCommands,
  orgCommands,
  keyCommands,
  creditCommands,
  usageCommands,
  batchCommands,
  auditCommands,
  migrateCommands,
];

/** The command of a group that is itself a command (its only command, named ""), else null. */
function groupCommand(group: CommandGroup): Command | null {
  const only = group.commands.length === 1 ? group.commands[0]! : null;
  return only !== null && only.name === "" ? only : null;
}

const GLOBAL_OPTIONS: Record<string, OptionSpec> = {
  json: { type: "boolean", description: "Print one JSON document on stdout (lists are arrays, times ISO-8601)" },
  database: {
    type: "string",
    valueName: "URL",
    description: "Database URL; default: TDS_DATABASE_URL, then the TDS_CONFIG file, then sqlite:./data/tds.sqlite",
  },
  url: {
    type: "string",
    valueName: "URL",
    description: "Work through the admin API (tds batch: the API) of the gateway at URL (default: TDS_URL), such as http://127.0.0.1:8080",
  },
  actor: {
    type: "string",
    valueName: "NAME",
    description: "Who makes the changes, for the audit log (default: the OS user name)",
  },
  help: { type: "boolean", short: "h", description: "Show help (tds --version: the version)" },
};

export interface CliIo {
  stdout: TextSink;
  stderr: TextSink;
  env: Record<string, string | undefined>;
  /** For tests; defaults to Date.now. */
  nowMs?: () => number;
  /** The operator when --actor is not given; defaults to the OS user (osOperator). */
  operator?: () => string;
}

function synopsis(group: CommandGroup, command: Command): string {
  const args = command.synopsis ?? command.positionals.join(" ");
  return `tds ${[group.name, command.name, args].filter((part) => part !== "").join(" ")}`;
}

function optionLines(options: Record<string, OptionSpec>): string[] {
  const rows = Object.entries(options).map(([name, o]) => {
    const flag = `${o.short ? `-${o.short}, ` : "    "}--${name}${o.valueName ? ` ${o.valueName}` : ""}`;
    return [flag, o.description] as const;
  });
  const width = Math.max(...rows.map(([flag]) => flag.length));
  return rows.map(([flag, description]) => `  ${flag.padEnd(width)}  ${description}`);
}

function commandTable(groups: CommandGroup[]): string[] {
  const rows = groups.flatMap((g) => g.commands.map((c) => [synopsis(g, c), c.summary] as const));
  const width = Math.max(...rows.map(([s]) => s.length));
  return rows.map(([s, summary]) => `  ${s.padEnd(width)}  ${summary}`);
}

/** Global options that take a value, so that the value is not taken for a group or command word. */
const GLOBAL_VALUE_OPTIONS = new Set(
  Object.entries(GLOBAL_OPTIONS)
    .filter(([, o]) => o.type === "string")
    .map(([name]) => `--${name}`),
);

const FOOTER = [
  "ORG is an organization id (org_...) or its unique name.",
  "Without --url the CLI works on the server's database (TDS_DATABASE_URL); pending migrations are applied when it is opened.",
  "It never creates a database: tds init does (the server also creates its SQLite file on its first start).",
  "With --url URL (or TDS_URL) it works through that gateway's admin API, with the admin token from the environment",
  "variable TDS_ADMIN_TOKEN or the file TDS_ADMIN_TOKEN_FILE names (never an option: it would show in ps).",
  "tds migrate works on the database only.",
  "tds batch works through the gateway's API (--url URL or TDS_URL) with the API key in TDS_API_KEY, never the database.",
  "Every change is recorded in the audit log (tds audit) with who made it: --actor NAME, else the OS user name.",
  "Exit codes: 0 success, 1 error (such as an unknown organization or key), 2 bad usage,",
  "3 tds batch submit --wait: the batch ended cancelled or expired.",
];

export function usageText(): string {
  return [
    "Usage: tds <group> <command> [arguments] [options]",
    "",
    "Administer the Typed Decision Service: organizations, API keys, credits, usage records and the audit log; submit batches.",
    "",
    "Commands:",
    ...commandTable(COMMAND_GROUPS),
    "",
    "Options (every command):",
    ...optionLines(GLOBAL_OPTIONS),
    "",
    ...FOOTER,
    "Help for one group or command: tds help <group> [command], or tds <group> [command] --help",
    "",
  ].join("\n");
}

export function groupUsageText(group: CommandGroup): string {
  return [
    `Usage: tds ${group.name} <command> [arguments] [options]`,
    "",
    `${group.summary}.`,
    "",
    "Commands:",
    ...commandTable([group]),
    "",
    "Options (every command):",
    ...optionLines(GLOBAL_OPTIONS),
    "",
    ...FOOTER,
    "",
  ].join("\n");
}

export function commandUsageText(group: CommandGroup, command: Command): string {
  return [
    `Usage: ${synopsis(group, command)} [options]`,
    "",
    `${command.summary}.`,
    "",
    "Options:",
    ...optionLines({ ...(command.options ?? {}), ...GLOBAL_OPTIONS }),
    "",
    ...FOOTER,
    "",
  ].join("\n");
}

/** One line of usage instead of the whole help: the groups, or a group's commands, and where to read more. */
function shortUsage(group?: CommandGroup): string {
  if (!group) {
    const groups = COMMAND_GROUPS.map((g) => g.name).join(", ");
    return `Usage: tds <group> <command> [arguments] [options]; groups: ${groups}; more: tds --help`;
  }
  const commands = group.commands.map((c) => c.name).join(", ");
  return `Usage: tds ${group.name} <command> [arguments] [options]; commands: ${commands}; more: tds ${group.name} --help`;
}

/** The command of `group` named `word`, or the one it most likely misspells. */
function likelyCommand(group: CommandGroup, word: string | undefined): Command | undefined {
  const own = groupCommand(group);
  if (own || word === undefined) return own ?? undefined;
  const names = group.commands.map((c) => c.name);
  const name = names.includes(word) ? word : closest(word, names);
  return group.commands.find((c) => c.name === name);
}

/** `; did you mean …?` and the usage line of what is meant, or just the usage line of `fallback` when nothing is close. */
function didYouMean(group: CommandGroup | undefined, command: Command | undefined, fallback?: CommandGroup): string {
  if (!group) return `\n${shortUsage(fallback)}`;
  const words = `tds ${[group.name, command?.name ?? ""].filter((w) => w !== "").join(" ")}`;
  return `; did you mean \`${words}\`?\n${command ? `Usage: ${synopsis(group, command)} [options]` : shortUsage(group)}`;
}

/** For `tds WORD …` with no group named WORD: the nearest group (and its command the next word names) and a usage line. */
function unknownGroupText(words: string[]): string {
  const names = COMMAND_GROUPS.map((g) => g.name);
  const name = closest(words[0]!, names);
  const group = COMMAND_GROUPS.find((g) => g.name === name);
  return `tds: unknown command group ${quoted(words[0]!)}${didYouMean(group, group && likelyCommand(group, words[1]))}`;
}

/** For `tds GROUP WORD` with no such command in the group. */
function unknownCommandText(group: CommandGroup, word: string): string {
  const command = likelyCommand(group, word);
  return `tds: unknown command ${quoted(`tds ${group.name} ${word}`)}${didYouMean(command && group, command, group)}`;
}

/**
 * Splits `[global options] GROUP COMMAND [rest]`: the first two words that are not a global option
 * (or the value of --database or --url) name the group and the command.
 */
function splitWords(argv: string[]): { words: string[]; rest: string[] } {
  const words: string[] = [];
  const rest: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (words.length === 2 || arg === "--") {
      rest.push(...argv.slice(i));
      break;
    }
    if (arg.startsWith("-") && arg !== "-") {
      rest.push(arg);
      if (GLOBAL_VALUE_OPTIONS.has(arg) && i + 1 < argv.length) rest.push(argv[++i]!);
    } else {
      words.push(arg);
    }
  }
  return { words, rest };
}

interface ParsedArgs {
  input: CommandInput;
  json: boolean;
  database?: string;
  url?: string;
  actor?: string;
  help: boolean;
}

/** parseArgs's complaint, with the option most likely meant when it names an unknown one. */
function optionProblem(err: Error & { code?: string }, names: string[]): string {
  const unknown = err.code === "ERR_PARSE_ARGS_UNKNOWN_OPTION" ? /'--([^'=]+)'/.exec(err.message)?.[1] : undefined;
  const meant = unknown === undefined ? null : closest(unknown, names);
  return meant === null ? err.message : `unknown option --${unknown}; did you mean --${meant}?`;
}

function parseCommandArgs(command: Command, args: string[]): ParsedArgs {
  const options = { ...(command.options ?? {}), ...GLOBAL_OPTIONS };
  let parsed: { values: Record<string, unknown>; positionals: string[] };
  try {
    parsed = parseArgs({
      args,
      options: Object.fromEntries(
        Object.entries(options).map(([name, o]) => [name, { type: o.type, ...(o.short ? { short: o.short } : {}) }]),
      ),
      allowPositionals: true,
      strict: true,
    });
  } catch (err) {
    throw new UsageError(optionProblem(err as Error & { code?: string }, Object.keys(options)));
  }
  const values = parsed.values as Record<string, string | boolean | undefined>;
  const database = typeof values.database === "string" ? values.database : undefined;
  const url = typeof values.url === "string" ? values.url : undefined;
  const actor = typeof values.actor === "string" ? values.actor : undefined;
  if (actor !== undefined) {
    const problem = operatorProblem(actor);
    if (problem !== null) throw new UsageError(`--actor ${problem}`);
  }
  return {
    input: { positionals: parsed.positionals, options: values },
    json: values.json === true,
    ...(database === undefined ? {} : { database }),
    ...(url === undefined ? {} : { url }),
    ...(actor === undefined ? {} : { actor }),
    help: values.help === true,
  };
}

/** Runs one `tds` invocation and returns its exit code. Never calls process.exit. */
export async function runCli(argv: string[], io: CliIo): Promise<number> {
  const print = (sink: TextSink, text: string) => sink.write(text.endsWith("\n") ? text : `${text}\n`);
  if (argv.length === 1 && (argv[0] === "--version" || argv[0] === "-v")) {
    print(io.stdout, `tds (${SERVICE_NAME}) ${SERVICE_VERSION}`);
    return 0;
  }
  const { words, rest } = splitWords(argv);
  const wantsHelp = rest.includes("--help") || rest.includes("-h");

  // tds help [group [command]]
  if (words[0] === "help") {
    const group = COMMAND_GROUPS.find((g) => g.name === words[1]);
    const command = group?.commands.find((c) => c.name === rest.find((a) => !a.startsWith("-")));
    if (words[1] !== undefined && !group) {
      print(io.stderr, unknownGroupText(words.slice(1)));
      return 2;
    }
    const own = group ? groupCommand(group) : null;
    print(
      io.stdout,
      group ? (own ? commandUsageText(group, own) : command ? commandUsageText(group, command) : groupUsageText(group)) : usageText(),
    );
    return 0;
  }
  if (words.length === 0) {
    if (wantsHelp) {
      print(io.stdout, usageText());
      return 0;
    }
    print(io.stderr, usageText());
    return 2;
  }

  const group = COMMAND_GROUPS.find((g) => g.name === words[0]);
  if (!group) {
    print(io.stderr, unknownGroupText(words));
    return 2;
  }
  const own = groupCommand(group);
  if (own) return runCommand(group, own, withoutGroupWord(argv, group.name), io);
  if (words.length === 1) {
    if (wantsHelp) {
      print(io.stdout, groupUsageText(group));
      return 0;
    }
    print(io.stderr, `tds: missing command after "tds ${group.name}"\n\n${groupUsageText(group)}`);
    return 2;
  }
  const command = group.commands.find((c) => c.name === words[1]);
  if (!command) {
    print(io.stderr, unknownCommandText(group, words[1]!));
    return 2;
  }
  return runCommand(group, command, rest, io);
}

/** argv without the group word (the first word splitWords would find), for a group that is itself the command. */
function withoutGroupWord(argv: string[], groupName: string): string[] {
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === "--") break;
    if (GLOBAL_VALUE_OPTIONS.has(arg)) i++;
    else if (arg === groupName) return [...argv.slice(0, i), ...argv.slice(i + 1)];
  }
  return argv;
}

/** A command's exit code: the number it returned, else 0 (what `return ctx.out.line(…)` passes on is no code). */
function exitCodeOf(returned: unknown): number {
  return typeof returned === "number" ? returned : 0;
}

/** Parses the command's arguments (`rest`: everything but the group and command words), connects on demand and runs it. */
async function runCommand(group: CommandGroup, command: Command, rest: string[], io: CliIo): Promise<number> {
  const print = (sink: TextSink, text: string) => sink.write(text.endsWith("\n") ? text : `${text}\n`);
  let connection: Connection | null = null;
  try {
    const parsed = parseCommandArgs(command, rest);
    if (parsed.help) {
      print(io.stdout, commandUsageText(group, command));
      return 0;
    }
    const given = parsed.input.positionals;
    const words = `tds ${[group.name, command.name].filter((w) => w !== "").join(" ")}`;
    if (given.length !== command.positionals.length) {
      const expected = command.positionals.length === 0 ? "no arguments" : command.positionals.join(" ");
      throw new UsageError(
        `"${words}" takes ${expected}, got ${given.length === 0 ? "none" : given.map((g) => JSON.stringify(g)).join(" ")}`,
      );
    }
    const out = createOutput(io.stdout, io.stderr, parsed.json);
    const nowMs = io.nowMs ?? Date.now;
    if (command.usesApiKey) {
      if (parsed.database !== undefined)
        throw new UsageError(`"${words}" works through the gateway's API (--url or TDS_URL), not on a database: leave out --database`);
      const noAdministration = () => Promise.reject(new CliError(`"${words}" works through the gateway's API, not the administration`));
      const ctx = { out, nowMs, env: io.env, stdout: io.stdout, stderr: io.stderr, admin: noAdministration, store: async () => null };
      return exitCodeOf(await command.run(ctx, parsed.input));
    }
    const transport = chooseTransport(
      { ...(parsed.url === undefined ? {} : { url: parsed.url }), ...(parsed.database === undefined ? {} : { database: parsed.database }) },
      io.env,
    );
    if (command.databaseOnly && transport.kind === "http") {
      throw new UsageError(
        `"${words}" works on the database only, not through the admin API (${transport.via}); ${transport.via === "--url" ? "leave out --url" : "unset TDS_URL"} or pass --database URL`,
      );
    }
    if (transport.kind === "http" && transport.droppedPath !== undefined) {
      print(
        io.stderr,
        `Using the gateway at ${transport.url}: ${transport.via} takes the gateway's URL, without ${transport.droppedPath}.`,
      );
    }
    const opened = connect(transport, {
      env: io.env,
      nowMs,
      operator: parsed.actor ?? (io.operator ?? osOperator)(),
      create: command.createsDatabase === true,
      onImplicitDatabase: (description) => print(io.stderr, `Using the ${description}.`),
    });
    connection = opened;
    const ctx = { out, nowMs, env: io.env, stdout: io.stdout, stderr: io.stderr, admin: () => opened.admin(), store: () => opened.store() };
    return exitCodeOf(await command.run(ctx, parsed.input));
  } catch (err) {
    if (err instanceof UsageError || (err instanceof AdminError && err.reason === "invalid")) {
      print(io.stderr, `tds: ${err.message}\n\n${commandUsageText(group, command)}`);
      return 2;
    }
    if (err instanceof AdminError) {
      print(io.stderr, `tds: ${err.message}${err.reason === "not_found" ? ` ${command.notFoundHint ?? "See: tds org list"}` : ""}`);
      return 1;
    }
    print(io.stderr, `tds: ${(err as Error).message ?? String(err)}`);
    if (!(err instanceof CliError) && io.env.TDS_DEBUG) print(io.stderr, (err as Error).stack ?? "");
    return 1;
  } finally {
    await connection?.close();
  }
}
