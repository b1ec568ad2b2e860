/**
 * The bounded schema check (decision-bound.ts + compileBoundedSchema): on any body, it lists the same first field
 * errors as the full check and counts the same total, while the schema only ever sees a bounded number of fields.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import fc from "fast-check";
import { DecisionRequest } from "../../src/contract/decision.ts";
import { boundDecisionRequest } from "../../src/contract/decision-bound.ts";
import { compileBoundedSchema, compileSchema, MAX_FIELD_ERRORS, summarizeFieldErrors } from "../../src/contract/validation.ts";
import { applyMutation, clone, type Json, mutation, pathsOf, setOwn, trickyName, validRequest } from "../fuzz/support.ts";

const full = compileSchema(DecisionRequest);

function summaries(doc: unknown, keep: number) {
  const bounded = compileBoundedSchema(DecisionRequest, (body) => boundDecisionRequest(body, keep));
  const fullOk = full(doc);
  const boundedOk = bounded(doc);
  assert.equal(boundedOk, fullOk, "valid for one exactly when valid for the other");
  if (fullOk) return null;
  return {
    full: summarizeFieldErrors(full.errors!, keep),
    bounded: summarizeFieldErrors(bounded.errors!, keep),
    ajvErrors: bounded.errors!.length,
  };
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

/** Adds `count` fields (unknown ones, or options of a choice, or levels of a score) to an object or array of the body. */
const crowd = fc.record({
  at: fc.nat(),
  count: fc.integer({ min: 0, max: 300 }),
  name: fc.oneof(trickyName, fc.string({ maxLength: 6 })),
});

/** The places the schema walks: the top, each question, each criteria; then anywhere. */
function crowdedPaths(doc: unknown): string[][] {
  const paths: string[][] = [[]];
  const questions = isObject(doc) && Object.hasOwn(doc, "questions") ? doc.questions : undefined;
  if (isObject(questions))
    for (const id of Object.keys(questions)) {
      paths.push(["questions", id]);
      const q = questions[id];
      if (isObject(q) && Object.hasOwn(q, "criteria")) paths.push(["questions", id, "criteria"]);
    }
  return [...paths, ...pathsOf(doc)];
}

function applyCrowd(doc: unknown, c: { at: number; count: number; name: string }): unknown {
  const paths = crowdedPaths(doc);
  const path = paths[c.at % Math.min(paths.length, 12)]!;
  const target = path.reduce<unknown>((at, k) => (at as Record<string, unknown>)[k], doc);
  if (Array.isArray(target)) for (let i = 0; i < c.count; i++) target.push(i);
  else if (isObject(target)) for (let i = 0; i < c.count; i++) setOwn(target, `${c.name}${i}`, i);
  return doc;
}

/** Valid requests with mutations, among them crowds of fields; sent as JSON text would be parsed. */
const body = fc
  .tuple(
    validRequest,
    fc.array(fc.oneof({ weight: 1, arbitrary: mutation }, { weight: 3, arbitrary: crowd.map((c) => ({ crowd: c })) }), {
      minLength: 1,
      maxLength: 5,
    }),
  )
  .map(([doc, changes]) => {
    let out: unknown = doc;
    for (const change of changes) out = "crowd" in change ? applyCrowd(out, change.crowd) : applyMutation(out, change);
    return clone(out as Json);
  })
  .filter((doc) => !isObject(doc) || !isObject(doc.questions) || Object.keys(doc.questions).length <= 32);

describe("bounded schema check", () => {
  test("the same first errors and the same total as the full check, on generated bodies", () => {
    fc.assert(
      fc.property(body, fc.integer({ min: 1, max: 4 }), (doc, keep) => {
        const s = summaries(doc, keep);
        if (s === null) return;
        assert.deepEqual(s.bounded.errors, s.full.errors);
        assert.equal(s.bounded.total, s.full.total);
      }),
      { numRuns: 600 },
    );
  });

  test("thousands of unknown fields, options and levels: the schema sees a bounded number of them", () => {
    const many = (n: number, name = "k") => Object.fromEntries(Array.from({ length: n }, (_, i) => [`${name}${i}`, i]));
    const questions = Object.fromEntries(
      Array.from({ length: 32 }, (_, i) => [
        `q${i}`,
        [
          { type: "noul", criteria: { true: 1, ...many(3000, "c") }, ...many(3000) },
          { type: "choice", criteria: many(3000), ...many(3000) },
          { type: "score", criteria: Array.from({ length: 3000 }, () => 1), ...many(3000) },
        ][i % 3],
      ]),
    );
    const doc = JSON.parse(JSON.stringify({ ...many(3000, "top"), state: 1, questions })) as unknown;
    const s = summaries(doc, MAX_FIELD_ERRORS)!;
    assert.deepEqual(s.bounded.errors, s.full.errors);
    assert.equal(s.bounded.total, s.full.total);
    assert.equal(s.full.total, 3000 + 32 * 3000 + 11 * 3000 + 21);
    // 50 unknown fields kept per object (the top, 32 questions, 11 noul criteria), one error per criteria and levels.
    assert.ok(s.ajvErrors <= 50 * (1 + 32 + 11) + 3 * 32, `${s.ajvErrors} errors`);
  });

  test("a body that needs no cut is checked as it is; `__proto__` stays an ordinary field in a cut copy", () => {
    const doc = JSON.parse('{"state":1,"questions":{"q":{"type":"noul"}}}') as unknown;
    assert.equal(boundDecisionRequest(doc).body, doc);
    assert.equal(boundDecisionRequest(doc).omitted, 0);
    const text = `{"__proto__":{"x":1},${Array.from({ length: 60 }, (_, i) => `"k${i}":1`).join(",")},"state":1,"questions":{"q":{"type":"noul"}}}`;
    const cut = boundDecisionRequest(JSON.parse(text), 50);
    assert.equal(cut.omitted, 11);
    const fields = Object.keys(cut.body as object);
    assert.deepEqual(fields.slice(0, 3), ["state", "questions", "__proto__"]);
    assert.equal(fields.length, 2 + 50);
    assert.equal(Object.getPrototypeOf(cut.body), null);
  });
});
