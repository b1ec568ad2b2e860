/**
 * Answer labels. Every option (choice), level (score) or side (noul) is shown to the model behind a
 * short label, and the engine reads the model's next-token probabilities of the labels' tokens at
 * the answer position.
 *
 * Preferred: labels that are exactly ONE token in the model's vocabulary right after the prompt
 * (checked with the model's tokenizer, never assumed): the answer distribution is then the
 * next-token distribution restricted to those tokens and renormalised.
 *
 * Fallback (a vocabulary without enough single-token labels): the first `count` labels of the
 * scheme, whatever their token counts. They all have the same number of characters (or, for noul,
 * differ in their first character), so their token sequences are prefix-free, and each label is
 * scored by its sequence probability P(t1) · P(t2 | t1) · … at the answer position; the products are
 * renormalised over the labels. This is exact: it is the model's probability of starting its reply
 * with exactly that label, conditioned on the reply being one of the labels.
 */

/** Token ids of `label` when appended to the prompt, or null when the label cannot be used there. */
export type LabelTokenizer = (label: string) => readonly number[] | null;

export type LabelKind = "options" | "levels" | "noul";

export interface LabelSet {
  labels: string[];
  /** Token ids of each label at the answer position, in label order. */
  tokens: number[][];
  /** Every label is exactly one token (distinct tokens). */
  singleToken: boolean;
}

export class NoUsableLabelsError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "NoUsableLabelsError";
  }
}

const LETTERS = Array.from({ length: 26 }, (_, i) => String.fromCharCode(65 + i));
const TWO_LETTERS = LETTERS.flatMap((a) => LETTERS.map((b) => a + b));
const DIGITS = Array.from({ length: 10 }, (_, i) => String(i));
const NOUL_PAIRS: ReadonlyArray<readonly [string, string]> = [
  ["Yes", "No"],
  ["yes", "no"],
  ["Y", "N"],
  ["A", "B"],
];

/** Most options or levels a label scheme can name. */
export const MAX_LABELS = TWO_LETTERS.length;

/** The letter scheme for `count` options: "A" … "Z" up to 26, else "AA" … "ZZ". */
export function letterLabels(count: number): readonly string[] {
  return count <= LETTERS.length ? LETTERS : TWO_LETTERS;
}

/**
 * Picks labels for `count` answers.
 * - options: "A" … "Z" (up to 26 options) or "AA" … "ZZ" (more), skipping labels that are not one token;
 * - levels: "0" … "n−1" when there are at most 10 levels and every digit is one token, else as options;
 * - noul (count 2, [true, false]): "Yes"/"No", "yes"/"no", "Y"/"N", "A"/"B", the first pair of single tokens.
 * Falls back to multi-token labels (see the module comment) when no scheme has enough single tokens.
 */
export function pickLabels(kind: LabelKind, count: number, tokenize: LabelTokenizer): LabelSet {
  if (!Number.isInteger(count) || count < 1) throw new NoUsableLabelsError(`cannot label ${count} answers`);
  if (kind === "noul") return pickNoul(tokenize);
  if (count > MAX_LABELS) throw new NoUsableLabelsError(`cannot label more than ${MAX_LABELS} answers, got ${count}`);

  if (kind === "levels" && count <= DIGITS.length) {
    const digits = DIGITS.slice(0, count);
    const tokens = digits.map((d) => tokenize(d));
    if (allSingleDistinct(tokens)) return { labels: digits, tokens: tokens.map((t) => [...(t as number[])]), singleToken: true };
  }

  const scheme = letterLabels(count);
  const labels: string[] = [];
  const tokens: number[][] = [];
  const used = new Set<number>();
  for (const label of scheme) {
    if (labels.length === count) break;
    const t = tokenize(label);
    if (t === null || t.length !== 1 || used.has(t[0] as number)) continue;
    used.add(t[0] as number);
    labels.push(label);
    tokens.push([t[0] as number]);
  }
  if (labels.length === count) return { labels, tokens, singleToken: true };

  return multiToken(scheme.slice(0, count), tokenize);
}

function pickNoul(tokenize: LabelTokenizer): LabelSet {
  for (const pair of NOUL_PAIRS) {
    const tokens = pair.map((l) => tokenize(l));
    if (allSingleDistinct(tokens)) return { labels: [...pair], tokens: tokens.map((t) => [...(t as number[])]), singleToken: true };
  }
  return multiToken([...(NOUL_PAIRS[0] as readonly [string, string])], tokenize);
}

function multiToken(labels: string[], tokenize: LabelTokenizer): LabelSet {
  const tokens: number[][] = [];
  for (const label of labels) {
    const t = tokenize(label);
    if (t === null || t.length === 0)
      throw new NoUsableLabelsError(`the label ${JSON.stringify(label)} cannot be tokenized after the prompt`);
    tokens.push([...t]);
  }
  if (!prefixFree(tokens)) throw new NoUsableLabelsError("the labels' token sequences are not prefix-free");
  return { labels, tokens, singleToken: false };
}

function allSingleDistinct(tokens: ReadonlyArray<readonly number[] | null>): boolean {
  const seen = new Set<number>();
  for (const t of tokens) {
    if (t === null || t.length !== 1 || seen.has(t[0] as number)) return false;
    seen.add(t[0] as number);
  }
  return true;
}

/** No sequence equals or starts another one (so the labels are disjoint events). */
export function prefixFree(sequences: ReadonlyArray<readonly number[]>): boolean {
  const sorted = [...sequences].sort(compareSequences);
  for (let i = 1; i < sorted.length; i++) {
    const a = sorted[i - 1] as readonly number[];
    const b = sorted[i] as readonly number[];
    if (a.length <= b.length && a.every((t, j) => b[j] === t)) return false;
  }
  return true;
}

function compareSequences(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    if (a[i] !== b[i]) return (a[i] as number) - (b[i] as number);
  }
  return a.length - b.length;
}
