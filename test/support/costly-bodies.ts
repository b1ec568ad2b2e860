/**
 * Bodies just under max_request_bytes (1 MiB) shaped to make the gateway work: thousands of unknown fields or
 * options where the schema would walk them, huge strings, deep nesting. Each comes with the answer it must get, so
 * that test/http/costly-bodies.test.ts (what is answered) and bench/costly-bodies.ts (how fast, and /healthz
 * meanwhile) send the same bodies.
 */
import type { FieldError } from "../../src/contract/errors.ts";

export const MAX_REQUEST_BYTES = 1_048_576;
/** "Just under" the limit: room for a little slack, never over it. */
const TARGET_BYTES = MAX_REQUEST_BYTES - 2_048;

type Json = unknown;
const many = (n: number, f: (i: number) => [string, Json]) => Object.fromEntries(Array.from({ length: n }, (_, i) => f(i)));
const questions = (n: number, q: (i: number) => Json) => many(n, (i) => [`q${i}`, q(i)]);
const unknownKeys = (n: number, name: (i: number) => string = (i) => `k${i}`) => many(n, (i) => [name(i), 1]);
const nest = (depth: number) => `${"[".repeat(depth)}${"]".repeat(depth)}`;
const UNKNOWN = "is not a field of the contract (unknown fields are rejected)";

/** What a body must be answered with. */
export interface Expected {
  status: 200 | 422;
  /** For a 422 with field errors: the first one listed. */
  first?: FieldError;
  /** For a 422 with field errors: how many problems there are in all (the detail says so); the list stops at 50. */
  total?: number;
  /** For a 422 without field errors: the detail. */
  detail?: RegExp;
}

export interface CostlyShape {
  name: string;
  /** The body for a size n; bodies grow with n. */
  make(n: number): string;
  /** The answer for the n that fit. */
  expect(n: number): Expected;
}

