import { describeDatabase } from "../database-url.ts";

/** A start that cannot go on, said in one line that names the setting to change (printed without a stack). */
export class StartupFailure extends Error {
  constructor(message: string) {
    super(message);
    this.name = "StartupFailure";
  }
}

/** The error's code, also when Node wraps one connection attempt per address in an AggregateError. */
function codeOf(err: unknown): string | undefined {
  const e = err as { code?: unknown; errors?: unknown[] } | null;
  if (typeof e?.code === "string") return e.code;
  return e?.errors?.map(codeOf).find((c) => c !== undefined);
}

function messageOf(err: unknown): string {
  const text = err instanceof Error ? err.message : String(err);
  return text.split("\n")[0]!.trim() || (codeOf(err) ?? "unknown error");
}

const NETWORK_REASONS: Record<string, string> = {
  ECONNREFUSED: "the connection was refused (is the server running there?)",
  ENOTFOUND: "the host name cannot be resolved",
  EAI_AGAIN: "the host name cannot be resolved right now",
  ETIMEDOUT: "the connection timed out",
  EHOSTUNREACH: "the host cannot be reached",
  ECONNRESET: "the server closed the connection",
};

const POSTGRES_REASONS: Record<string, string> = {
  "28P01": "the password was refused: check the user and password",
  "28000": "the login was refused: check the user (and pg_hba.conf on the server)",
  "3D000": "the database does not exist: create it (createdb NAME) or name another",
  "57P03": "the server is starting up or shutting down: try again in a moment",
  "53300": "the server has no free connections: lower pool_size or raise max_connections",
};

/** Why the database cannot be opened, naming TDS_DATABASE_URL (its password never shown). */
export function databaseFailure(err: unknown, databaseUrl: string): StartupFailure {
  const { kind, location } = describeDatabase(databaseUrl);
  const code = codeOf(err);
  const reason = (code && (NETWORK_REASONS[code] ?? POSTGRES_REASONS[code])) ?? messageOf(err);
  const advice =
    kind === "SQLite"
      ? "change TDS_DATABASE_URL or make its folder writable"
      : code !== undefined && code in NETWORK_REASONS
        ? "start the database or change TDS_DATABASE_URL"
        : "change TDS_DATABASE_URL";
  return new StartupFailure(`Cannot open the ${kind} database at ${location} (TDS_DATABASE_URL): ${reason}; ${advice}.`);
}

/** Why the server cannot listen, naming HOST and PORT. */
export function listenFailure(err: unknown, host: string, port: number): StartupFailure {
  const at = `${host}:${port}`;
  switch (codeOf(err)) {
    case "EADDRINUSE":
      return new StartupFailure(
        `Cannot listen on ${at}: the address is already in use by another process; stop it or set PORT (or HOST) to a free address.`,
      );
    case "EACCES":
      return new StartupFailure(`Cannot listen on ${at}: not allowed (ports below 1024 need privileges); set PORT to 1024 or above.`);
    case "EADDRNOTAVAIL":
    case "ENOTFOUND":
    case "EAI_AGAIN":
      return new StartupFailure(
        `Cannot listen on ${at}: HOST ${JSON.stringify(host)} is not an address of this machine; set HOST to 127.0.0.1, 0.0.0.0 or one of its addresses.`,
      );
    default:
      return new StartupFailure(`Cannot listen on ${at} (HOST, PORT): ${messageOf(err)}.`);
  }
}
