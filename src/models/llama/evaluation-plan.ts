import type { Question } from "../../contract/decision.ts";
import { type ModelCall, ModelServiceError, type TokenBound } from "../model-service.ts";
import { type LabelKind, type LabelSet, type LabelTokenizer, NoUsableLabelsError, pickLabels } from "./labels.ts";
import { renderQuestionText, renderSystemText } from "./prompt.ts";

/**
 * The evaluation plan of a call: which tokens the engine evaluates (the state part once, then each
 * question on top of it), which labels each question is answered with and their tokens, and the
 * context-limit checks. Pure: the model is seen only through `RenderPrompt`, its chat template and
 * tokenizer, so a test can plan with plain arrays. Token ids are a type parameter (`T`): the engine
 * plans with node-llama-cpp's `Token`, tests with plain numbers.
 */

/** Tokens kept free after a question's prompt for the answer's label tokens. */
export const ANSWER_RESERVE_TOKENS = 8;
/** Tokens kept free after a state of max_state tokens for a question. */
export const QUESTION_RESERVE_TOKENS = 64;

/** The enforced limits, in tokens: the state part (max_state), and the state plus the longest single question (max_branch). */
export interface ContextLimits {
  maxState: number;
  maxBranch: number;
}

/** A prompt rendered with the model's chat template up to the answer position, seen through the model's tokenizer. */
export interface PromptPiece<T extends number = number> {
  /** The prompt's tokens (BOS first when the model expects one). */
  tokens(): T[];
  /** What a label appended to the prompt is tokenized with: prompts with the same key give a label the same tokens. */
  tailKey(): string;
  /** The tokens a label adds at this prompt's answer position (null when it cannot be used there). */
  labelTokenizer(): LabelTokenizer;
}

/** Renders a system message and a user message up to the answer position (one call's worth: may memoise). */
export type RenderPrompt<T extends number = number> = (systemText: string, userText: string) => PromptPiece<T>;

export interface PlannedQuestion<T extends number = number> {
  id: string;
  question: Question;
  /** The user message shown to the model. */
  text: string;
  /** The whole prompt up to the answer position (state part first). */
  tokens: T[];
  labels: string[];
  /** Each label's tokens at the answer position. */
  labelTokens: T[][];
  singleToken: boolean;
}

export interface EvaluationPlan<T extends number = number> {
  /** Tokens of the state part: the prompt tokens every question shares (system text with the state). */
  stateTokens: T[];
  questions: PlannedQuestion<T>[];
}

/** The call's part the plan depends on. */
export type PlannedCall = Pick<ModelCall, "state" | "questions" | "text">;

/**
 * The limits a context of `contextSize` tokens allows: max_branch keeps {@link ANSWER_RESERVE_TOKENS} free for the
 * answer, max_state keeps {@link QUESTION_RESERVE_TOKENS} of max_branch free for a question; configured limits only
 * lower them. A max_state below 1 leaves no room for a state (the caller refuses to load).
 */
export function contextLimits(
  contextSize: number,
  configured: { maxState?: number | undefined; maxBranch?: number | undefined } = {},
): ContextLimits {
  const maxBranch = Math.min(configured.maxBranch ?? Infinity, contextSize - ANSWER_RESERVE_TOKENS);
  const maxState = Math.min(configured.maxState ?? Infinity, maxBranch - QUESTION_RESERVE_TOKENS);
  return { maxState, maxBranch };
}

/**
 * Renders and tokenizes every question of `call`; rejects an over-long state (`context_rejected`) before
 * anything else, then per question, in order: labels the vocabulary cannot offer, labels that tokenize
 * differently after the question, or are too long (`invalid_response`), and a state plus question longer than
 * max_branch (`context_rejected`).
 *
 * The state part is the common prefix of two probe prompts that differ only in the user message. Labels
 * are picked once per (kind, count) at the probe's answer position; a question whose prompt ends in the same
 * last piece gets those tokens as they are, any other is checked at its own answer position.
 */
