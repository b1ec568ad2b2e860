/**
 * Entry of the `tds` command: `npx tds …` (bin/tds.mjs), `npm run tds -- …`, or `node --import tsx src/cli/main.ts …`.
 * Argument parsing and the command table are in cli.ts, so tests can run commands without this side effect.
 */
import { runCli } from "./cli.ts";

process.exitCode = await runCli(process.argv.slice(2), { stdout: process.stdout, stderr: process.stderr, env: process.env });
