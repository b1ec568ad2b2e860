import type { AdminOperations } from "../admin/operations.ts";
import { withSecretFiles } from "../config-secret-files.ts";
import type { Store } from "../store/store.ts";
import { CliError, UsageError } from "./command.ts";

/** Where the CLI works: on the database directly, or through a gateway's admin API. */
export type Transport =
  /** `databaseUrl`: from --database; without it, the server's configuration says. */
  | { kind: "database"; databaseUrl?: string }
  /**
   * `via`: what selected the admin API, for messages; `droppedPath`: the path of one of the gateway's own endpoints
   * that the given URL ended in (`/admin/v1`, `/v1/models`), which `url` leaves out.
   */
  | { kind: "http"; url: string; token: string; via: "--url" | "TDS_URL"; droppedPath?: string };

const EXAMPLE_URL = "http://127.0.0.1:8080";

/**
 * A path of the gateway's own (the admin API, the decision API, the console…) at the end of a URL. What comes before
 * it is a reverse proxy's prefix, and is kept.
 */
const GATEWAY_PATH =
  /(?:\/admin(?:\/.*)?|\/v1(?:\/.*)?|\/api\/config|\/console(?:\/.*)?|\/docs(?:\/.*)?|\/openapi\.json|\/healthz|\/readyz|\/metrics)\/*$/i;

export function gatewayUrl(via: string, text: string): { url: string; droppedPath?: string } {
  let url: URL;
  try {
    url = new URL(text.trim());
  } catch {
    throw new UsageError(`${via} must be the gateway's URL, such as ${EXAMPLE_URL}; got ${JSON.stringify(text)}`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:")
    throw new UsageError(`${via} must be an http:// or https:// URL, such as ${EXAMPLE_URL}`);
  if (url.username !== "" || url.password !== "")
    throw new UsageError(`${via} must not contain credentials; the admin token is taken from TDS_ADMIN_TOKEN or TDS_ADMIN_TOKEN_FILE`);
  if (url.search !== "" || url.hash !== "") throw new UsageError(`${via} must not have a query or a fragment`);
  const path = url.pathname.replace(/\/+$/, "");
  const dropped = GATEWAY_PATH.exec(path);
  if (dropped === null) return { url: `${url.origin}${path}` };
  return { url: `${url.origin}${path.slice(0, dropped.index)}`, droppedPath: dropped[0] };
}

/** The admin token from TDS_ADMIN_TOKEN or the file TDS_ADMIN_TOKEN_FILE names (read as the server reads it). */
function adminToken(via: string, env: Record<string, string | undefined>): string {
  const problems: string[] = [];
  const source = env.TDS_ADMIN_TOKEN_FILE?.trim() ? "TDS_ADMIN_TOKEN_FILE" : "TDS_ADMIN_TOKEN";
  const token =
    withSecretFiles({ TDS_ADMIN_TOKEN: env.TDS_ADMIN_TOKEN, TDS_ADMIN_TOKEN_FILE: env.TDS_ADMIN_TOKEN_FILE }, problems).TDS_ADMIN_TOKEN ??
    "";
  if (problems.length > 0) throw new CliError(problems.join("; "));
  if (token === "") {
    throw new UsageError(
      `${via} works through the gateway's admin API, which needs its admin token: set TDS_ADMIN_TOKEN (or TDS_ADMIN_TOKEN_FILE, a file holding it) in the environment (it is never a command-line option)`,
    );
  }
  if (/[\s\p{Cc}]/u.test(token)) throw new UsageError(`${source} must not contain whitespace or control characters`);
  return token;
}

/**
 * The admin API with --url or TDS_URL (and the token from TDS_ADMIN_TOKEN or TDS_ADMIN_TOKEN_FILE, never a flag: it
 * would show in `ps`); else the database. --database wins over TDS_URL, as it wins over TDS_DATABASE_URL; with --url
 * it is a usage error.
 */
export function chooseTransport(options: { url?: string; database?: string }, env: Record<string, string | undefined>): Transport {
  if (options.url !== undefined && options.database !== undefined) {
    throw new UsageError(
      "--url and --database do not go together: --url works through the gateway's admin API, --database on the database directly",
    );
  }
  if (options.database !== undefined) {
    if (options.database.trim() === "") throw new UsageError("--database needs a database URL");
    return { kind: "database", databaseUrl: options.database };
  }
  const fromEnv = env.TDS_URL?.trim() === "" ? undefined : env.TDS_URL;
  const via = options.url !== undefined ? "--url" : fromEnv !== undefined ? "TDS_URL" : null;
  if (via === null) return { kind: "database" };
  const text = options.url ?? fromEnv!;
  if (text.trim() === "") throw new UsageError(`--url needs the gateway's URL, such as ${EXAMPLE_URL}`);
  const { url, droppedPath } = gatewayUrl(via, text);
  return { kind: "http", url, token: adminToken(via, env), via, ...(droppedPath === undefined ? {} : { droppedPath }) };
}

