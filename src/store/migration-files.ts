import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";

/** One versioned migration file of a dialect (src/store/migrations/<dialect>/NNN_name.sql). */
export interface Migration {
  version: number;
  /** The part of the file name after the version, such as `initial`. */
  name: string;
  file: string;
  sql: string;
}

const MIGRATION_FILE = /^(\d{3,})_([A-Za-z0-9_-]+)\.sql$/;

/** Reads `NNN_name.sql` files, ordered by version. Any other `.sql` file, or two files with one version, is an error. */
export function readMigrations(dir: string): Migration[] {
  const migrations: Migration[] = [];
  for (const file of readdirSync(dir).sort()) {
    if (!file.endsWith(".sql")) continue;
    const match = MIGRATION_FILE.exec(file);
    if (!match) throw new Error(`Migration file ${join(dir, file)} is not named NNN_name.sql`);
    const version = Number(match[1]);
    const previous = migrations.find((m) => m.version === version);
    if (previous) throw new Error(`Migration files ${previous.file} and ${file} in ${dir} have the same version ${version}`);
    migrations.push({ version, name: match[2]!, file, sql: readFileSync(join(dir, file), "utf8") });
  }
  return migrations.sort((a, b) => a.version - b.version);
}
