import { SECTIONS, type Setting } from "./setting.ts";
import { SETTINGS } from "./settings-table.ts";

/** .env.example and the README's settings table, as the settings table makes them (`npm run settings:docs` writes both). */

const ROWS = Object.values(SETTINGS) as Setting[];
const WIDTH = 100;

const ENV_EXAMPLE_HEADER = `# Typed Decision Service: every setting it reads from the environment, with its default.
#
# Nothing here has to be set: every line is commented out and shows the default (or is empty when
# there is none), so uncommenting a line as it is changes nothing (NO_COLOR aside: set to a
# non-empty value it turns colours off). Set only what you need.
#
#   cp .env.example .env && $EDITOR .env
#   node --env-file=.env dist/server.js          # Node.js >= 20.6 reads the file itself
#   (systemd: EnvironmentFile=/etc/tds/tds.env; Docker: docker run --env-file .env …)
#
# Environment variables win over the JSON file named by TDS_CONFIG. Every value is validated at
# start: a bad one stops the server (exit code 2) with a message naming the setting.
# Written by \`npm run settings:docs\` from src/settings/settings-table.ts; edit the table, not this file.
`;

export const README_TABLE_START = "<!-- settings table: written by `npm run settings:docs` from src/settings/settings-table.ts -->";
export const README_TABLE_END = "<!-- end of the settings table -->";

/** Comment lines of at most WIDTH characters. */
function comment(text: string): string[] {
  const lines: string[] = [];
  let line = "#";
  for (const word of text.split(/\s+/).filter(Boolean)) {
    if (line.length + 1 + word.length > WIDTH && line !== "#") {
      lines.push(line);
      line = "#";
    }
    line += ` ${word}`;
  }
  if (line !== "#") lines.push(line);
  return lines;
}

const plain = (markdown: string) => markdown.replace(/`/g, "");

/** The default as the docs say it, in markdown. */
function defaultDoc(row: Setting): string {
  return row.defaultText ?? `\`${String(row.default)}\``;
}

/** What `NAME=` shows: the default itself, or nothing when there is none (uncommented, it changes nothing). */
function exampleValue(row: Setting): string {
  if (row.example !== undefined) return row.example;
  return row.defaultText === undefined ? String(row.default) : "";
}

function envEntry(name: string, details: string, defaultText: string, value: string): string[] {
  return [...comment(details), `# Default: ${defaultText}`, `# ${name}=${value}`];
}

function secretFileEntry(name: string, note: string | undefined): string[] {
  const secretPath = `/run/secrets/${name.toLowerCase()}`;
  const details =
    `Or a file holding ${name} (such as ${secretPath}): its content without the trailing newline. ` +
    `Not together with ${name}; a file that cannot be read or is empty stops the start.${note ? ` ${note}` : ""}`;
  return envEntry(`${name}_FILE`, details, "none", "");
}

function sectionLine(title: string): string {
  const start = `# --- ${title} `;
  return start + "-".repeat(Math.max(3, WIDTH - 2 - start.length));
}

/** .env.example: every environment variable of the table, by section, commented out at its default. */
export function renderEnvExample(): string {
  const blocks: string[][] = [];
  let section: string | null = null;
  for (const row of ROWS) {
    if (row.env === null) continue;
    if (row.section !== section) {
      section = row.section;
      blocks.push([sectionLine(SECTIONS[row.section])]);
    }
    blocks.push(envEntry(row.env, row.details, plain(defaultDoc(row)), exampleValue(row)));
    if (row.secretFile) blocks.push(secretFileEntry(row.env, row.secretFile.note));
  }
  return `${ENV_EXAMPLE_HEADER}\n${blocks.map((b) => b.join("\n")).join("\n\n")}\n`;
}

const code = (text: string) => `\`${text}\``;

/** The README's settings table: every setting, with its variable, config-file key, default and meaning. */
export function renderReadmeTable(): string {
  const rows = ROWS.map((row) => {
    const file = row.fileDocs ?? (row.file === null ? "—" : code(row.file));
    return `| ${row.env === null ? "—" : code(row.env)} | ${file} | ${defaultDoc(row)} | ${row.summary} |`;
  });
  return ["| Variable | File key | Default | Meaning |", "| --- | --- | --- | --- |", ...rows].join("\n");
}

/** The README with its settings table (between the two markers) made from the settings table. */
export function withReadmeTable(readme: string): string {
  const start = readme.indexOf(README_TABLE_START);
  const end = readme.indexOf(README_TABLE_END);
  if (start < 0 || end < start) throw new Error(`README.md has no "${README_TABLE_START}" … "${README_TABLE_END}" section`);
  return `${readme.slice(0, start + README_TABLE_START.length)}\n${renderReadmeTable()}\n${readme.slice(end)}`;
}
