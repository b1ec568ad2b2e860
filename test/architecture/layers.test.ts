/**
 * The layers of src/ point one way: a module may import its own layer or a lower one, never a higher one, and no
 * adapter imports a sibling adapter of the same port. The table (layers.ts) is the architecture (docs/architecture.md).
 */
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { type ImportEdge, importGraph, layerOf, siblingAdapterImports, upwardImports } from "../support/import-graph.ts";
import { LAYERS, SIBLING_ADAPTERS } from "./layers.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));

const show = (edges: ImportEdge[]) => edges.map((e) => `${e.from}:${e.line} → ${e.to} (${e.form})`).join("\n");

/** Runs `check` on a tree of source files written to a temporary directory. */
function withTree(files: Record<string, string>, check: (dir: string) => void): void {
  const dir = mkdtempSync(join(tmpdir(), "tds-layers-"));
  try {
    for (const [path, text] of Object.entries(files)) {
      mkdirSync(join(dir, path, ".."), { recursive: true });
      writeFileSync(join(dir, path), text);
    }
    check(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

describe("layers", () => {
  test("no module imports a higher layer", () => {
    const upward = upwardImports(LAYERS, importGraph(ROOT));
    assert.equal(upward.length, 0, `upward imports:\n${show(upward)}`);
  });

  test("no adapter imports a sibling adapter of its port", () => {
    const siblings = siblingAdapterImports(SIBLING_ADAPTERS, importGraph(ROOT));
    assert.equal(siblings.length, 0, `imports between sibling adapters:\n${show(siblings)}`);
  });

  test("every source file belongs to a layer", () => {
    for (const edge of importGraph(ROOT)) {
      layerOf(LAYERS, edge.from);
      layerOf(LAYERS, edge.to);
    }
  });

  test("the check fails on a deliberate upward import and on a sibling adapter import", () => {
    const tree = {
      "src/domain/money.ts": 'import { ServiceError } from "../gateway/pipeline.ts";\nexport const x = 1;\n',
      "src/gateway/pipeline.ts": 'import type { Store } from "../store/store.ts";\nexport class ServiceError extends Error {}\n',
      "src/store/store.ts": "export interface Store {}\n",
      "src/store/sqlite/sqlite-store.ts": 'import { p } from "../postgres/postgres-store.ts";\n',
      "src/store/postgres/postgres-store.ts": "export const p = 1;\n",
    };
    withTree(tree, (dir) => {
      const edges = importGraph(dir);
      assert.deepEqual(
        upwardImports(LAYERS, edges).map((e) => `${e.from} → ${e.to}`),
        ["src/domain/money.ts → src/gateway/pipeline.ts"],
      );
      assert.deepEqual(
        siblingAdapterImports(SIBLING_ADAPTERS, edges).map((e) => `${e.from} → ${e.to}`),
        ["src/store/sqlite/sqlite-store.ts → src/store/postgres/postgres-store.ts"],
      );
    });
  });

  test("the check sees every import form, and no import in a comment or a string", () => {
    // Each file of the domain reaches up to the gateway in one form.
    const forms: Record<string, string> = {
      import: 'import { x } from "../gateway/g.ts";\n',
      "import type": 'import type { T } from "../gateway/g.ts";\n',
      "side effect": 'import "../gateway/g.ts";\n',
      "export from": 'export { x } from "../gateway/g.ts";\n',
      "export star": 'export * from "../gateway/g.ts";\n',
      "export type from": 'export type { T } from "../gateway/g.ts";\n',
      "multi-line": 'import {\n  x,\n  y,\n} from\n  "../gateway/g.ts";\n',
      "dynamic import": 'export const load = () => import("../gateway/g.ts");\n',
      "import type()": 'export type T = import("../gateway/g.ts").T;\n',
      "import = require": 'import g = require("../gateway/g.ts");\nexport const y = g;\n',
      require: 'export const g = require("../gateway/g.ts");\n',
    };
    const tree: Record<string, string> = {
      "src/gateway/g.ts": "export const x = 1, y = 2;\nexport type T = number;\n",
      // Not imports: a comment and strings that spell one.
      "src/domain/quiet.ts":
        '// import { x } from "../gateway/g.ts";\nexport const text = \'import "../gateway/g.ts"\';\nexport const t = `export * from "../gateway/g.ts"`;\n',
    };
    for (const [form, text] of Object.entries(forms)) tree[`src/domain/${form.replaceAll(" ", "-")}.ts`] = text;
    withTree(tree, (dir) => {
      const upward = upwardImports(LAYERS, importGraph(dir));
      assert.deepEqual(
        upward.map((e) => e.from).sort(),
        Object.keys(forms)
          .map((form) => `src/domain/${form.replaceAll(" ", "-")}.ts`)
          .sort(),
        show(upward),
      );
      const multiLine = upward.find((e) => e.from === "src/domain/multi-line.ts");
      assert.deepEqual([multiLine?.line, multiLine?.form, multiLine?.to], [1, "import", "src/gateway/g.ts"]);
    });
  });
});
