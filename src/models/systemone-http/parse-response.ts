import type { ModelContext } from "../../contract/models.ts";
import type { UpstreamModel } from "../model-service.ts";

/** Result of a pure parse: the value, or a short reason (used in an `invalid_response` message). */
export type Parsed<T> = { ok: true; value: T } | { ok: false; reason: string };

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function typeName(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  return typeof value === "object" ? "an object" : `a ${typeof value}`;
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

/** Decodes a body as strict UTF-8 JSON. */
export function parseJsonBody(body: Uint8Array): Parsed<unknown> {
  let text: string;
  try {
    text = utf8.decode(body);
  } catch {
    return { ok: false, reason: "body is not valid UTF-8" };
  }
  if (text.trim() === "") return { ok: false, reason: "body is empty" };
  try {
    return { ok: true, value: JSON.parse(text) as unknown };
  } catch {
    return { ok: false, reason: "body is not JSON" };
  }
}

export interface DecideEnvelope {
  answers: unknown;
  usage: { input_tokens: number; output_tokens: number };
}

/** `{answers: object, usage: {input_tokens: int ≥ 1, output_tokens: int ≥ 0}, …}`; answers stay unchecked. */
export function parseDecideEnvelope(body: unknown): Parsed<DecideEnvelope> {
  if (!isObject(body)) return { ok: false, reason: `body is ${typeName(body)}, not an object` };
  const { answers, usage } = body;
  if (!isObject(answers))
    return { ok: false, reason: `"answers" is ${answers === undefined ? "missing" : typeName(answers)}, not an object` };
  if (!isObject(usage)) return { ok: false, reason: `"usage" is ${usage === undefined ? "missing" : typeName(usage)}, not an object` };
  const input = usage.input_tokens;
  const output = usage.output_tokens;
  if (!Number.isSafeInteger(input) || (input as number) < 1) {
    return { ok: false, reason: `usage.input_tokens is ${describeNumber(input)}, not an integer >= 1` };
  }
  if (!Number.isSafeInteger(output) || (output as number) < 0) {
    return { ok: false, reason: `usage.output_tokens is ${describeNumber(output)}, not an integer >= 0` };
  }
  return { ok: true, value: { answers, usage: { input_tokens: input as number, output_tokens: output as number } } };
}

function describeNumber(value: unknown): string {
  if (value === undefined) return "missing";
  if (typeof value === "number") return String(value);
  return typeName(value);
}

/**
 * `{"models": [{name | id, context?}, …]}`. Items use `name`, or `id` when `name` is not a string.
 * Only a valid `context` is kept (max_state / max_branch integers ≥ 1, strict boolean); invalid or
 * unknown context fields are dropped, and a context left empty is omitted.
 */
export function parseModelList(body: unknown): Parsed<UpstreamModel[]> {
  if (!isObject(body)) return { ok: false, reason: `body is ${typeName(body)}, not an object` };
  const list = body.models;
  if (!Array.isArray(list)) return { ok: false, reason: `"models" is ${list === undefined ? "missing" : typeName(list)}, not an array` };
  const models: UpstreamModel[] = [];
  for (let i = 0; i < list.length; i++) {
    const item: unknown = list[i];
    if (!isObject(item)) return { ok: false, reason: `models[${i}] is ${typeName(item)}, not an object` };
    const name = typeof item.name === "string" ? item.name : typeof item.id === "string" ? item.id : undefined;
    if (name === undefined || name === "") return { ok: false, reason: `models[${i}] has no "name" (or "id") string` };
    const model: UpstreamModel = { name };
    const context = parseContext(item.context);
    if (context !== undefined) model.context = context;
    models.push(model);
  }
  return { ok: true, value: models };
}

function parseContext(value: unknown): ModelContext | undefined {
  if (!isObject(value)) return undefined;
  const context: ModelContext = {};
  if (isPositiveInteger(value.max_state)) context.max_state = value.max_state;
  if (isPositiveInteger(value.max_branch)) context.max_branch = value.max_branch;
  if (typeof value.strict === "boolean") context.strict = value.strict;
  return Object.keys(context).length > 0 ? context : undefined;
}

function isPositiveInteger(value: unknown): value is number {
  return Number.isSafeInteger(value) && (value as number) >= 1;
}

/** The model service's own words are kept this far (for the server log, which escapes them). */
export const MAX_DETAIL_CHARS = 300;

/**
 * The human message of an upstream error body: `detail` (string, or a FastAPI-style list of
 * `{msg}`), else `error` (string or `{message}`), else `message`; at most 300 characters, as sent.
 */
export function upstreamDetail(body: unknown): string | undefined {
  if (!isObject(body)) return undefined;
  const candidates: unknown[] = [body.detail, body.error, body.message];
  for (const c of candidates) {
    const text = messageOf(c);
    if (text !== undefined) return clip(text, MAX_DETAIL_CHARS);
  }
  return undefined;
}

/** The start of a body that is not JSON (an HTML error page, a stack trace), decoded leniently; undefined when blank. */
export function bodySnippet(body: Uint8Array): string | undefined {
  const text = Buffer.from(body.buffer, body.byteOffset, Math.min(body.byteLength, MAX_DETAIL_CHARS * 4)).toString("utf8");
  return text.trim() === "" ? undefined : clip(text, MAX_DETAIL_CHARS);
}

function messageOf(value: unknown): string | undefined {
  if (typeof value === "string") return value.trim() === "" ? undefined : value;
  if (Array.isArray(value)) {
    const parts = value
      .map((v) => (typeof v === "string" ? v : isObject(v) && typeof v.msg === "string" ? v.msg : undefined))
      .filter((v): v is string => v !== undefined && v !== "");
    return parts.length > 0 ? parts.join("; ") : undefined;
  }
  if (isObject(value) && typeof value.message === "string" && value.message !== "") return value.message;
  return undefined;
}

/** At most `max` characters (code points), unchanged otherwise. */
export function clip(text: string, max: number): string {
  const chars = Array.from(text);
  return chars.length > max ? `${chars.slice(0, max - 1).join("")}…` : text;
}

/** Cuts at most `max` characters (code points), without control characters. */
export function truncate(text: string, max: number): string {
  // biome-ignore lint/suspicious/noControlCharactersInRegex: the class must match the C0 controls and DEL to strip them from upstream text
  return clip(text.replace(/[\u0000-\u001f\u007f]+/g, " "), max);
}
