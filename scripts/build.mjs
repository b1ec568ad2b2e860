#!/usr/bin/env node
// Compiles src/ to dist/ (TypeScript) and copies the SQL migrations beside the compiled store.
// Also the `prepare` step of `npm install`/`npm ci`: a production install (`--omit=dev`, without src/)
// skips it and uses the dist/ it was given.
// `--no-check` emits without type checking (npm test type-checks the whole project first).
import { spawnSync } from "node:child_process";
import { cpSync, existsSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const require = createRequire(join(root, "package.json"));

// A production copy holds dist/ but not src/; TypeScript may still be there (node-llama-cpp's optional peer).
let tsc = null;
try {
  tsc = require.resolve("typescript/bin/tsc");
} catch {}
if (tsc === null || !existsSync(join(root, "src")) || !existsSync(join(root, "tsconfig.build.json"))) {
  console.log("build: no TypeScript sources or compiler here (a production install); using dist/ as it is.");
  process.exit(0);
}

const args = [tsc, "-p", join(root, "tsconfig.build.json")];
if (process.argv.includes("--no-check")) args.push("--noCheck");
rmSync(join(root, "dist"), { recursive: true, force: true });
const result = spawnSync(process.execPath, args, { stdio: "inherit" });
if (result.status !== 0) process.exit(result.status ?? 1);
const migrations = join(root, "src", "store", "migrations");
if (existsSync(migrations)) cpSync(migrations, join(root, "dist", "store", "migrations"), { recursive: true });
