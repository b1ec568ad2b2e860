import { statfsSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { isPostgresUrl, sqlitePathOf } from "../database-url.ts";
import { StartupFailure } from "./failures.ts";

/** The part of fs.statfsSync the check reads (a test passes its own). */
export type StatFs = (path: string) => { bavail: number | bigint; bsize: number | bigint };

const MIB = 1024 * 1024;

/** The folder that holds the database file, or the nearest existing one above it (the file and its folders may be created later). */
function existingFolder(file: string, statfs: StatFs): string | null {
  for (let dir = dirname(file); ; dir = dirname(dir)) {
    try {
      statfs(dir);
      return dir;
    } catch {
      if (dirname(dir) === dir) return null;
    }
  }
}

/**
 * Free space on the volume of a SQLite database, checked at start: with less than `minMb` MiB available to this user
 * the start stops, in one line that says how much is free, where, and which setting to change (on a full volume every
 * write fails, so every decision would get 503). Null when there is enough, for PostgreSQL (its disk is the server's),
 * for `:memory:`, with `minMb` 0, or when the volume cannot be examined (opening the database reports that).
 */
export function freeSpaceFailure(databaseUrl: string, minMb: number, statfs: StatFs = statfsSync): StartupFailure | null {
  if (minMb <= 0 || isPostgresUrl(databaseUrl)) return null;
  const path = sqlitePathOf(databaseUrl);
  if (path === null || path === ":memory:") return null;
  const file = resolve(path);
  const folder = existingFolder(file, statfs);
  if (folder === null) return null;
  let freeBytes: number;
  try {
    const stats = statfs(folder);
    freeBytes = Number(stats.bavail) * Number(stats.bsize);
  } catch {
    return null;
  }
  if (freeBytes >= minMb * MIB) return null;
  const free = freeBytes < MIB ? `${Math.floor(freeBytes / 1024)} KiB` : `${Math.floor(freeBytes / MIB)} MiB`;
  return new StartupFailure(
    `Only ${free} free on the volume of the SQLite database ${file} (TDS_DATABASE_URL); at least ${minMb} MiB are needed ` +
      `(TDS_MIN_FREE_DISK_MB): free space on that volume, move the database, or lower TDS_MIN_FREE_DISK_MB (0 turns the check off).`,
  );
}
