import { readFileSync, statSync } from "node:fs";
import type { Setting } from "./settings/setting.ts";
import { SETTINGS } from "./settings/settings-table.ts";

type Env = Record<string, string | undefined>;

/**
 * The environment settings that hold a secret (the settings table's `secretFile` rows), each with its `_FILE` variant:
 * the path of a file whose content is the value (Docker and Compose secrets, Kubernetes secret volumes, systemd
 * credentials).
 */
export const SECRET_FILE_SETTINGS: ReadonlyArray<{ setting: string; file: string }> = (Object.values(SETTINGS) as Setting[]).flatMap((s) =>
  s.secretFile && s.env !== null ? [{ setting: s.env, file: `${s.env}_FILE` }] : [],
);

/** A token or a URL is far smaller; a larger file is not a secret file (and /dev/zero is never read). */
export const MAX_SECRET_FILE_BYTES = 64 * 1024;

const REASONS: Record<string, string> = {
  ENOENT: "no such file",
  ENOTDIR: "no such file",
  EACCES: "permission denied",
  EPERM: "permission denied",
  ELOOP: "too many symbolic links",
};

function isSet(value: string | undefined): value is string {
  return value !== undefined && value.trim() !== "";
}

/** The file's content without its trailing line breaks, or why it cannot be used (never its content). */
function readSecret(path: string): { value: string } | { problem: string } {
  try {
    const stats = statSync(path);
    if (!stats.isFile()) return { problem: "is not a regular file" };
    if (stats.size > MAX_SECRET_FILE_BYTES) return { problem: `is larger than ${MAX_SECRET_FILE_BYTES} bytes` };
    const value = readFileSync(path, "utf8").replace(/[\r\n]+$/, "");
    return value.trim() === "" ? { problem: "is empty" } : { value };
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code ?? "unknown error";
    return { problem: `cannot be read (${REASONS[code] ?? code})` };
  }
}

/**
 * The environment with each secret read from the file its `_FILE` variant names. An empty or blank variable counts
 * as unset. Setting both a variable and its `_FILE`, or naming a file that cannot be read, is a problem naming
 * the variable and the path; the setting then stays unset.
 */
export function withSecretFiles(env: Env, problems: string[]): Env {
  const out: Env = { ...env };
  for (const { setting, file } of SECRET_FILE_SETTINGS) {
    const path = env[file];
    if (!isSet(path)) continue;
    if (isSet(env[setting])) {
      problems.push(`${setting} and ${file} are both set: set only one of them`);
      continue;
    }
    const read = readSecret(path.trim());
    if ("value" in read) out[setting] = read.value;
    else problems.push(`${file}: the file ${JSON.stringify(path.trim())} ${read.problem}`);
  }
  return out;
}
