import { type Answer, type ChoiceAnswer, CONTRACT_LIMITS, type NoulAnswer, type Question, type ScoreAnswer } from "../contract/decision.ts";

/**
 * Checks a model service's (unchecked) answers against the request's questions and rebuilds them
 * with exactly the contract's fields.
 *
 * Invariant of a successful result: the keys of `answers` are exactly the request's question ids
 * (in question order); every probability map has exactly the supplied options (choice) or levels
 * "0" … "n-1" (score), in that order, each a finite number in [0, 1], summing to 1 within 1e-6.
 *
 * Extra fields sent by the upstream are dropped silently. Ids and option names in the result (the
 * answers map, `probabilities`, `legend`) are own keys, `__proto__` included (ownKey), as JSON.parse
 * makes them; the maps are ordinary objects, which V8 keeps with fast properties (a null-prototype
 * object is a slow dictionary, slower to build and to print).
 *
 * Floating-point noise of at most 1e-9 outside a range (e.g. a confidence of -1e-17 computed for a
 * uniform distribution) is accepted and clamped into the range; anything further out is rejected.
 */
export type AnswerCheckResult = { ok: true; answers: Record<string, Answer> } | { ok: false; problem: string };

/** Allowed deviation of the probability sum from 1. */
export const PROBABILITY_SUM_TOLERANCE = 1e-6;
/** Allowed floating-point noise outside [0, 1] (or [0, n-1] for a score) before a value is rejected. */
export const RANGE_NOISE = 1e-9;

const MAX_NAME_IN_PROBLEM = 80;

export function checkAnswers(questions: Record<string, Question>, raw: unknown): AnswerCheckResult {
  if (!isPlainObject(raw)) {
    return fail(`answers must be an object of question id to answer, got ${describe(raw)}`);
  }

  const ids = Object.keys(questions);
  for (const id of ids) {
    if (!Object.hasOwn(raw, id)) return fail(`answer for question ${quote(id)} is missing`);
  }
  for (const key of Object.keys(raw)) {
    if (!Object.hasOwn(questions, key)) return fail(`answers contain ${quote(key)}, which is not a question of the request`);
  }

  const answers: Record<string, Answer> = {};
  for (const id of ids) {
    const question = questions[id] as Question;
    const checked = checkOne(id, question, raw[id]);
    if (typeof checked === "string") return fail(checked);
    ownKey(answers, id, checked);
  }
  return { ok: true, answers };
}

function checkOne(id: string, question: Question, answer: unknown): Answer | string {
  if (!isPlainObject(answer)) return `${what(id)} must be an object, got ${describe(answer)}`;
  if (answer.type !== question.type) {
    return `${what(id)} has type ${typeof answer.type === "string" ? quote(answer.type) : describe(answer.type)}, expected "${question.type}"`;
  }

  switch (question.type) {
    case "choice": {
      const options = Object.keys(question.criteria);
      const probabilities = checkDistribution(id, answer.probabilities, options, "option");
      if (typeof probabilities === "string") return probabilities;
      const choice = answer.choice;
      if (typeof choice !== "string") return `${what(id)} has a choice that is ${describe(choice)}, not an option name`;
      if (!Object.hasOwn(question.criteria, choice)) return `${what(id)} chose ${quote(choice)}, which is not one of the supplied options`;
      const confidence = checkUnit(answer.confidence);
      if (confidence === undefined) return `${what(id)} has confidence ${describe(answer.confidence)}, not a number in [0, 1]`;
      const out: ChoiceAnswer = { type: "choice", choice, probabilities, confidence };
      return out;
    }
    case "score": {
      const n = question.criteria.length;
      const probabilities = checkDistribution(id, answer.probabilities, levelNames(n), "level");
      if (typeof probabilities === "string") return probabilities;
      const score = checkRange(answer.score, n - 1);
      if (score === undefined) return `${what(id)} has score ${describe(answer.score)}, not a number in [0, ${n - 1}]`;
      const confidence = checkUnit(answer.confidence);
      if (confidence === undefined) return `${what(id)} has confidence ${describe(answer.confidence)}, not a number in [0, 1]`;
      const legend: Record<string, unknown> = {};
      const names = levelNames(n);
      for (let i = 0; i < n; i++) legend[names[i] as string] = question.criteria[i];
      const out: ScoreAnswer = { type: "score", score, probabilities, confidence, legend };
      return out;
    }
    case "noul": {
      const noul = checkUnit(answer.noul);
      if (noul === undefined) return `${what(id)} has noul ${describe(answer.noul)}, not a number in [0, 1]`;
      const out: NoulAnswer = { type: "noul", noul };
      return out;
    }
    default: {
      const unknownType: never = question;
      return `question ${quote(id)} has an unknown type ${describe((unknownType as { type?: unknown }).type)}`;
    }
  }
}

