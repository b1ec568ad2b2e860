/**
 * How long one `tds` command takes from the shell: `node bin/tds.mjs org list` (the compiled CLI) against a SQLite
 * database with a few organizations, beside the same command run from the TypeScript sources through tsx (how the
 * CLI ran before the compiled build). Prints wall time (median, min, max) and each child's CPU time (user + system,
 * from /usr/bin/time's rusage) per run. Run: npm run build && npx tsx bench/cli.ts [runs]
 */
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openStore } from "../src/store/open-store.ts";
import { ROOT } from "./support.ts";

const RUNS = Number(process.argv[2] ?? 15);
const TARGET_SECONDS = 0.35;

interface Sample {
  wall: number;
  cpu: number;
}

function measure(args: string[], env: Record<string, string>): Sample {
  const started = process.hrtime.bigint();
  // GNU time prints the child's user and system seconds on stderr (the last line, after the command's own).
  const result = spawnSync("/usr/bin/time", ["-f", "%U %S", process.execPath, ...args], {
    cwd: ROOT,
    encoding: "utf8",
    env: { PATH: process.env.PATH ?? "", ...env },
  });
  const wall = Number(process.hrtime.bigint() - started) / 1e9;
  if (result.status !== 0) throw new Error(`${args.join(" ")} failed: ${result.stderr}`);
  const [user, system] = result.stderr.trim().split("\n").at(-1)!.split(" ").map(Number);
  return { wall, cpu: user! + system! };
}

function summary(samples: Sample[]): { median: number; min: number; max: number; cpu: number } {
  const walls = samples.map((s) => s.wall).sort((a, b) => a - b);
  const cpus = samples.map((s) => s.cpu).sort((a, b) => a - b);
  return { median: walls[Math.floor(walls.length / 2)]!, min: walls[0]!, max: walls.at(-1)!, cpu: cpus[Math.floor(cpus.length / 2)]! };
}

async function main(): Promise<void> {
  if (!existsSync(join(ROOT, "dist", "cli", "main.js"))) throw new Error("dist/ is missing: run npm run build first");
  if (!existsSync("/usr/bin/time")) throw new Error("/usr/bin/time (GNU time) is needed for the children's CPU time");
  const dir = mkdtempSync(join(tmpdir(), "tds-cli-bench-"));
  const databaseUrl = `sqlite:${join(dir, "tds.sqlite")}`;
  const store = await openStore(databaseUrl);
  for (let i = 0; i < 5; i++) await store.createOrganization({ id: `org_bench${i}`, name: `bench-${i}`, nowMs: Date.now() });
  await store.close();
  const env = { TDS_DATABASE_URL: databaseUrl };
  const commands = {
    "node bin/tds.mjs org list (compiled)": ["bin/tds.mjs", "org", "list"],
    "node --import tsx src/cli/main.ts org list (sources)": ["--import", "tsx", "src/cli/main.ts", "org", "list"],
  };
  const results: Record<string, ReturnType<typeof summary>> = {};
  for (const [label, args] of Object.entries(commands)) {
    measure(args, env); // warm the file cache
    const samples: Sample[] = [];
    for (let i = 0; i < RUNS; i++) samples.push(measure(args, env));
    results[label] = summary(samples);
  }
  rmSync(dir, { recursive: true, force: true });
  console.log(`tds org list, ${RUNS} runs each (seconds)`);
  console.log("| command | wall median | wall min | wall max | CPU median |");
  console.log("| --- | --- | --- | --- | --- |");
  for (const [label, r] of Object.entries(results))
    console.log(`| ${label} | ${r.median.toFixed(3)} | ${r.min.toFixed(3)} | ${r.max.toFixed(3)} | ${r.cpu.toFixed(3)} |`);
  const [compiled, sources] = Object.values(results) as [ReturnType<typeof summary>, ReturnType<typeof summary>];
  console.log(
    `compiled ÷ sources (wall median): ${(compiled.median / sources.median).toFixed(2)}; target ≤ ${TARGET_SECONDS} s: ${compiled.median <= TARGET_SECONDS ? "met" : "MISSED"}`,
  );
}

await main();
