import type { ModelCall, ModelService, TokenBound } from "../models/model-service.ts";

/**
 * Tokens a model service's prompt template may add around a request, besides the request's own text: a system
 * message once, and a frame around each question. Generous for the chat templates of the models we know.
 */
export const PROMPT_OVERHEAD_TOKENS = 256;
export const QUESTION_OVERHEAD_TOKENS = 64;

/**
 * An upper bound of the tokens a model service will report for a call: the service's own count when it can make
 * one (the in-process engine tokenizes the request), else one token per UTF-8 byte of the request's state and
 * questions (no tokenizer of a System One model makes a token of less than one byte) plus the template's overhead,
 * and one output token per question.
 */
export async function tokenBoundOf(service: ModelService, call: ModelCall): Promise<TokenBound> {
  const counted = service.tokenBound ? await service.tokenBound(call).catch(() => null) : null;
  if (counted) return counted;
  const questions = Object.keys(call.questions).length;
  const bytes = call.text
    ? Buffer.byteLength(call.text.state, "utf8") + Buffer.byteLength(call.text.questions, "utf8")
    : Buffer.byteLength(JSON.stringify({ state: call.state ?? null, questions: call.questions }), "utf8");
  return { input: bytes + PROMPT_OVERHEAD_TOKENS + QUESTION_OVERHEAD_TOKENS * questions, output: questions };
}
