#!/usr/bin/env node
// Launcher for `npx tds …`: the compiled CLI (`npm run build` makes dist/; `npm install` runs it).
try {
  await import("../dist/cli/main.js");
} catch (err) {
  if (err?.code === "ERR_MODULE_NOT_FOUND" && String(err.message).includes("dist/cli/main.js")) {
    process.stderr.write("tds: the compiled CLI is missing (dist/). Run `npm run build` in the gateway's folder.\n");
    process.exit(1);
  }
  throw err;
}
