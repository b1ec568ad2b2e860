import type { Question } from "../../contract/decision.ts";

/**
 * From label probabilities to contract answers.
 *
 * - choice: `probabilities` keyed by the original option names; `choice` = the most probable option
 *   (ties → the first in option order); `confidence` = (max p − 1/k) / (1 − 1/k) for k options
 *   (0 for a uniform distribution, 1 when one option has all the mass; 1 for a single option).
 * - score: `probabilities` and `legend` keyed "0" … "n−1"; `score` = Σ level × p(level), the expected
 *   level; `confidence` = the same formula over the n levels.
 * - noul: `noul` = P(true label) / (P(true label) + P(false label)).
 */

/**
 * Entries of `tokens` in a next-token distribution, renormalised to sum to 1; null when every entry
 * is 0 (see `renormalise`).
 */
export function restrictAndRenormalise(distribution: ReadonlyMap<number, number>, tokens: readonly number[]): number[] | null {
  return renormalise(tokens.map((t) => distribution.get(t) ?? 0));
}

/**
 * Divides by the sum. Null when there is no mass to renormalise: every label's probability
 * underflowed to 0 (the model is all but certain its reply starts with some other token).
 */
export function renormalise(weights: readonly number[]): number[] | null {
  let sum = 0;
  for (const w of weights) {
    if (!(w >= 0) || !Number.isFinite(w)) throw new Error(`invalid label probability ${w}`);
    sum += w;
  }
  if (!(sum > 0)) return null;
  return weights.map((w) => w / sum);
}

/** The uniform distribution over `k` labels (what is known when every label had probability 0). */
export function uniform(k: number): number[] {
  return Array.from({ length: k }, () => 1 / k);
}

/** (max p − 1/k) / (1 − 1/k), clamped to [0, 1]; 1 when k = 1. */
export function peakConfidence(p: readonly number[]): number {
  const k = p.length;
  if (k <= 1) return 1;
  const max = Math.max(...p);
  const c = (max - 1 / k) / (1 - 1 / k);
  return Math.min(1, Math.max(0, c));
}

/** Index of the largest value; ties go to the first. */
export function argmax(p: readonly number[]): number {
  let best = 0;
  for (let i = 1; i < p.length; i++) {
    if ((p[i] as number) > (p[best] as number)) best = i;
  }
  return best;
}

/**
 * The contract answer of one question from its label distribution `p` (in label order: options in
 * criteria order, levels from 0, or [true, false] for noul). Maps are null-prototype objects so option
 * names such as `__proto__` stay plain keys.
 */
export function buildAnswer(question: Question, p: readonly number[]): Record<string, unknown> {
  switch (question.type) {
    case "choice": {
      const names = Object.keys(question.criteria);
      if (names.length !== p.length) throw new Error("one probability per option expected");
      const probabilities = nullObject();
      names.forEach((name, i) => {
        probabilities[name] = p[i];
      });
      return { type: "choice", choice: names[argmax(p)], probabilities, confidence: peakConfidence(p) };
    }
    case "score": {
      const n = question.criteria.length;
      if (n !== p.length) throw new Error("one probability per level expected");
      const probabilities = nullObject();
      const legend = nullObject();
      let score = 0;
      question.criteria.forEach((description, i) => {
        probabilities[String(i)] = p[i];
        legend[String(i)] = description;
        score += i * (p[i] as number);
      });
      score = Math.min(n - 1, Math.max(0, score));
      return { type: "score", score, probabilities, confidence: peakConfidence(p), legend };
    }
    case "noul": {
      if (p.length !== 2) throw new Error("two probabilities expected");
      return { type: "noul", noul: Math.min(1, Math.max(0, p[0] as number)) };
    }
  }
}

function nullObject(): Record<string, unknown> {
  return Object.create(null) as Record<string, unknown>;
}
