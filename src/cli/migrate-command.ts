import { type MigrationRecord, migrationReportOf } from "../store/open-store.ts";
import { CliError, type CommandGroup } from "./command.ts";

/** `tds migrate --json`: the migrations this run applied, and the schema version afterwards. */
export interface MigrateJson {
  dialect: "sqlite" | "postgres";
  /** Applied by this run, in order; empty when the database was up to date. */
  applied: { version: number; name: string }[];
  /** The highest migration version recorded in the database (0 for none). */
  schema_version: number;
  /** Every migration recorded in the database, in version order. */
  migrations: { version: number; name: string }[];
}

/** `001_initial`: a migration as its file is named. */
function label(m: MigrationRecord): string {
  return `${String(m.version).padStart(3, "0")}_${m.name}`;
}

const DIALECT_NAMES = { sqlite: "SQLite", postgres: "PostgreSQL" } as const;

/**
 * `tds migrate`: applies the pending migrations of the configured database now (rather than at the server's
 * next start) and says which. Safe while servers run: SQLite migrates in one BEGIN IMMEDIATE transaction,
 * PostgreSQL under an advisory lock, so a server starting at the same moment waits and applies nothing twice.
 */
export const migrateCommands: CommandGroup = {
  name: "migrate",
  summary: "Database schema migrations",
  commands: [
    {
      // The group is the command: `tds migrate` (see the empty-name convention in cli.ts).
      name: "",
      positionals: [],
      synopsis: "",
      summary: "Apply the database's pending schema migrations and show which were applied",
      databaseOnly: true,
      async run(ctx) {
        // Opening the store applies the pending migrations; openStore records which.
        const store = await ctx.store();
        if (!store) throw new CliError("tds migrate works on the database only");
        const report = migrationReportOf(store);
        if (!report) throw new CliError("The database was opened without a migration report");
        const version = report.current.at(-1)?.version ?? 0;
        if (ctx.out.jsonMode) {
          const json: MigrateJson = {
            dialect: report.dialect,
            applied: report.applied.map((m) => ({ version: m.version, name: m.name })),
            schema_version: version,
            migrations: report.current.map((m) => ({ version: m.version, name: m.name })),
          };
          return ctx.out.json(json);
        }
        const database = `the ${DIALECT_NAMES[report.dialect]} database`;
        const latest = report.current.at(-1);
        const at = latest ? `schema version ${version} (${label(latest)})` : "no schema version";
        if (report.applied.length === 0) {
          ctx.out.line(`No pending migrations: ${database} is at ${at}.`);
          return;
        }
        const n = report.applied.length;
        ctx.out.line(
          `Applied ${n} migration${n === 1 ? "" : "s"} to ${database}:`,
          ...report.applied.map((m) => `  ${label(m)}`),
          `Now at ${at}.`,
        );
      },
    },
  ],
};
