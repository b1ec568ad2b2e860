#!/usr/bin/env node
// Launcher for `npx tds …` from the project folder: the CLI is TypeScript, run through tsx.
import { register } from "tsx/esm/api";

register();
await import("../src/cli/main.ts");
