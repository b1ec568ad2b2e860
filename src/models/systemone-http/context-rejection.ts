/**
 * How model servers say that a request does not fit the model's context, in the message of a 400 / 422:
 * - llama.cpp server: "the request exceeds the available context size, try increasing it", "prompt is too long";
 * - vLLM / OpenAI: "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens";
 * - Ollama: "input length exceeds maximum context length", "prompt too long";
 * - TGI: "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 2048";
 * - System One servers: "context length exceeded: 9000 tokens > 8192".
 */
const CONTEXT_TEXTS: readonly RegExp[] = [
  /\bcontext[ _-]?(length|size|window|limit)\b/i,
  /\b(maximum|max) context\b/i,
  /\bexceeds? (the )?(model'?s? )?(available |maximum |max )?context\b/i,
  /\btoo many (input )?tokens\b/i,
  /\b(prompt|input|request|state) (is )?too (long|large|big)\b/i,
  /\btokens?\b.{0,80}(must be <=|\bexceed(s|ed)?\b|\bmore than the maximum\b)/i,
];

/** Whether an upstream's 400 / 422 message says the request is longer than the model's context. */
export function saysContextExceeded(text: string | undefined): boolean {
  if (text === undefined) return false;
  return CONTEXT_TEXTS.some((pattern) => pattern.test(text));
}
