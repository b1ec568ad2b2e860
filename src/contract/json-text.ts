import { scanJson } from "./json-members.ts";

/** The members of a decision request that are forwarded to the model service as the client wrote them. */
const FORWARDED_MEMBERS = ["state", "questions"] as const;

/** Deeper JSON is refused (422): no state needs it, and recursive code downstream (serialisers, prompts) would overflow. */
export const MAX_JSON_DEPTH = 256;

/**
 * A decoded JSON text parsed as every request body is: refused when nested deeper than MAX_JSON_DEPTH, the last of
 * a member named twice counts (JSON.parse). `problem` completes "Request body …" (or "line 17 …").
 */
export function parseJsonText(text: string): { body: unknown; members: Map<string, string> } | { problem: string } {
  // Before parsing: a body nested too deep is refused without building it (JSON.parse would recurse into it).
  const scanned = scanJson(text, MAX_JSON_DEPTH, FORWARDED_MEMBERS);
  if (scanned.deeperThanLimit) return { problem: `nests arrays and objects deeper than ${MAX_JSON_DEPTH} levels.` };
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    const detail = err instanceof RangeError ? `JSON nests deeper than ${MAX_JSON_DEPTH} levels` : (err as Error).message;
    return { problem: `is not valid JSON: ${detail}` };
  }
  return { body: parsed, members: scanned.members };
}

/** The request's own text of `state` and `questions` (parseJsonText's members), to forward every value exactly as written. */
export function forwardedText(members: Map<string, string> | null | undefined): { state: string; questions: string } | undefined {
  const state = members?.get("state");
  const questions = members?.get("questions");
  return state !== undefined && questions !== undefined ? { state, questions } : undefined;
}
