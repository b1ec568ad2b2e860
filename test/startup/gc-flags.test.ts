/**
 * V8's allocation-site pretenuring is turned off in the server's process unless node's command line says otherwise,
 * before any other module of the server is evaluated, and the flag is one this Node.js knows (V8 only prints an
 * unknown flag to stderr). Its effect on the latency tail is measured by bench/paced-tail.ts, not here.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import ts from "typescript";
import { applyPretenuringFlag, PRETENURING_APPLIED, PRETENURING_OFF, pretenuringFlag } from "../../src/startup/gc-flags.ts";

test("pretenuring is turned off when node's command line does not mention it", () => {
  assert.equal(PRETENURING_OFF, "--no-allocation-site-pretenuring");
  assert.equal(pretenuringFlag([]), PRETENURING_OFF);
  assert.equal(pretenuringFlag(["--import", "tsx", "--max-old-space-size=512", "--trace-gc"]), PRETENURING_OFF);
  // Flags that merely contain the name are not it.
  assert.equal(pretenuringFlag(["--allocation-site-pretenuring-extra", "--trace-allocation-site-pretenuring"]), PRETENURING_OFF);
});

test("a choice on node's command line, either way and in any spelling V8 reads, is left as given", () => {
  for (const arg of [
    "--allocation-site-pretenuring",
    "-allocation-site-pretenuring",
    "--allocation_site_pretenuring",
    "--no-allocation-site-pretenuring",
    "-no-allocation-site-pretenuring",
    "--noallocation-site-pretenuring",
    "--no_allocation_site_pretenuring",
  ]) {
    assert.equal(pretenuringFlag(["--import", "tsx", arg]), null, arg);
  }
});

test("the flag is set, once, unless the command line chose", () => {
  const set: string[] = [];
  assert.equal(
    applyPretenuringFlag(["--import", "tsx"], (f) => set.push(f)),
    PRETENURING_OFF,
  );
  assert.deepEqual(set, [PRETENURING_OFF]);
  assert.equal(
    applyPretenuringFlag(["--allocation-site-pretenuring"], (f) => set.push(f)),
    null,
  );
  assert.deepEqual(set, [PRETENURING_OFF]);
});

test("evaluating the module set the flag in this process, whose command line does not name it", () => {
  assert.equal(pretenuringFlag(process.execArgv), PRETENURING_OFF, "the test's own node command line names the flag");
  assert.equal(PRETENURING_APPLIED, PRETENURING_OFF);
});

test("this Node.js knows the flag", () => {
  const options = execFileSync(process.execPath, ["--v8-options"], { encoding: "utf8", maxBuffer: 16 * 1024 * 1024 });
  assert.match(options, /^\s*--allocation-site-pretenuring\b/m);
});

test("the server's entry evaluates the flags module before any other", () => {
  const path = new URL("../../src/server.ts", import.meta.url);
  const source = ts.createSourceFile(path.pathname, readFileSync(path, "utf8"), ts.ScriptTarget.Latest);
  // Statements that load a module at run time: imports and re-exports, not type-only ones.
  const loads = source.statements.flatMap((s) => {
    if (ts.isImportDeclaration(s) && !s.importClause?.isTypeOnly) return [s.moduleSpecifier];
    if (ts.isExportDeclaration(s) && !s.isTypeOnly && s.moduleSpecifier) return [s.moduleSpecifier];
    return [];
  });
  const first = loads[0];
  assert.ok(first && ts.isStringLiteral(first), "src/server.ts loads no module");
  assert.equal(first.text, "./startup/gc-flags.ts", `the first module src/server.ts loads is ${first.text}`);
});