/** A run's administration, opened on first use and closed once the command is done. */
export interface Connection {
  admin(): Promise<AdminOperations>;
  /** The database; null over the admin API. */
  store(): Promise<Store | null>;
  close(): Promise<void>;
}

export interface ConnectOptions {
  env: Record<string, string | undefined>;
  nowMs: () => number;
  /** Who runs the command (--actor, else the OS user): the audit log's client of every change it makes. */
  operator: string;
  /** `tds init` only: a missing SQLite file is created; every other command refuses to create one. */
  create?: boolean;
  /** Told which database was opened when nobody chose it (the default or the TDS_CONFIG file), for a notice. */
  onImplicitDatabase?: (description: string) => void;
}

export function connect(transport: Transport, options: ConnectOptions): Connection {
  return transport.kind === "http" ? connectHttp(transport, options.operator) : connectDatabase(transport.databaseUrl, options);
}

function connectHttp(transport: Extract<Transport, { kind: "http" }>, operator: string): Connection {
  let admin: Promise<AdminOperations> | null = null;
  return {
    admin: () => {
      // Loaded on first use, so help and usage errors stay fast (the client compiles the contract's schemas).
      admin ??= import("./http-administration.ts").then(
        ({ HttpAdministration }) => new HttpAdministration({ url: transport.url, token: transport.token, operator }),
      );
      return admin;
    },
    store: async () => null,
    close: async () => {},
  };
}

function connectDatabase(databaseUrl: string | undefined, options: ConnectOptions): Connection {
  const { env, nowMs } = options;
  let opened: Promise<{ store: Store; admin: AdminOperations }> | null = null;
  const open = async () => {
    // Loaded on first use, so help and usage errors stay fast (config compiles its schema at import).
    const { ConfigError, DEFAULT_LIMITS, loadConfig } = await import("../config.ts");
    const { DatabaseMissingError, openStore } = await import("../store/open-store.ts");
    const { describeDatabase } = await import("../database-url.ts");
    const { StoreAdministration } = await import("../admin/store-administration.ts");
    const { configKeyRules } = await import("../admin/key-settings.ts");
    let url = databaseUrl;
    let previewRequestLimit = DEFAULT_LIMITS.previewRequestLimit;
    let keyRules: import("../admin/key-settings.ts").KeyRules | undefined;
    try {
      const config = loadConfig(env);
      url ??= config.databaseUrl;
      previewRequestLimit = config.limits.previewRequestLimit;
      keyRules = configKeyRules(config);
    } catch (err) {
      // With --database the configuration only supplies the preview limit (shown by tds org show).
      if (url === undefined) {
        if (err instanceof ConfigError) throw new CliError(`${err.message}\n(or pass --database URL)`);
        throw err;
      }
    }
    const chosenBy =
      databaseUrl !== undefined
        ? "--database"
        : env.TDS_DATABASE_URL?.trim()
          ? "TDS_DATABASE_URL"
          : env.TDS_DATABASE_URL_FILE?.trim()
            ? "TDS_DATABASE_URL_FILE"
            : env.TDS_CONFIG?.trim()
              ? "TDS_CONFIG"
              : null;
    let store: Store;
    try {
      store = await openStore(url, { mustExist: options.create !== true });
    } catch (err) {
      if (!(err instanceof DatabaseMissingError)) throw err;
      throw new CliError(
        `No database at ${err.path} (${chosenBy ?? "the default database URL"}); the CLI never creates one. ` +
          "Run it in the gateway's folder, point --database or TDS_DATABASE_URL at the gateway's database, or create a new one with: tds init",
      );
    }
    if (chosenBy === null || chosenBy === "TDS_CONFIG") {
      const { kind, location } = describeDatabase(url);
      options.onImplicitDatabase?.(
        `${kind} database ${location} (${chosenBy === null ? "the default" : "from the TDS_CONFIG file"}; --database or TDS_DATABASE_URL choose another)`,
      );
    }
    const admin = new StoreAdministration({
      store,
      previewRequestLimit,
      nowMs,
      actor: { source: "cli", client: options.operator, remoteAddress: null },
      ...(keyRules === undefined ? {} : { keyRules }),
    });
    return { store, admin };
  };
  /** Opens the database on the first call; later calls share that attempt. */
  const openOnce = () => {
    opened ??= open();
    return opened;
  };
  return {
    admin: async () => (await openOnce()).admin,
    store: async () => (await openOnce()).store,
    close: async () => {
      if (opened) await (await opened.catch(() => null))?.store.close();
    },
  };
}
