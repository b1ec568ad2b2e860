import { readFileSync } from "node:fs";

/** The package's name, version and licence, read once from package.json (one level above src/ and dist/ alike). */
const pkg = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")) as {
  name: string;
  version: string;
  license: string;
};

export const SERVICE_NAME: string = pkg.name;
export const SERVICE_VERSION: string = pkg.version;
/** An SPDX licence identifier. */
export const SERVICE_LICENSE: string = pkg.license;