export const COSTLY_SHAPES: CostlyShape[] = [
  {
    name: "32 choice questions, thousands of options each",
    make: (n) => JSON.stringify({ state: 1, questions: questions(32, () => ({ type: "choice", criteria: unknownKeys(n) })) }),
    expect: () => ({ status: 422, first: { field: "questions.q0.criteria", message: "must have at most 255 options" }, total: 32 }),
  },
  {
    name: "32 noul questions, thousands of unknown keys in criteria",
    make: (n) => JSON.stringify({ state: 1, questions: questions(32, () => ({ type: "noul", criteria: { true: 1, ...unknownKeys(n) } })) }),
    expect: (n) => ({ status: 422, first: { field: "questions.q0.criteria.k0", message: UNKNOWN }, total: 32 * n }),
  },
  {
    name: "32 score questions, thousands of levels each",
    make: (n) =>
      JSON.stringify({ state: 1, questions: questions(32, () => ({ type: "score", criteria: Array.from({ length: n }, () => 0) })) }),
    expect: () => ({ status: 422, first: { field: "questions.q0.criteria", message: "must have at most 255 levels" }, total: 32 }),
  },
  {
    name: "32 questions, thousands of unknown fields each",
    make: (n) =>
      JSON.stringify({ state: 1, questions: questions(32, (q) => ({ type: ["choice", "score", "noul"][q % 3], ...unknownKeys(n) })) }),
    // A choice or score question without criteria: "is required" comes first, then its unknown fields.
    expect: (n) => ({ status: 422, first: { field: "questions.q0.criteria", message: "is required" }, total: 32 * n + 22 }),
  },
  {
    name: "tens of thousands of unknown top-level fields",
    make: (n) => JSON.stringify({ state: 1, questions: { q: { type: "noul" } }, ...unknownKeys(n) }),
    expect: (n) => ({ status: 422, first: { field: "k0", message: UNKNOWN }, total: n }),
  },
  {
    name: "unknown fields at every level at once",
    make: (n) =>
      JSON.stringify({
        ...unknownKeys(n, (i) => `top${i}`),
        state: 1,
        questions: questions(32, () => ({ type: "noul", criteria: unknownKeys(n, (i) => `c${i}`), ...unknownKeys(n, (i) => `f${i}`) })),
      }),
    expect: (n) => ({ status: 422, first: { field: "top0", message: UNKNOWN }, total: n + 64 * n }),
  },
  {
    name: "unknown fields with long names and ~ / in them",
    make: (n) =>
      JSON.stringify({
        state: 1,
        questions: questions(32, () => ({ type: "noul", ...unknownKeys(n, (i) => `~/${"x".repeat(500)}${i}`) })),
      }),
    expect: (n) => ({ status: 422, first: { field: `questions.q0.~/${"x".repeat(500)}0`, message: UNKNOWN }, total: 32 * n }),
  },
  {
    name: "tens of thousands of questions (over max_questions)",
    make: (n) => JSON.stringify({ state: 1, questions: questions(n, () => ({ type: "noul", criteria: 1 })) }),
    expect: (n) => ({
      status: 422,
      first: { field: "questions", message: `must have at most 32 questions (max_questions); got ${n}` },
      total: 1,
    }),
  },
  {
    name: "32 questions with a bad type tag and thousands of fields",
    make: (n) => JSON.stringify({ state: 1, questions: questions(32, () => ({ type: "yesno", ...unknownKeys(n) })) }),
    expect: () => ({
      status: 422,
      first: { field: "questions.q0.type", message: 'must be one of "choice", "score", "noul" (got "yesno")' },
      total: 32,
    }),
  },
  {
    name: "255 options with huge labels in 32 questions, a bad model",
    make: (n) =>
      JSON.stringify({
        state: 1,
        model: 5,
        questions: questions(32, (q) => ({
          type: "choice",
          criteria: many(255, (i) => [`${"option ".repeat(n)}${q}.${i}`, "d".repeat(n)]),
        })),
      }),
    expect: () => ({ status: 422, first: { field: "model", message: "must be a string or null" }, total: 1 }),
  },
  {
    name: "state of many arrays nested to the 256-level limit, a bad model",
    // The body object and the state array are two levels: 254 more reach the limit of 256 exactly.
    make: (n) => `{"state":[${Array.from({ length: n }, () => nest(254)).join(",")}],"model":5,"questions":{"q":{"type":"noul"}}}`,
    expect: () => ({ status: 422, first: { field: "model", message: "must be a string or null" }, total: 1 }),
  },
  {
    name: "state nested ~500,000 deep",
    make: (n) => `{"state":${nest(n)},"questions":{"q":{"type":"noul"}}}`,
    expect: () => ({ status: 422, detail: /deeper than 256 levels/ }),
  },
  {
    name: "a question id of ~1 MiB",
    make: (n) => JSON.stringify({ state: 1, questions: { ["x".repeat(n)]: { type: "noul" } } }),
    expect: (n) => ({
      status: 422,
      first: { field: `questions.${"x".repeat(n)}`, message: `id must be 1 to 100 characters long (it has ${n})` },
      total: 1,
    }),
  },
];

/** Bodies that pass validation, costly to parse and forward: the bench measures them too (they reach the model). */
export const COSTLY_VALID_SHAPES: CostlyShape[] = [
  {
    name: "255 options with huge labels in 32 questions",
    make: (n) =>
      JSON.stringify({
        state: 1,
        questions: questions(32, (q) => ({
          type: "choice",
          criteria: many(255, (i) => [`${"option ".repeat(n)}${q}.${i}`, "d".repeat(n)]),
        })),
      }),
    expect: () => ({ status: 200 }),
  },
  {
    name: "state of many arrays nested to the 256-level limit",
    make: (n) => `{"state":[${Array.from({ length: n }, () => nest(254)).join(",")}],"questions":{"q":{"type":"noul"}}}`,
    expect: () => ({ status: 200 }),
  },
  {
    name: "state: one object with very many keys",
    make: (n) => JSON.stringify({ state: many(n, (i) => [`k${i}`, i]), questions: { q: { type: "noul" } } }),
    expect: () => ({ status: 200 }),
  },
];

/** The body of a shape for the largest n whose body fits just under max_request_bytes, and that n. */
export function fitBody(shape: CostlyShape): { body: string; n: number } {
  let lo = 1;
  let hi = 2;
  while (hi < 1 << 24 && Buffer.byteLength(shape.make(hi)) <= TARGET_BYTES) hi *= 2;
  while (lo < hi - 1) {
    const mid = Math.floor((lo + hi) / 2);
    if (Buffer.byteLength(shape.make(mid)) <= TARGET_BYTES) lo = mid;
    else hi = mid;
  }
  return { body: shape.make(lo), n: lo };
}
