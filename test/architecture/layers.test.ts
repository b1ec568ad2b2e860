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
import { importGraph, layerOf, siblingAdapterImports, upwardImports } from "../support/import-graph.ts";
import { LAYERS, SIBLING_ADAPTERS } from "./layers.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));

const show = (edges: { from: string; to: string; line: number }[]) => edges.map((e) => `${e.from}:${e.line} → ${e.to}`).join("\n");

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
    const dir = mkdtempSync(join(tmpdir(), "tds-layers-"));
    try {
      const write = (path: string, text: string) => {
        mkdirSync(join(dir, path, ".."), { recursive: true });
        writeFileSync(join(dir, path), text);
      };
      write("src/domain/money.ts", 'import { ServiceError } from "../gateway/pipeline.ts";\nexport const x = 1;\n');
      write("src/gateway/pipeline.ts", 'import type { Store } from "../store/store.ts";\nexport class ServiceError extends Error {}\n');
      write("src/store/store.ts", "export interface Store {}\n");
      write("src/store/sqlite/sqlite-store.ts", 'import { p } from "../postgres/postgres-store.ts";\n');
      write("src/store/postgres/postgres-store.ts", "export const p = 1;\n");
      const edges = importGraph(dir);
      assert.deepEqual(
        upwardImports(LAYERS, edges).map((e) => `${e.from} → ${e.to}`),
        ["src/domain/money.ts → src/gateway/pipeline.ts"],
      );
      assert.deepEqual(
        siblingAdapterImports(SIBLING_ADAPTERS, edges).map((e) => `${e.from} → ${e.to}`),
        ["src/store/sqlite/sqlite-store.ts → src/store/postgres/postgres-store.ts"],
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
