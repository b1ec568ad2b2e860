/**
 * Summary of a V8 `.cpuprofile` (as written by `node --cpu-prof`), for bench/gateway.ts --profile: top self-time
 * functions, self time by package or file group, and inclusive time of the project's own (src/) functions, as
 * shares of the time the process was not idle.
 */
import { readFileSync } from "node:fs";
import { ROOT } from "./support.ts";

interface CpuProfile {
  nodes: Array<{ id: number; callFrame: { functionName: string; url: string; lineNumber: number }; children?: number[] }>;
  samples: number[];
  timeDeltas: number[];
}

function shortUrl(url: string): string {
  if (url === "") return "";
  const nm = url.lastIndexOf("/node_modules/");
  if (nm >= 0) return url.slice(nm + "/node_modules/".length);
  return url.replace(`file://${ROOT}`, "").replace(/^file:\/\//, "");
}

/** What a file belongs to: the project's own source, a package, Node's internals, or V8's pseudo-nodes. */
function category(url: string, name: string): string {
  if (url === "") return name.startsWith("(") ? name : "(native)";
  if (url.startsWith("node:"))
    return `node:${url.slice(5).split("/")[0] === "internal" ? url.slice(5).split("/").slice(0, 2).join("/") : url.slice(5)}`;
  const nm = url.lastIndexOf("/node_modules/");
  if (nm >= 0) {
    const rest = url.slice(nm + "/node_modules/".length).split("/");
    return rest[0]!.startsWith("@") ? `${rest[0]}/${rest[1]}` : rest[0]!;
  }
  return shortUrl(url).split("/").slice(0, 3).join("/");
}

/**
 * Top self-time functions, self time by package/file group, and inclusive time of the project's own functions,
 * over the profile after its first `skipSeconds` (start-up and warm-up); with `requests` (answered in that
 * window), also the main thread's busy time per request.
 */
export function summarizeProfile(file: string, options: { skipSeconds?: number; requests?: number; top?: number } = {}): string {
  const top = options.top ?? 20;
  const skipUs = (options.skipSeconds ?? 0) * 1e6;
  const profile = JSON.parse(readFileSync(file, "utf8")) as CpuProfile;
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const self = new Map<string, number>();
  const inclusive = new Map<string, number>();
  const groups = new Map<string, number>();
  let elapsed = 0;
  let total = 0;
  let idle = 0;
  const keyOf = (id: number) => {
    const f = byId.get(id)!.callFrame;
    // tsx emits each TypeScript module on one line, so a line number means something only for .js files.
    return `${f.functionName || "(anonymous)"}  ${shortUrl(f.url)}${f.url && f.lineNumber > 0 ? `:${f.lineNumber + 1}` : ""}`;
  };
  for (let i = 0; i < profile.samples.length; i++) {
    const id = profile.samples[i]!;
    const dt = profile.timeDeltas[i] ?? 0;
    elapsed += dt;
    if (elapsed < skipUs) continue;
    const node = byId.get(id)!;
    total += dt;
    if (node.callFrame.functionName === "(idle)") {
      idle += dt;
      continue;
    }
    const key = keyOf(id);
    self.set(key, (self.get(key) ?? 0) + dt);
    const g = category(node.callFrame.url, node.callFrame.functionName);
    groups.set(g, (groups.get(g) ?? 0) + dt);
    const seen = new Set<string>();
    for (let at: number | undefined = id; at !== undefined; at = parent.get(at)) {
      const n = byId.get(at)!;
      if (!n.callFrame.url.includes("/src/") || n.callFrame.url.includes("/node_modules/")) continue;
      const k = keyOf(at);
      if (seen.has(k)) continue;
      seen.add(k);
      inclusive.set(k, (inclusive.get(k) ?? 0) + dt);
    }
  }
  const busy = total - idle;
  const pct = (v: number) => `${((100 * v) / busy).toFixed(1)} %`;
  const lines: string[] = [];
  const perRequest = options.requests ? `, ${(busy / options.requests).toFixed(1)} µs per request` : "";
  lines.push(
    `main thread over the ${(total / 1e6).toFixed(1)} s after the first ${(skipUs / 1e6).toFixed(1)} s: busy (not idle) ${(busy / 1e6).toFixed(1)} s = ` +
      `${((100 * busy) / total).toFixed(0)} % of one core${perRequest}; shares below are of busy time`,
  );
  lines.push("", "| self time | function  file:line |", "| ---: | --- |");
  for (const [k, v] of [...self].sort((a, b) => b[1] - a[1]).slice(0, top)) lines.push(`| ${pct(v)} | \`${k}\` |`);
  lines.push("", "| self time | package / group |", "| ---: | --- |");
  for (const [k, v] of [...groups].sort((a, b) => b[1] - a[1]).slice(0, 15)) lines.push(`| ${pct(v)} | ${k} |`);
  lines.push("", "| inclusive | project function (src/) |", "| ---: | --- |");
  for (const [k, v] of [...inclusive].sort((a, b) => b[1] - a[1]).slice(0, 15)) lines.push(`| ${pct(v)} | \`${k}\` |`);
  return lines.join("\n");
}
