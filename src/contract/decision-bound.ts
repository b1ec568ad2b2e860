import { CONTRACT_LIMITS } from "./decision.ts";
import { MAX_FIELD_ERRORS } from "./validation.ts";

/** A body cut down to what the schema needs to see, and how many problems the cut-away parts held. */
export interface BoundedBody {
  body: unknown;
  /** Problems the schema would have reported in what was left out (unknown fields, each one problem). */
  omitted: number;
}

const REQUEST_FIELDS: ReadonlySet<string> = new Set(["state", "questions", "model"]);
const QUESTION_FIELDS: ReadonlySet<string> = new Set(["type", "instructions", "criteria"]);
const NOUL_CRITERIA_FIELDS: ReadonlySet<string> = new Set(["true", "false"]);
const QUESTION_TYPES: ReadonlySet<unknown> = new Set(["choice", "score", "noul"]);

type JsonObject = Record<string, unknown>;

function isObject(value: unknown): value is JsonObject {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

/**
 * The object with its known fields and only its first `keep` unknown ones, and how many unknown ones were left out;
 * the object itself when nothing is left out. The kept unknown fields keep their order, so the schema reports them as
 * it would have (where the known fields stand among them changes no report).
 */
function withFewUnknown(object: JsonObject, known: ReadonlySet<string>, keep: number): { object: JsonObject; left: number } {
  // The keys are listed once: listing 100,000 keys (V8 sorts them) costs more than all the rest of the check.
  const keys = Object.keys(object);
  let unknown = keys.length;
  for (const key of known) if (Object.hasOwn(object, key)) unknown--;
  if (unknown <= keep) return { object, left: 0 };
  // A null prototype: "__proto__" stays an ordinary field, as JSON.parse made it.
  const copy: JsonObject = Object.create(null);
  for (const key of known) if (Object.hasOwn(object, key)) copy[key] = object[key];
  for (let i = 0, kept = 0; kept < keep; i++) {
    const key = keys[i]!;
    if (known.has(key)) continue;
    copy[key] = object[key];
    kept++;
  }
  return { object: copy, left: unknown - keep };
}

/** The object's first `count` entries when it has more (the schema reports "at most N" alike for N + 1 and for more). */
function atMost(object: JsonObject, count: number): JsonObject {
  const keys = Object.keys(object);
  if (keys.length <= count) return object;
  const copy: JsonObject = Object.create(null);
  for (let i = 0; i < count; i++) copy[keys[i]!] = object[keys[i]!];
  return copy;
}

/** One question, bounded; the question itself when it needs no cut. */
function boundQuestion(question: unknown, keep: number): { question: unknown; left: number } {
  // A question without a valid tag gets one error for its tag; the schema looks at nothing else in it.
  if (!isObject(question) || !QUESTION_TYPES.has(question.type)) return { question, left: 0 };
  const cut = withFewUnknown(question, QUESTION_FIELDS, keep);
  let left = cut.left;
  let criteria = question.criteria;
  if (question.type === "noul" && isObject(criteria)) {
    const inner = withFewUnknown(criteria, NOUL_CRITERIA_FIELDS, keep);
    criteria = inner.object;
    left += inner.left;
  } else if (question.type === "choice" && isObject(criteria)) {
    criteria = atMost(criteria, CONTRACT_LIMITS.maxChoiceOptions + 1);
  } else if (question.type === "score" && Array.isArray(criteria) && criteria.length > CONTRACT_LIMITS.maxScoreLevels + 1) {
    criteria = criteria.slice(0, CONTRACT_LIMITS.maxScoreLevels + 1);
  }
  if (cut.object === question && criteria === question.criteria) return { question, left };
  const copy: JsonObject = cut.object === question ? Object.assign(Object.create(null), question) : cut.object;
  if (criteria !== question.criteria) copy.criteria = criteria;
  return { question: copy, left };
}

/**
 * A decision request cut down, before the schema checks it, to a size the schema walks in bounded time: at most
 * `keepUnknown` unknown fields per object (the top level, each question, each noul criteria), at most 256 options or levels
 * per question. Everything cut away is counted, so that validating the result gives the same first `keepUnknown` field
 * errors as validating the whole body, and `omitted` added to its count gives the exact total.
 *
 * Linear in the body's keys (each object the schema would walk is looked at once). More questions than the contract's
 * 32 are refused before this (max_questions); should a body still have more, only the first 33 are checked and
 * problems of the others are not counted.
 */
export function boundDecisionRequest(body: unknown, keepUnknown: number = MAX_FIELD_ERRORS): BoundedBody {
  if (!isObject(body)) return { body, omitted: 0 };
  // At least one unknown field is kept where there were some, so that a cut body is invalid whenever the body is.
  const keep = Math.max(1, keepUnknown);
  const top = withFewUnknown(body, REQUEST_FIELDS, keep);
  let omitted = top.left;
  const questions = body.questions;
  if (!Object.hasOwn(body, "questions") || !isObject(questions)) return { body: top.object, omitted };
  const few = atMost(questions, CONTRACT_LIMITS.maxQuestions + 1);
  let bounded: JsonObject | null = few === questions ? null : few;
  for (const id in few) {
    const cut = boundQuestion(few[id], keep);
    omitted += cut.left;
    if (cut.question === few[id]) continue;
    bounded ??= Object.assign(Object.create(null), questions) as JsonObject;
    bounded[id] = cut.question;
  }
  if (bounded === null && top.object === body) return { body, omitted };
  const copy: JsonObject = top.object === body ? Object.assign(Object.create(null), body) : top.object;
  if (bounded !== null) copy.questions = bounded;
  return { body: copy, omitted };
}