/** Checks a probability map keyed exactly by `keys`; returns it rebuilt in `keys` order, or a problem. */
function checkDistribution(id: string, value: unknown, keys: readonly string[], noun: "option" | "level"): Record<string, number> | string {
  if (!isPlainObject(value)) return `${what(id)} has probabilities that are ${describe(value)}, not an object`;

  for (const key of keys) {
    if (!Object.hasOwn(value, key)) return `${what(id)} has no probability for ${noun} ${quote(key)}`;
  }
  const present = Object.keys(value);
  if (present.length !== keys.length) {
    const expected = new Set(keys);
    const stray = present.find((k) => !expected.has(k));
    return `${what(id)} has a probability for ${quote(stray ?? "?")}, which is not a supplied ${noun}`;
  }

  const out: Record<string, number> = {};
  let sum = 0;
  for (const key of keys) {
    const p = value[key];
    const checked = checkUnit(p);
    if (checked === undefined) return `${what(id)} has probability ${describe(p)} for ${noun} ${quote(key)}, not a number in [0, 1]`;
    sum += p as number;
    ownKey(out, key, checked);
  }
  if (!(Math.abs(sum - 1) <= PROBABILITY_SUM_TOLERANCE)) {
    return `${what(id)} has probabilities that sum to ${formatNumber(sum)}, not 1`;
  }
  return out;
}

/** Sets `key` as an own enumerable property; `__proto__` too, which an assignment would take as the prototype. */
function ownKey<T>(target: Record<string, T>, key: string, value: T): void {
  if (key === "__proto__") Object.defineProperty(target, key, { value, enumerable: true, writable: true, configurable: true });
  else target[key] = value;
}

/** "0" … "n-1", the level names of a score with n levels, kept for the n the contract allows. */
const LEVEL_NAMES: Array<readonly string[]> = [];
function levelNames(n: number): readonly string[] {
  let names = LEVEL_NAMES[n];
  if (names === undefined) {
    names = Object.freeze(Array.from({ length: n }, (_, i) => String(i)));
    if (n <= CONTRACT_LIMITS.maxScoreLevels) LEVEL_NAMES[n] = names;
  }
  return names;
}

/** How a problem names the answer (built only when a problem is reported: a success quotes nothing). */
function what(id: string): string {
  return `answer for question ${quote(id)}`;
}

function checkUnit(value: unknown): number | undefined {
  return checkRange(value, 1);
}

/** A finite number in [0, max] (with RANGE_NOISE of slack, clamped), else undefined. */
function checkRange(value: unknown, max: number): number | undefined {
  if (typeof value !== "number" || !Number.isFinite(value)) return undefined;
  const slack = RANGE_NOISE * Math.max(1, max);
  if (value < -slack || value > max + slack) return undefined;
  if (value < 0) return 0;
  if (value > max) return max;
  return value;
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  if (typeof value !== "object" || value === null || Array.isArray(value)) return false;
  const proto: unknown = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

function fail(problem: string): { ok: false; problem: string } {
  return { ok: false, problem };
}

/** A name quoted as JSON (escapes control characters), shortened when long. */
function quote(name: string): string {
  const chars = Array.from(name);
  const short = chars.length > MAX_NAME_IN_PROBLEM ? `${chars.slice(0, MAX_NAME_IN_PROBLEM).join("")}…` : name;
  return JSON.stringify(short);
}

function describe(value: unknown): string {
  if (value === undefined) return "missing";
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  switch (typeof value) {
    case "number":
      return Number.isFinite(value) ? formatNumber(value) : String(value);
    case "string":
      return `the string ${quote(value)}`;
    case "boolean":
      return String(value);
    case "object":
      return "an object";
    default:
      return `a ${typeof value}`;
  }
}

function formatNumber(n: number): string {
  return String(Number(n.toPrecision(12)));
}
