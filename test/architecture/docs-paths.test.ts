/** docs/architecture.md is self-contained and true: every repository path it names exists, and none leads outside. */
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { LAYERS } from "./layers.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const DOC = readFileSync(join(ROOT, "docs", "architecture.md"), "utf8");
const PATH = /`((?:src|test|docs|web|bench|scripts|bin)\/[^`\s]*)`/g;

test("every path docs/architecture.md names exists", () => {
  const named = [...DOC.matchAll(PATH)].map((m) => m[1]!);
  assert.ok(named.length >= 30, `only ${named.length} paths found: the pattern no longer matches the page`);
  const missing = named.filter((path) => !existsSync(join(ROOT, path)));
  assert.deepEqual(missing, [], "paths named in docs/architecture.md that do not exist");
});

test("docs/architecture.md refers to nothing outside the repository", () => {
  assert.doesNotMatch(DOC, /\.\.\//, "a path leading out of the repository");
});

test("the layer table names every layer the import check knows, in order", () => {
  const rows = DOC.split("\n").filter((line) => /^\| \d \|/.test(line));
  assert.equal(rows.length, LAYERS.length);
  for (const [i, layer] of LAYERS.entries()) {
    for (const path of layer.paths) assert.ok(rows[i]!.includes(`\`${path}`), `layer ${i} row names ${path}`);
  }
});
