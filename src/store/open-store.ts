import { fileURLToPath } from "node:url";
import type { Store } from "./store.ts";
import { openSqliteStore } from "./sqlite/sqlite-store.ts";

const ACCEPTED_FORMS =
  "sqlite:PATH (relative to the current directory, e.g. sqlite:./data/tds.sqlite), sqlite::memory:, " +
  "file:PATH or file:///absolute/path, or a bare path ending in .sqlite or .db";

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
  if (path === "") throw new Error(`The database URL ${JSON.stringify(databaseUrl)} has no path; accepted forms: ${ACCEPTED_FORMS}`);
  return path;
}

/** Opens the store a database URL names and applies its pending migrations. */
export async function openStore(databaseUrl: string): Promise<Store> {
  if (/^postgres(ql)?:\/\//i.test(databaseUrl.trim())) {
    throw new Error("PostgreSQL support is not available yet: use a SQLite database URL such as sqlite:./data/tds.sqlite");
  }
  const path = sqlitePathOf(databaseUrl);
  if (path === null) {
    throw new Error(`Unsupported database URL ${JSON.stringify(databaseUrl)}; accepted forms: ${ACCEPTED_FORMS}`);
  }
  return openSqliteStore(path);
}
