import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { ErrorObject } from "ajv";
import fc from "fast-check";
import { ConfigFile } from "../../src/contract/config.ts";
import { DecisionRequest } from "../../src/contract/decision.ts";
import type { FieldError } from "../../src/contract/errors.ts";
import { compileSchema, MAX_FIELD_ERRORS, summarizeFieldErrors, toFieldErrors } from "../../src/contract/validation.ts";
import { applyMutation, mutation, validRequest } from "../fuzz/support.ts";

const validateRequest = compileSchema(DecisionRequest);
const validateConfig = compileSchema(ConfigFile);

function errorsOf(validate: typeof validateRequest, doc: unknown): ErrorObject[] {
  assert.equal(validate(doc), false, `expected ${JSON.stringify(doc).slice(0, 200)} to be invalid`);
  return [...validate.errors!];
}

/**
 * The former (quadratic) grouping, kept as the reference: for each type error under a failed anyOf, a filter over
 * every error; dedup by the rendered field and message. One error's own message is what the implementation
 * gives for that error alone.
 */
function reference(errors: readonly ErrorObject[]): FieldError[] {
  const describeOne = (e: ErrorObject) => toFieldErrors([e])[0] ?? null;
  const typeNames: Record<string, string> = {
    object: "an object",
    array: "an array",
    string: "a string",
    number: "a number",
    integer: "an integer",
    boolean: "a boolean",
    null: "null",
  };
  const anyOfPaths = new Map<string, ErrorObject>();
  for (const e of errors) if (e.keyword === "anyOf") anyOfPaths.set(e.instancePath, e);
  const out: FieldError[] = [];
  const seen = new Set<string>();
  const push = (fe: FieldError | null) => {
    if (!fe) return;
    const id = `${fe.field}\u0000${fe.message}`;
    if (!seen.has(id)) {
      seen.add(id);
      out.push(fe);
    }
  };
  for (const e of errors) {
    const owner = anyOfPaths.get(e.instancePath);
    if (owner && e !== owner && e.keyword === "type" && e.schemaPath.startsWith(owner.schemaPath)) {
      const siblings = errors.filter((x) => x.instancePath === e.instancePath && x.schemaPath.startsWith(owner.schemaPath) && x !== owner);
      if (siblings.every((x) => x.keyword === "type")) {
        const types = [...new Set(siblings.flatMap((x) => (Array.isArray(x.params.type) ? x.params.type : [x.params.type])))];
        const field =
          e.instancePath
            .slice(1)
            .split("/")
            .map((s) => s.replace(/~1/g, "/").replace(/~0/g, "~"))
            .join(".") || "(body)";
        push({ field, message: `must be ${types.map((t) => typeNames[String(t)] ?? String(t)).join(" or ")}` });
      }
      continue;
    }
    push(describeOne(e));
  }
  return out;
}

/** The same list without repeats of a rendered {field, message} (two different paths can render alike: "a.b"). */
function byText(errors: FieldError[]): FieldError[] {
  const seen = new Set<string>();
  return errors.filter((e) => {
    const id = `${e.field}\u0000${e.message}`;
    if (seen.has(id)) return false;
    seen.add(id);
    return true;
  });
}

const invalidRequest = fc
  .tuple(validRequest, fc.array(mutation, { minLength: 1, maxLength: 4 }))
  .map(([doc, ms]) => ms.reduce<unknown>((d, m) => applyMutation(d, m), doc))
  .filter((doc) => !validateRequest(doc));

