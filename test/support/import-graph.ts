import { readdirSync, readFileSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";

/** One relative import of a source file, as a path from the repository root. */
export interface ImportEdge {
  from: string;
  to: string;
  /** `import type` (erased at run time) still counts: a type from a higher layer is a dependency on it. */
  line: number;
}

const IMPORT = /(?:^|\s)(?:import|export)\s[^;]*?from\s+["'](\.{1,2}\/[^"']+)["']|import\(\s*["'](\.{1,2}\/[^"']+)["']\s*\)/g;

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const path = join(dir, e.name);
    return e.isDirectory() ? sourceFiles(path) : e.name.endsWith(".ts") ? [path] : [];
  });
}

/** Every relative import between the TypeScript files under `root/src` (paths relative to `root`). */
export function importGraph(root: string): ImportEdge[] {
  const edges: ImportEdge[] = [];
  for (const file of sourceFiles(join(root, "src"))) {
    const text = readFileSync(file, "utf8");
    for (const match of text.matchAll(IMPORT)) {
      const target = match[1] ?? match[2]!;
      const line = text.slice(0, match.index).split("\n").length;
      edges.push({ from: relative(root, file), to: relative(root, resolve(dirname(file), target)), line });
    }
  }
  return edges;
}

/** A layer: the paths (prefixes relative to the repository root) it holds. Lower layers come first. */
export interface Layer {
  name: string;
  paths: string[];
}

export function layerOf(layers: Layer[], path: string): number {
  const index = layers.findIndex((l) => l.paths.some((p) => path === p || path.startsWith(p.endsWith("/") ? p : `${p}/`)));
  if (index < 0) throw new Error(`${path} is in no layer: add it to the layer table`);
  return index;
}

/** Imports from a lower layer to a higher one. */
export function upwardImports(layers: Layer[], edges: ImportEdge[]): ImportEdge[] {
  return edges.filter((e) => layerOf(layers, e.from) < layerOf(layers, e.to));
}

/** Imports between two sibling adapters of one port: each group lists the adapters' path prefixes. */
export function siblingAdapterImports(groups: string[][], edges: ImportEdge[]): ImportEdge[] {
  return edges.filter((e) =>
    groups.some((prefixes) => {
      const a = prefixes.find((p) => e.from.startsWith(p));
      const b = prefixes.find((p) => e.to.startsWith(p));
      return a !== undefined && b !== undefined && a !== b;
    }),
  );
}
