import { PROMPT_OVERHEAD_TOKENS, QUESTION_OVERHEAD_TOKENS } from "../../src/gateway/token-bound.ts";

/**
 * The byte-based token bound of a body sent as JSON.stringify(body): its state's and questions' UTF-8 bytes plus the
 * template overhead (what the gateway reserves for a model without a context).
 */
export function byteBound(body: { state?: unknown; questions?: unknown }): number {
  const bytes = Buffer.byteLength(JSON.stringify(body.state)) + Buffer.byteLength(JSON.stringify(body.questions));
  return bytes + PROMPT_OVERHEAD_TOKENS + QUESTION_OVERHEAD_TOKENS * Object.keys(body.questions as object).length;
}