describe("field errors", () => {
  test("match the former grouping on generated invalid requests, with an exact total", () => {
    fc.assert(
      fc.property(invalidRequest, (doc) => {
        const errors = errorsOf(validateRequest, doc);
        const all = summarizeFieldErrors(errors, Number.POSITIVE_INFINITY);
        assert.equal(all.total, all.errors.length);
        assert.deepEqual(byText(all.errors), reference(errors));
        const capped = summarizeFieldErrors(errors, 3);
        assert.deepEqual(capped.errors, all.errors.slice(0, 3));
        assert.equal(capped.total, all.total);
      }),
      { numRuns: 400 },
    );
  });

  test("match the former grouping on config files", () => {
    const files: unknown[] = [
      { port: "80", service_mode: "free", limits: { max_questions: 40, nope: 1 }, model_service: { url: "" }, extra: true },
      { models: [{ name: 1, context: { max_state: "x" } }, 5], pricing: { price_per_million_input_usd: "1.2345678" } },
      { aliases: { a: 1 }, models: [{ name: "m", engine: "llama" }], default_model: null },
    ];
    for (const file of files) {
      if (validateConfig(file)) continue;
      const errors = [...validateConfig.errors!];
      assert.deepEqual(byText(toFieldErrors(errors)), reference(errors));
    }
  });

  test("a body with thousands of problems: the first 50 listed, the exact total counted", () => {
    const questions = Object.fromEntries(
      Array.from({ length: 32 }, (_, i) => [
        `q${i}`,
        { type: "noul", criteria: { true: 1, ...Object.fromEntries(Array.from({ length: 200 }, (_, k) => [`k${k}`, k])) } },
      ]),
    );
    const doc = { state: 1, questions, model: 5, ...Object.fromEntries(Array.from({ length: 1000 }, (_, k) => [`extra${k}`, k])) };
    const errors = errorsOf(validateRequest, doc);
    const summary = summarizeFieldErrors(errors);
    // 1000 unknown top-level fields, model (one collapsed "must be a string or null"), 32 × 200 unknown criteria keys.
    assert.equal(summary.total, 1000 + 1 + 32 * 200);
    assert.equal(summary.errors.length, MAX_FIELD_ERRORS);
    assert.deepEqual(summary.errors, toFieldErrors(errors).slice(0, MAX_FIELD_ERRORS));
    assert.equal(toFieldErrors(errors).length, summary.total);
    assert.deepEqual(summary.errors[0], { field: "extra0", message: "is not a field of the contract (unknown fields are rejected)" });
  });

  test("a nullable field's type mismatches collapse into one message; its deeper problems stay", () => {
    const wrong = summarizeFieldErrors(
      errorsOf(validateRequest, { state: 1, questions: { n: { type: "noul", criteria: "yes" } }, model: 7 }),
    );
    assert.deepEqual(wrong.errors, [
      { field: "questions.n.criteria", message: "must be null or an object" },
      { field: "model", message: "must be a string or null" },
    ]);
    assert.equal(wrong.total, 2);
    const deeper = summarizeFieldErrors(
      errorsOf(validateRequest, { state: 1, questions: { n: { type: "noul", criteria: { true: 1, maybe: 2, perhaps: 3 } } } }),
    );
    assert.deepEqual(
      deeper.errors.map((e) => e.field),
      ["questions.n.criteria.maybe", "questions.n.criteria.perhaps"],
    );
    assert.equal(deeper.total, 2);
  });

  test("the same problem reported by two schema locations is one problem", () => {
    const e = (schemaPath: string, additionalProperty: string): ErrorObject => ({
      instancePath: "/x",
      schemaPath,
      keyword: "additionalProperties",
      params: { additionalProperty },
      message: "must NOT have additional properties",
    });
    const summary = summarizeFieldErrors([e("#/a", "k1"), e("#/a", "k2"), e("#/b", "k1"), e("#/b", "k3")]);
    assert.deepEqual(
      summary.errors.map((f) => f.field),
      ["x.k1", "x.k2", "x.k3"],
    );
    assert.equal(summary.total, 3);
  });

  test("a long type tag or question id is quoted short and counted in code points", () => {
    const tag = summarizeFieldErrors(errorsOf(validateRequest, { state: 1, questions: { q: { type: "x".repeat(100_000) } } }));
    assert.equal(tag.errors.length, 1);
    assert.ok(tag.errors[0]!.message.length < 200, tag.errors[0]!.message.slice(0, 300));
    const id = "🙂".repeat(101);
    const long = summarizeFieldErrors(errorsOf(validateRequest, { state: 1, questions: { [id]: { type: "noul" } } }));
    assert.deepEqual(long.errors, [{ field: `questions.${id}`, message: "id must be 1 to 100 characters long (it has 101)" }]);
  });

  test("messages are built only for the listed problems", () => {
    let paramReads = 0;
    const errors: ErrorObject[] = Array.from({ length: 10_000 }, (_, i) => ({
      instancePath: "",
      schemaPath: "#/additionalProperties",
      keyword: "additionalProperties",
      get params() {
        paramReads++;
        return { additionalProperty: `k${i}` };
      },
      message: "must NOT have additional properties",
    }));
    const summary = summarizeFieldErrors(errors);
    assert.equal(summary.total, 10_000);
    assert.equal(summary.errors.length, MAX_FIELD_ERRORS);
    assert.ok(paramReads <= 2 * MAX_FIELD_ERRORS, `params read ${paramReads} times`);
  });

  test("26,000 failing questions are summarized in work linear in their number (the former grouping was quadratic)", () => {
    const failing = (n: number) =>
      errorsOf(validateRequest, {
        state: 1,
        questions: Object.fromEntries(Array.from({ length: n }, (_, i) => [`q${i}`, { type: "noul", criteria: 1 }])),
      });
    // The work is counted, not timed (a busy machine changes durations, not counts): every read of an error's fields.
    const counted = (errors: ErrorObject[]) => {
      let reads = 0;
      const watched = errors.map(
        (e) =>
          new Proxy(e, {
            get(target, key, receiver) {
              reads++;
              return Reflect.get(target, key, receiver);
            },
          }),
      );
      return { watched, reads: () => reads };
    };
    const small = counted(failing(2_600));
    const large = counted(failing(26_000));
    summarizeFieldErrors(small.watched);
    const summary = summarizeFieldErrors(large.watched);
    // maxProperties (32) on questions, then one collapsed "must be null or an object" per question.
    assert.equal(summary.total, 1 + 26_000);
    assert.equal(summary.errors.length, MAX_FIELD_ERRORS);
    // Linear work reads ~10 times as much for 10 times the errors; a grouping that compares errors pairwise, ~100.
    const ratio = large.reads() / small.reads();
    assert.ok(ratio < 12, `10 times the errors took ${ratio.toFixed(1)} times the reads (${small.reads()} → ${large.reads()})`);
    assert.ok(large.reads() / large.watched.length < 40, `${(large.reads() / large.watched.length).toFixed(1)} reads per error`);
  });
});