export function planCall<T extends number>(call: PlannedCall, limits: ContextLimits, render: RenderPrompt<T>): EvaluationPlan<T> {
  const systemText = renderSystemText(call.state, call.text?.state);
  const probeA = render(systemText, "A");
  const probeB = render(systemText, "B");
  const a = probeA.tokens();
  const stateLength = commonPrefixLength(a, probeB.tokens());
  const stateTokens = a.slice(0, stateLength);
  if (stateLength > limits.maxState) {
    throw contextRejected(`state is ${stateLength} tokens; the model's max_state is ${limits.maxState}`);
  }

  const probeLabels = probeA.labelTokenizer();
  const probeTail = probeA.tailKey();
  const labelSets = new Map<string, LabelSet>();
  const questions: PlannedQuestion<T>[] = [];
  for (const [id, question] of Object.entries(call.questions)) {
    const [kind, count] = labelKindOf(question);
    const key = `${kind}:${count}`;
    let set = labelSets.get(key);
    if (!set) {
      set = pickLabelsOrFail(id, kind, count, probeLabels);
      labelSets.set(key, set);
    }
    const text = renderQuestionText(question, set.labels);
    const rendered = render(systemText, text);
    const tokens = rendered.tokens();
    const labelTokens =
      rendered.tailKey() === probeTail ? set.tokens.map((t) => [...t] as T[]) : labelTokensAt<T>(id, set, rendered.labelTokenizer());
    const longestLabel = Math.max(...labelTokens.map((t) => t.length));
    if (longestLabel - 1 > ANSWER_RESERVE_TOKENS) {
      throw new ModelServiceError("invalid_response", `question ${JSON.stringify(id)}: labels of ${longestLabel} tokens are too long`);
    }
    if (tokens.length > limits.maxBranch) {
      throw contextRejected(
        `question ${JSON.stringify(id)}: the state plus the question is ${tokens.length} tokens; the model's max_branch is ${limits.maxBranch}`,
      );
    }
    questions.push({ id, question, text, tokens, labels: set.labels, labelTokens, singleToken: set.singleToken });
  }
  return { stateTokens, questions };
}

/** The labels' tokens at another answer position: each must tokenize (and, single-token labels, to the same token). */
function labelTokensAt<T extends number>(id: string, picked: LabelSet, here: LabelTokenizer): T[][] {
  return picked.labels.map((label, i) => {
    const t = here(label);
    const expected = picked.tokens[i] as number[];
    if (t === null || (picked.singleToken && (t.length !== 1 || t[0] !== expected[0]))) {
      throw new ModelServiceError(
        "invalid_response",
        `question ${JSON.stringify(id)}: the label ${JSON.stringify(label)} does not tokenize the same after this question`,
      );
    }
    return [...t] as T[];
  });
}

/**
 * The tokens evaluating `plan` reports at most: the input exactly (the state once, each question's own
 * tokens); the output one per question, plus every label token for multi-token labels.
 */
export function planTokenBound(plan: EvaluationPlan<number>): TokenBound {
  const state = plan.stateTokens.length;
  let input = state;
  let output = 0;
  for (const q of plan.questions) {
    input += Math.max(0, q.tokens.length - state);
    output += q.singleToken ? 1 : 1 + q.labelTokens.reduce((sum, t) => sum + t.length, 0);
  }
  return { input, output };
}

/**
 * Multi-token labels: the distinct proper, non-empty prefixes of the labels' token sequences, after each of
 * which one next-token distribution is read (in this order: by their comma-joined ids, as strings).
 */
export function labelPrefixes<T extends number>(labelTokens: ReadonlyArray<readonly T[]>): T[][] {
  const prefixes = new Set<string>();
  for (const tokens of labelTokens) {
    for (let j = 1; j < tokens.length; j++) prefixes.add(tokens.slice(0, j).join(","));
  }
  return [...prefixes].sort().map((key) => key.split(",").map(Number) as T[]);
}

/** Length of the common prefix of two token arrays. */
export function commonPrefixLength(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

/** The label scheme of a question and how many labels it needs. */
export function labelKindOf(q: Question): [LabelKind, number] {
  switch (q.type) {
    case "choice":
      return ["options", Object.keys(q.criteria).length];
    case "score":
      return ["levels", q.criteria.length];
    case "noul":
      return ["noul", 2];
  }
}

function pickLabelsOrFail(id: string, kind: LabelKind, count: number, tokenize: LabelTokenizer): LabelSet {
  try {
    return pickLabels(kind, count, tokenize);
  } catch (err) {
    if (err instanceof NoUsableLabelsError) {
      throw new ModelServiceError(
        "invalid_response",
        `question ${JSON.stringify(id)}: this model's vocabulary has no usable labels (${err.message})`,
      );
    }
    throw err;
  }
}

/** Which limit the request passes, in words a client may read (the 422's detail). */
function contextRejected(why: string): ModelServiceError {
  return new ModelServiceError("context_rejected", why, undefined, { note: why });
}
