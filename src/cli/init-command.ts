import { migrationReportOf } from "../store/open-store.ts";
import { CliError, type CommandGroup } from "./command.ts";

/** `tds init --json`. */
export interface InitJson {
  database: string;
  /** True when this run created the schema (a new database). */
  created: boolean;
  applied: number;
  schema_version: number;
}

/**
 * `tds init`: creates the database (a new SQLite file, or the schema in an existing PostgreSQL database) and
 * applies every migration. The only command that may create a SQLite file; the others refuse, so that a command
 * run from the wrong folder cannot quietly start an empty database. Idempotent.
 */
export const initCommands: CommandGroup = {
  name: "init",
  summary: "Create the database",
  commands: [
    {
      name: "",
      positionals: [],
      synopsis: "",
      summary: "Create the database (a new SQLite file, or the schema in PostgreSQL) and apply every migration",
      databaseOnly: true,
      createsDatabase: true,
      async run(ctx) {
        const store = await ctx.store();
        const report = store ? migrationReportOf(store) : null;
        if (!report) throw new CliError("tds init works on the database only");
        const version = report.current.at(-1)?.version ?? 0;
        const created = report.applied.length > 0 && report.applied.length === report.current.length;
        if (ctx.out.jsonMode) {
          const json: InitJson = { database: report.database, created, applied: report.applied.length, schema_version: version };
          return ctx.out.json(json);
        }
        if (created)
          ctx.out.line(
            `Created the ${report.database} (schema version ${version}).`,
            "Next: tds org create NAME, then tds key create --org NAME",
          );
        else if (report.applied.length > 0)
          ctx.out.line(
            `The ${report.database} exists; applied ${report.applied.length} pending migration(s), now at schema version ${version}.`,
          );
        else ctx.out.line(`The ${report.database} already exists (schema version ${version}); nothing to do.`);
      },
    },
  ],
};
