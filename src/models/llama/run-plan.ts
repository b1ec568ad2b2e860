import type { LlamaContextSequence, Token } from "node-llama-cpp";
import { ModelServiceError } from "../model-service.ts";
import type { LlamaLogger } from "./engine-settings.ts";
import { commonPrefixLength, type EvaluationPlan, labelPrefixes, type PlannedQuestion } from "./evaluation-plan.ts";
import type { Deadline } from "./pool.ts";
import { buildAnswer, renormalise, restrictAndRenormalise, uniform } from "./scoring.ts";

/** Running an evaluation plan on a context sequence: next-token distributions, label probabilities, answers. */

export interface PlanResult {
  /** The contract answers by question id (a null-prototype object). */
  answers: Record<string, unknown>;
  /** Tokens evaluated. */
  input: number;
  /** Next-token distributions read. */
  output: number;
}

export interface EvaluationHooks {
  /** Checked before each question: the service was closed (the call then fails `unavailable`). */
  closed(): boolean;
  logger: LlamaLogger;
}

/** Evaluates a plan on one sequence: the state part once, then each question on top of it. */
export async function runPlan(
  seq: LlamaContextSequence,
  plan: EvaluationPlan<Token>,
  deadline: Deadline,
  hooks: EvaluationHooks,
): Promise<PlanResult> {
  let input = 0;
  let output = 0;
  // A fresh sequence per request: no state (and no timing or usage difference) leaks between requests.
  if (seq.nextTokenIndex > 0) await seq.clearHistory();
  if (plan.stateTokens.length > 0) {
    await seq.controlledEvaluate(plan.stateTokens);
    input += plan.stateTokens.length;
  }
  const answers = Object.create(null) as Record<string, unknown>;
  for (const q of plan.questions) {
    deadline.throwIfStopped();
    if (hooks.closed()) throw new ModelServiceError("unavailable", "the embedded model service is closed");
    const first = await distributionAfter(seq, q.tokens);
    input += first.evaluated;
    output += 1;
    let probabilities: number[] | null;
    if (q.singleToken) {
      probabilities = restrictAndRenormalise(
        first.distribution,
        q.labelTokens.map((t) => t[0] as number),
      );
    } else {
      const scored = await sequenceProbabilities(seq, q, first.distribution, deadline);
      output += scored.evaluated;
      probabilities = scored.probabilities;
    }
    if (probabilities === null) {
      hooks.logger.warn(
        `question ${JSON.stringify(q.id)}: every label's probability underflowed to 0 (the model's reply would start with ` +
          `another token); answered with the uniform distribution`,
      );
      probabilities = uniform(q.labels.length);
    }
    answers[q.id] = buildAnswer(q.question, probabilities);
  }
  return { answers, input, output };
}

/**
 * Multi-token labels: P(label) = Π P(t_j | prompt, t_<j), one next-token distribution per distinct
 * proper prefix of the labels' token sequences, renormalised over the labels.
 */
async function sequenceProbabilities(
  seq: LlamaContextSequence,
  q: PlannedQuestion<Token>,
  first: ReadonlyMap<number, number>,
  deadline: Deadline,
): Promise<{ probabilities: number[] | null; evaluated: number }> {
  const distributions = new Map<string, ReadonlyMap<number, number>>([["", first]]);
  let evaluated = 0;
  for (const path of labelPrefixes(q.labelTokens)) {
    deadline.throwIfStopped();
    const r = await distributionAfter(seq, [...q.tokens, ...path]);
    evaluated += r.evaluated;
    distributions.set(path.join(","), r.distribution);
  }
  const weights = q.labelTokens.map((tokens) => {
    let p = 1;
    for (let j = 0; j < tokens.length; j++) {
      const d = distributions.get(tokens.slice(0, j).join(",")) as ReadonlyMap<number, number>;
      p *= d.get(tokens[j] as number) ?? 0;
    }
    return p;
  });
  return { probabilities: renormalise(weights), evaluated };
}

/**
 * The full next-token distribution after `tokens`: keeps what the sequence already holds of them,
 * erases the rest (`eraseContextTokenRanges`), evaluates the remainder with `controlledEvaluate`, and
 * reads the plain softmax over the whole vocabulary at the last token.
 */
async function distributionAfter(
  seq: LlamaContextSequence,
  tokens: Token[],
): Promise<{ distribution: ReadonlyMap<number, number>; evaluated: number }> {
  const held = seq.contextTokens;
  const keep = Math.min(commonPrefixLength(held, tokens), tokens.length - 1);
  if (held.length > keep) await seq.eraseContextTokenRanges([{ start: keep, end: held.length }]);
  const rest = tokens.slice(keep);
  const last = rest[rest.length - 1] as Token;
  const results = await seq.controlledEvaluate([...rest.slice(0, -1), [last, { generateNext: { probabilities: true } }]]);
  const distribution = results[results.length - 1]?.next.probabilities;
  if (!distribution) throw new ModelServiceError("invalid_response", "the model returned no next-token distribution");
  return { distribution, evaluated: rest.length };
}
