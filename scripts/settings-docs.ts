/** Writes .env.example and the README's settings table from the settings table (src/settings/settings-table.ts). */
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { renderEnvExample, withReadmeTable } from "../src/settings/settings-docs.ts";

const root = fileURLToPath(new URL("..", import.meta.url));
const envExample = `${root}.env.example`;
const readme = `${root}README.md`;

writeFileSync(envExample, renderEnvExample());
writeFileSync(readme, withReadmeTable(readFileSync(readme, "utf8")));
console.log("wrote .env.example and the settings table of README.md");
