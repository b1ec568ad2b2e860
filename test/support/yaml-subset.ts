/**
 * A parser for the block-style YAML subset compose.yaml is written in (no YAML library is a dependency): mappings,
 * `- ` sequences, plain and quoted scalars (all kept as strings; an empty value is null), JSON-compatible flow
 * sequences, comments, anchors (`&name`), aliases (`*name`) and merge keys (`<<: *name`). Anything else (block
 * scalars `|` `>`, flow mappings, tabs, documents) throws, so a file that leaves the subset fails loudly instead of
 * being misread.
 */
export type YamlValue = null | string | YamlValue[] | { [key: string]: YamlValue };

interface Line {
  indent: number;
  text: string;
  number: number;
}

function withoutComment(text: string): string {
  let quote: string | null = null;
  for (let i = 0; i < text.length; i++) {
    const c = text[i]!;
    if (quote !== null) {
      if (c === quote) quote = null;
    } else if (c === '"' || c === "'") quote = c;
    else if (c === "#" && (i === 0 || /\s/.test(text[i - 1]!))) return text.slice(0, i);
  }
  return text;
}

function linesOf(source: string): Line[] {
  return source.split("\n").flatMap((raw, i) => {
    if (raw.includes("\t")) throw new Error(`line ${i + 1}: tabs are outside the subset`);
    const text = withoutComment(raw).trimEnd();
    if (text.trim() === "") return [];
    if (/^(---|\.\.\.)/.test(text)) throw new Error(`line ${i + 1}: documents are outside the subset`);
    return [{ indent: text.length - text.trimStart().length, text: text.trim(), number: i + 1 }];
  });
}

export function parseYamlSubset(source: string): YamlValue {
  const anchors = new Map<string, YamlValue>();

  function scalar(text: string, line: Line): YamlValue {
    if (text.startsWith("*")) {
      const value = anchors.get(text.slice(1));
      if (value === undefined) throw new Error(`line ${line.number}: unknown alias ${text}`);
      return value;
    }
    if (text.startsWith('"') || text.startsWith("[")) return JSON.parse(text) as YamlValue;
    if (text.startsWith("'")) {
      if (!text.endsWith("'") || text.length < 2) throw new Error(`line ${line.number}: unterminated quote`);
      return text.slice(1, -1).replaceAll("''", "'");
    }
    if (/^[|>{&!%@`]/.test(text)) throw new Error(`line ${line.number}: ${JSON.stringify(text)} is outside the subset`);
    return text;
  }

  /** The value after `key:` or `- `: inline, or the block of the deeper lines that follow. */
  function entryValue(rest: string, line: Line, lines: Line[], at: number, indent: number): [YamlValue, number] {
    const anchored = /^&(\S+)\s*(.*)$/.exec(rest);
    const anchor = anchored ? anchored[1]! : null;
    const text = anchored ? anchored[2]! : rest;
    let end = at + 1;
    while (end < lines.length && lines[end]!.indent > indent) end++;
    let value: YamlValue;
    if (text === "") {
      value = end === at + 1 ? null : block(lines.slice(at + 1, end));
    } else {
      if (end !== at + 1) throw new Error(`line ${lines[at + 1]!.number}: a value continued on the next line is outside the subset`);
      value = scalar(text, line);
    }
    if (anchor !== null) anchors.set(anchor, value);
    return [value, end];
  }

  function block(lines: Line[]): YamlValue {
    const indent = lines[0]!.indent;
    for (const l of lines) if (l.indent < indent) throw new Error(`line ${l.number}: bad indentation`);
    if (lines[0]!.text.startsWith("- ") || lines[0]!.text === "-") {
      const items: YamlValue[] = [];
      for (let i = 0; i < lines.length; ) {
        const line = lines[i]!;
        if (line.indent !== indent || !line.text.startsWith("- ")) throw new Error(`line ${line.number}: expected "- "`);
        const content = line.text.slice(2).trim();
        let end = i + 1;
        while (end < lines.length && lines[end]!.indent > indent) end++;
        // `- key: value` followed by more keys: a mapping whose first key sits after the dash.
        if (/^[^"'[\s][^:]*:(\s|$)/.test(content)) {
          items.push(block([{ indent: indent + 2, text: content, number: line.number }, ...lines.slice(i + 1, end)]));
        } else {
          if (end !== i + 1) throw new Error(`line ${line.number}: a scalar item continued on the next line`);
          items.push(scalar(content, line));
        }
        i = end;
      }
      return items;
    }
    const map: { [key: string]: YamlValue } = {};
    const explicit = new Set<string>();
    for (let i = 0; i < lines.length; ) {
      const line = lines[i]!;
      if (line.indent !== indent) throw new Error(`line ${line.number}: bad indentation`);
      const match = /^("[^"]*"|'[^']*'|[^\s"'][^:]*?):(?:\s+(.*))?$/.exec(line.text);
      if (!match) throw new Error(`line ${line.number}: expected "key: value"`);
      const key = match[1]!.replace(/^["']|["']$/g, "");
      const [value, end] = entryValue(match[2]?.trim() ?? "", line, lines, i, indent);
      if (key === "<<") {
        if (value === null || typeof value !== "object" || Array.isArray(value))
          throw new Error(`line ${line.number}: merge of a non-mapping`);
        for (const [k, v] of Object.entries(value)) if (!explicit.has(k)) map[k] = v;
      } else {
        if (explicit.has(key)) throw new Error(`line ${line.number}: duplicate key ${key}`);
        explicit.add(key);
        map[key] = value;
      }
      i = end;
    }
    return map;
  }

  const lines = linesOf(source);
  if (lines.length === 0) return {};
  return block(lines);
}
