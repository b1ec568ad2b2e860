import type { ModelContext } from "../contract/models.ts";
import type { ModelCall, TokenBound } from "../models/model-service.ts";
import type { ResolvedModel } from "./model-registry.ts";

/**
 * Tokens a model service's prompt template may add around a request, besides the request's own text: a system
 * message once, and a frame around each question. Generous for the chat templates of the models we know.
 */
export const PROMPT_OVERHEAD_TOKENS = 256;
export const QUESTION_OVERHEAD_TOKENS = 64;
/** How long the bound waits for a model's published context (the router answers from its cache most of the time). */
export const CONTEXT_LOOKUP_TIMEOUT_MS = 2000;

/** A token bound and where it comes from (for the detail of a refusal). */
export interface RequestBound extends TokenBound {
  basis: "counted" | "bytes" | "context";
}

/**
 * An upper bound of the tokens a model service will report for a call: the service's own count when it can make
 * one (the in-process engine tokenizes the request); else one token per UTF-8 byte of the request's state and
 * questions (no tokenizer of a System One model makes a token of less than one byte) plus the template's overhead,
 * each part limited by the model's context when it has one (configured, else published by its deployments): a
 * model that takes the request evaluates at most `max_state` tokens of state (and of `max_branch`, the state plus
 * one question) and at most `max_branch` tokens per question. One output token per question.
 */
export async function tokenBoundOf(model: Pick<ResolvedModel, "service" | "context">, call: ModelCall): Promise<RequestBound> {
  const counted = model.service.tokenBound ? await model.service.tokenBound(call).catch(() => null) : null;
  if (counted) return { input: counted.input, output: counted.output, basis: "counted" };
  const questions = Object.keys(call.questions).length;
  const stateBytes = Buffer.byteLength(call.text ? call.text.state : (JSON.stringify(call.state ?? null) ?? "null"), "utf8");
  const questionsBytes = Buffer.byteLength(call.text ? call.text.questions : JSON.stringify(call.questions), "utf8");
  const bytes = { state: stateBytes, questions: questionsBytes + QUESTION_OVERHEAD_TOKENS * questions };
  const byBytes = PROMPT_OVERHEAD_TOKENS + bytes.state + bytes.questions;
  const context = model.context ?? (await publishedContext(model, call.model));
  const byContext = context ? PROMPT_OVERHEAD_TOKENS + limitedByContext(bytes, questions, context) : byBytes;
  return byContext < byBytes
    ? { input: byContext, output: questions, basis: "context" }
    : { input: byBytes, output: questions, basis: "bytes" };
}

/** The state's and the questions' tokens (at most their bytes), each at most what the context lets the model evaluate. */
export function limitedByContext(bytes: { state: number; questions: number }, questions: number, context: ModelContext): number {
  const stateLimit = Math.min(context.max_state ?? Number.POSITIVE_INFINITY, context.max_branch ?? Number.POSITIVE_INFINITY);
  const questionsLimit = context.max_branch === undefined ? Number.POSITIVE_INFINITY : questions * context.max_branch;
  return Math.min(bytes.state, stateLimit) + Math.min(bytes.questions, questionsLimit);
}

/** The context the model's deployments publish (GET /v1/models); none when they publish none or cannot be asked now. */
async function publishedContext(model: Pick<ResolvedModel, "service">, name: string): Promise<ModelContext | undefined> {
  try {
    const listed = await model.service.listModels({ timeoutMs: CONTEXT_LOOKUP_TIMEOUT_MS });
    return (listed.find((m) => m.name === name) ?? (listed.length === 1 ? listed[0] : undefined))?.context;
  } catch {
    return undefined;
  }
}
