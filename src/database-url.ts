import { resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const ACCEPTED_DATABASE_URLS =
  "sqlite:PATH (relative to the current directory, e.g. sqlite:./data/tds.sqlite), sqlite::memory:, " +
  "file:PATH or file:///absolute/path, a bare path ending in .sqlite or .db, " +
  "or postgres://USER:PASSWORD@HOST:PORT/DATABASE (also postgresql://)";

/**
 * Where a SQLite database URL points: a file path (relative paths stay relative to the current
 * directory) or `:memory:`; null when the URL is not a SQLite URL.
 */
export function sqlitePathOf(databaseUrl: string): string | null {
  const url = databaseUrl.trim();
  let path: string | null = null;
  if (/^sqlite:/i.test(url)) {
    path = url.slice("sqlite:".length);
    // sqlite:///abs/path and sqlite://./rel/path: an empty authority, as in URL syntax.
    if (path.startsWith("//")) path = path.slice(2);
  } else if (/^file:/i.test(url)) {
    // file:///abs/path is a file URL (percent-decoded); file:./rel/path or file:rel is a plain path.
    path = url.slice("file:".length).startsWith("//") ? fileURLToPath(url) : url.slice("file:".length);
  } else if (!/^[a-z][a-z0-9+.-]*:\/\//i.test(url) && /\.(sqlite|db)$/i.test(url)) {
    path = url;
  }
  if (path === null) return null;
  if (path === "")
    throw new Error(`The database URL ${JSON.stringify(databaseUrl)} has no path; accepted forms: ${ACCEPTED_DATABASE_URLS}`);
  return path;
}

/** True for a PostgreSQL database URL (`postgres://…` or `postgresql://…`). */
export function isPostgresUrl(databaseUrl: string): boolean {
  return /^postgres(ql)?:\/\//i.test(databaseUrl.trim());
}

/** Why a database URL cannot be used, or null when its form is accepted (whether the database exists is not checked). */
export function databaseUrlProblem(databaseUrl: string): string | null {
  if (isPostgresUrl(databaseUrl)) {
    try {
      const url = new URL(databaseUrl.trim());
      return url.hostname === "" ? "has no host" : null;
    } catch {
      return "is not a valid URL";
    }
  }
  try {
    return sqlitePathOf(databaseUrl) === null ? `is not a database URL; accepted forms: ${ACCEPTED_DATABASE_URLS}` : null;
  } catch {
    return `has no path; accepted forms: ${ACCEPTED_DATABASE_URLS}`;
  }
}

/** A database for people to read: its kind and where it is (an absolute SQLite path; PostgreSQL without password or query). */
export function describeDatabase(databaseUrl: string): { kind: "SQLite" | "PostgreSQL"; location: string } {
  if (isPostgresUrl(databaseUrl)) {
    try {
      const url = new URL(databaseUrl.trim());
      const user = url.username ? `${decodeURIComponent(url.username)}@` : "";
      return { kind: "PostgreSQL", location: `postgres://${user}${url.host}${url.pathname}` };
    } catch {
      return { kind: "PostgreSQL", location: "(unparseable URL)" };
    }
  }
  const path = sqlitePathOf(databaseUrl) ?? databaseUrl;
  return { kind: "SQLite", location: path === ":memory:" ? ":memory:" : resolve(path) };
}
