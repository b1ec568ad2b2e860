import { readdirSync, readFileSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import ts from "typescript";

/** One relative import of a source file, as a path from the repository root. */
export interface ImportEdge {
  from: string;
  to: string;
  line: number;
  /** How the file imports it: `import type` (erased at run time) still counts, a type from a higher layer is a dependency on it. */
  form: ImportForm;
}

export type ImportForm = "import" | "import type" | "side effect" | "export from" | "dynamic import" | "import type()" | "require";

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const path = join(dir, e.name);
    return e.isDirectory() ? sourceFiles(path) : e.name.endsWith(".ts") ? [path] : [];
  });
}

/**
 * Every module a file names, in whatever form: `import … from`, `import type`, `import "x"` (for its side effects),
 * `export … from`, `import("x")`, the type `import("x").T`, `import x = require("x")` and `require("x")`. Read from
 * the syntax tree, so that a form spread over lines counts and a comment or a string that only looks like one does not.
 */
export function moduleReferences(fileName: string, text: string): Array<{ specifier: string; line: number; form: ImportForm }> {
  const source = ts.createSourceFile(fileName, text, ts.ScriptTarget.Latest, true, ts.ScriptKind.TS);
  const found: Array<{ specifier: string; line: number; form: ImportForm }> = [];
  const add = (node: ts.Node, specifier: ts.Node | undefined, form: ImportForm) => {
    if (specifier === undefined || !ts.isStringLiteralLike(specifier)) return;
    found.push({ specifier: specifier.text, line: source.getLineAndCharacterOfPosition(node.getStart(source)).line + 1, form });
  };
  const visit = (node: ts.Node): void => {
    if (ts.isImportDeclaration(node)) {
      const clause = node.importClause;
      add(node, node.moduleSpecifier, clause === undefined ? "side effect" : clause.isTypeOnly ? "import type" : "import");
    } else if (ts.isExportDeclaration(node)) {
      add(node, node.moduleSpecifier, "export from");
    } else if (ts.isImportEqualsDeclaration(node) && ts.isExternalModuleReference(node.moduleReference)) {
      add(node, node.moduleReference.expression, "require");
    } else if (ts.isImportTypeNode(node) && ts.isLiteralTypeNode(node.argument)) {
      add(node, node.argument.literal, "import type()");
    } else if (ts.isCallExpression(node)) {
      if (node.expression.kind === ts.SyntaxKind.ImportKeyword) add(node, node.arguments[0], "dynamic import");
      else if (ts.isIdentifier(node.expression) && node.expression.text === "require") add(node, node.arguments[0], "require");
    }
    ts.forEachChild(node, visit);
  };
  visit(source);
  return found;
}

/** Every relative import between the TypeScript files under `root/src` (paths relative to `root`). */
export function importGraph(root: string): ImportEdge[] {
  const edges: ImportEdge[] = [];
  for (const file of sourceFiles(join(root, "src"))) {
    for (const { specifier, line, form } of moduleReferences(file, readFileSync(file, "utf8"))) {
      if (!specifier.startsWith("./") && !specifier.startsWith("../")) continue;
      edges.push({ from: relative(root, file), to: relative(root, resolve(dirname(file), specifier)), line, form });
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
