/**
 * .env.example lists exactly the environment variables src/ reads: a setting added to src/ without a line
 * there (or a line left behind for a setting src/ no longer reads) fails here. Every line is commented out,
 * documents its default, and uncommenting all of them as they are changes nothing.
 */
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join, relative } from "node:path";
import { describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { loadConfig } from "../src/config.ts";
import { SECRET_FILE_SETTINGS } from "../src/config-secret-files.ts";

const root = fileURLToPath(new URL("..", import.meta.url));
const ENV_EXAMPLE = join(root, ".env.example");

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return sourceFiles(path);
    return entry.isFile() && entry.name.endsWith(".ts") ? [path] : [];
  });
}

/**
 * Every variable src/ names or reads, with the files it appears in:
 * - any TDS_… name (in code, messages or comments: each is a setting users may be told about);
 * - any upper-case name read from an environment object: `env.NAME` / `process.env.NAME`, `env["NAME"]`,
 *   and the config helpers that take the name as a string literal (`envText(env, "TDS_CONFIG")`);
 * - the settings table's variables (`env: "HOST"`) and the `_FILE` variants of its secret settings.
 */
function variablesReadBySrc(): Map<string, Set<string>> {
  const found = new Map<string, Set<string>>();
  const patterns = [
    /\b(TDS_[A-Z0-9_]*[A-Z0-9])\b/g,
    /\benv\.([A-Z][A-Z0-9_]*)\b/g,
    /\benv\[\s*["'`]([A-Z][A-Z0-9_]*)["'`]\s*\]/g,
    /\benv[A-Z][A-Za-z]*\(\s*[A-Za-z_$][\w$.]*\s*,\s*["'`]([A-Z][A-Z0-9_]*)["'`]/g,
    /\benv:\s*["'`]([A-Z][A-Z0-9_]*)["'`]/g,
  ];
  for (const file of sourceFiles(join(root, "src"))) {
    const text = readFileSync(file, "utf8");
    for (const pattern of patterns) {
      for (const match of text.matchAll(pattern)) {
        const name = match[1]!;
        if (!found.has(name)) found.set(name, new Set());
        found.get(name)!.add(relative(root, file));
      }
    }
  }
  for (const { file } of SECRET_FILE_SETTINGS) found.set(file, new Set(["src/config-secret-files.ts"]));
  return found;
}

interface ExampleEntry {
  name: string;
  value: string;
  line: number;
  commented: boolean;
  /** The comment lines right above it. */
  description: string[];
}

function exampleEntries(): ExampleEntry[] {
  const lines = readFileSync(ENV_EXAMPLE, "utf8").split("\n");
  const entries: ExampleEntry[] = [];
  lines.forEach((text, index) => {
    const match = /^(#\s*)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$/.exec(text.trim());
    if (!match) return;
    const description: string[] = [];
    for (let i = index - 1; i >= 0 && /^#/.test(lines[i]!.trim()) && !/^#\s*[A-Za-z_][A-Za-z0-9_]*=/.test(lines[i]!.trim()); i--) {
      description.unshift(lines[i]!.trim().replace(/^#\s?/, ""));
    }
    entries.push({ name: match[2]!, value: match[3]!, line: index + 1, commented: match[1] !== undefined, description });
  });
  return entries;
}

describe(".env.example", () => {
  const read = variablesReadBySrc();
  const entries = exampleEntries();
  const listed = new Set(entries.map((e) => e.name));

  test("the scan of src/ finds the settings read through helpers and plain names", () => {
    // Guards the scanner itself: these are read as string literals passed to helpers, or without the TDS_ prefix.
    for (const name of ["HOST", "PORT", "LOG_LEVEL", "TDS_DATABASE_URL", "TDS_MODEL_ALIASES", "TDS_URL", "TDS_LOG_FORMAT"]) {
      assert.ok(read.has(name), `${name} was not found in src/: the scan in this test is broken`);
    }
  });

  test("lists every environment variable src/ reads", () => {
    const missing = [...read.keys()].filter((name) => !listed.has(name)).sort();
    assert.deepEqual(
      missing,
      [],
      `read in src/ but missing from .env.example (add each with its default and meaning):\n` +
        missing.map((name) => `  ${name}  (${[...read.get(name)!].join(", ")})`).join("\n"),
    );
  });

  test("lists nothing that src/ does not read", () => {
    const stale = [...listed].filter((name) => !read.has(name)).sort();
    assert.deepEqual(stale, [], `listed in .env.example but never read in src/ (remove, or read it): ${stale.join(", ")}`);
  });

  test("lists each variable once, commented out, with its default and meaning", () => {
    const seen = new Set<string>();
    for (const entry of entries) {
      const where = `.env.example line ${entry.line} (${entry.name})`;
      assert.ok(!seen.has(entry.name), `${where}: listed twice`);
      seen.add(entry.name);
      assert.ok(entry.commented, `${where}: nothing needs to be set, so every line is commented out`);
      assert.ok(
        entry.description.some((l) => /^Default: \S/.test(l)),
        `${where}: the comment above it has no "Default: …" line`,
      );
      assert.ok(
        entry.description.some((l) => !/^Default:/.test(l) && l.trim() !== "" && !/^---/.test(l)),
        `${where}: the comment above it does not say what it is`,
      );
    }
  });

  test("uncommenting every server setting as shown changes nothing", () => {
    const env = Object.fromEntries(entries.map((e) => [e.name, e.value]));
    assert.deepEqual(loadConfig(env), loadConfig({}));
  });
});
