import assert from "node:assert/strict";
import { describe, test } from "node:test";
import fc from "fast-check";
import type { Answer, Question } from "../../src/contract/decision.ts";
import { checkAnswers } from "../../src/gateway/answer-check.ts";

/** Round-trips through JSON: what a model service would send, and what a client would see. */
function json<T = unknown>(value: unknown): T {
  return JSON.parse(JSON.stringify(value)) as T;
}

const questions: Record<string, Question> = {
  pick: { type: "choice", instructions: "Pick one", criteria: { red: "warm", green: null, blue: { hex: "#00f" } } },
  rate: { type: "score", criteria: ["bad", "ok", "good"] },
  yes: { type: "noul", criteria: { true: "yes", false: "no" } },
};

function validRaw(): Record<string, Record<string, unknown>> {
  return {
    pick: { type: "choice", choice: "green", probabilities: { red: 0.2, green: 0.5, blue: 0.3 }, confidence: 0.25 },
    rate: {
      type: "score",
      score: 1.2,
      probabilities: { "0": 0.2, "1": 0.4, "2": 0.4 },
      confidence: 0.1,
      legend: { "0": "bad", "1": "ok", "2": "good" },
    },
    yes: { type: "noul", noul: 0.7 },
  };
}

function expectProblem(raw: unknown, ...fragments: string[]): string {
  const result = checkAnswers(questions, raw);
  assert.equal(result.ok, false, `expected a problem containing ${fragments.join(", ")}`);
  if (result.ok) throw new Error("unreachable");
  for (const f of fragments)
    assert.ok(result.problem.includes(f), `problem ${JSON.stringify(result.problem)} should include ${JSON.stringify(f)}`);
  return result.problem;
}

describe("checkAnswers: valid answers", () => {
  test("pass and are rebuilt with exactly the contract's fields", () => {
    const raw = validRaw();
    (raw.pick as Record<string, unknown>).reasoning = "because";
    (raw.rate as Record<string, unknown>).legend = { "0": "tampered" };
    (raw.rate as Record<string, unknown>).extra = [1, 2];
    (raw.yes as Record<string, unknown>).confidence = 0.9;
    const result = checkAnswers(questions, json(raw));
    assert.ok(result.ok);
    assert.deepEqual(json(result.answers), {
      pick: { type: "choice", choice: "green", probabilities: { red: 0.2, green: 0.5, blue: 0.3 }, confidence: 0.25 },
      rate: {
        type: "score",
        score: 1.2,
        probabilities: { "0": 0.2, "1": 0.4, "2": 0.4 },
        confidence: 0.1,
        legend: { "0": "bad", "1": "ok", "2": "good" },
      },
      yes: { type: "noul", noul: 0.7 },
    });
  });

  test("probabilities come back in the order of the question's options, answers in question order", () => {
    const raw = validRaw();
    raw.pick!.probabilities = { blue: 0.3, green: 0.5, red: 0.2 };
    const reordered = { yes: raw.yes, rate: raw.rate, pick: raw.pick };
    const result = checkAnswers(questions, json(reordered));
    assert.ok(result.ok);
    assert.deepEqual(Object.keys(result.answers), ["pick", "rate", "yes"]);
    const pick = result.answers.pick;
    assert.ok(pick?.type === "choice");
    assert.deepEqual(Object.keys(pick.probabilities), ["red", "green", "blue"]);
  });

  test("legend is built from the request's criteria even when upstream sent none", () => {
    const raw = validRaw();
    delete raw.rate!.legend;
    const result = checkAnswers(questions, json(raw));
    assert.ok(result.ok);
    assert.deepEqual(json(result.answers.rate), json({ ...validRaw().rate }));
  });

  test("probability sums within 1e-6 pass; floating noise outside [0, 1] is clamped", () => {
    const raw = validRaw();
    raw.pick!.probabilities = { red: 0.2, green: 0.5, blue: 0.3 + 5e-7 };
    raw.pick!.confidence = -1e-17;
    raw.rate!.confidence = 1 + 1e-12;
    raw.rate!.score = 2 + 1e-12;
    const result = checkAnswers(questions, json(raw));
    assert.ok(result.ok);
    const pick = result.answers.pick;
    const rate = result.answers.rate;
    assert.ok(pick?.type === "choice" && rate?.type === "score");
    assert.equal(pick.confidence, 0);
    assert.equal(rate.confidence, 1);
    assert.equal(rate.score, 2);
  });

  test("the result does not share the upstream's objects", () => {
    const raw = json<Record<string, Record<string, unknown>>>(validRaw());
    const result = checkAnswers(questions, raw);
    assert.ok(result.ok);
    (raw.pick!.probabilities as Record<string, number>).red = 99;
    const pick = result.answers.pick;
    assert.ok(pick?.type === "choice");
    assert.equal(pick.probabilities.red, 0.2);
  });

  test("single-option choice and single-level score", () => {
    const qs: Record<string, Question> = {
      c: { type: "choice", criteria: { only: 1 } },
      s: { type: "score", criteria: ["only"] },
      n: { type: "noul" },
    };
    const raw = {
      c: { type: "choice", choice: "only", probabilities: { only: 1 }, confidence: 1 },
      s: { type: "score", score: 0, probabilities: { "0": 1 }, confidence: 1 },
      n: { type: "noul", noul: 0 },
    };
    const result = checkAnswers(qs, raw);
    assert.ok(result.ok);
    assert.deepEqual(json(result.answers.s), {
      type: "score",
      score: 0,
      probabilities: { "0": 1 },
      confidence: 1,
      legend: { "0": "only" },
    });
  });
});

describe("checkAnswers: broken shapes are rejected with a problem naming the question", () => {
  test("answers that are not a plain object", () => {
    for (const raw of [null, undefined, "answers", 42, [], [validRaw().pick], new Map()]) {
      expectProblem(raw, "answers must be an object");
    }
    // A prototype carrying the answers does not count as having them.
    expectProblem(Object.create(validRaw()), "answers must be an object");
  });

  test("missing and unexpected ids", () => {
    const raw = validRaw();
    delete raw.rate;
    expectProblem(raw, '"rate"', "missing");
    expectProblem({ ...validRaw(), other: { type: "noul", noul: 0.5 } }, '"other"', "not a question");
    expectProblem({}, '"pick"', "missing");
  });

  test("an answer that is not an object, or of the wrong type", () => {
    expectProblem({ ...validRaw(), yes: 0.7 }, 'question "yes"', "must be an object");
    expectProblem({ ...validRaw(), yes: null }, 'question "yes"', "must be an object");
    expectProblem({ ...validRaw(), pick: { type: "noul", noul: 0.5 } }, 'question "pick"', 'type "noul"', 'expected "choice"');
    expectProblem({ ...validRaw(), rate: { ...validRaw().rate, type: undefined } }, 'question "rate"', "type missing");
  });

  test("choice: probabilities, choice and confidence", () => {
    const bad = (pick: Record<string, unknown>, ...fragments: string[]) =>
      expectProblem({ ...validRaw(), pick: { ...validRaw().pick, ...pick } }, 'question "pick"', ...fragments);
    bad({ probabilities: undefined }, "probabilities that are missing");
    bad({ probabilities: [0.2, 0.5, 0.3] }, "not an object");
    bad({ probabilities: { red: 0.5, green: 0.5 } }, 'no probability for option "blue"');
    bad({ probabilities: { red: 0.2, green: 0.5, blue: 0.3, purple: 0 } }, '"purple"', "not a supplied option");
    bad({ probabilities: { red: 0.2, green: 0.5, teal: 0.3 } }, 'option "blue"');
    bad({ probabilities: { red: 0.4, green: 0.5, blue: 0.4 } }, "sum to 1.3, not 1");
    bad({ probabilities: { red: -0.2, green: 0.9, blue: 0.3 } }, "probability -0.2", 'option "red"');
    bad({ probabilities: { red: 1.2, green: -0.5, blue: 0.3 } }, "probability 1.2");
    bad({ probabilities: { red: "0.2", green: 0.5, blue: 0.3 } }, 'the string "0.2"');
    bad({ probabilities: { red: Number.NaN, green: 0.5, blue: 0.5 } }, "NaN");
    bad({ probabilities: { red: 0.2, green: 0.5, blue: 0.3 + 2e-6 } }, "sum to 1.000002");
    bad({ choice: "purple" }, '"purple"', "not one of the supplied options");
    bad({ choice: "toString" }, '"toString"', "not one of the supplied options");
    bad({ choice: 1 }, "choice that is 1");
    bad({ choice: undefined }, "choice that is missing");
    bad({ confidence: 1.5 }, "confidence 1.5");
    bad({ confidence: undefined }, "confidence missing");
    bad({ confidence: Number.POSITIVE_INFINITY }, "confidence Infinity");
  });

  test("score: levels, score range and confidence", () => {
    const bad = (rate: Record<string, unknown>, ...fragments: string[]) =>
      expectProblem({ ...validRaw(), rate: { ...validRaw().rate, ...rate } }, 'question "rate"', ...fragments);
    bad({ probabilities: { "0": 0.5, "1": 0.5 } }, 'no probability for level "2"');
    bad({ probabilities: { "0": 0.5, "1": 0.25, "2": 0.25, "3": 0 } }, '"3"', "not a supplied level");
    bad({ probabilities: { "1": 0.5, "2": 0.25, "3": 0.25 } }, 'level "0"');
    bad({ probabilities: { "0": 0.5, "1": 0.5, "2": 0.5 } }, "sum to 1.5");
    bad({ score: 2.5 }, "score 2.5", "[0, 2]");
    bad({ score: 3 }, "score 3");
    bad({ score: -0.1 }, "score -0.1");
    bad({ score: "1" }, 'score the string "1"');
    bad({ score: undefined }, "score missing");
    bad({ confidence: -0.5 }, "confidence -0.5");
  });

  test("noul", () => {
    expectProblem({ ...validRaw(), yes: { type: "noul", noul: 1.3 } }, 'question "yes"', "noul 1.3");
    expectProblem({ ...validRaw(), yes: { type: "noul", noul: -0.25 } }, 'question "yes"', "noul -0.25");
    expectProblem({ ...validRaw(), yes: { type: "noul" } }, 'question "yes"', "noul missing");
    expectProblem({ ...validRaw(), yes: { type: "noul", noul: true } }, 'question "yes"', "noul true");
  });

  test("long and odd names are quoted and shortened in problems", () => {
    const long = "x".repeat(5000);
    const problem = expectProblem({ ...validRaw(), [long]: {} }, "not a question");
    assert.ok(problem.length < 300, problem);
    const control = expectProblem({ ...validRaw(), "evil\nline": {} }, '"evil\\nline"');
    assert.ok(!control.includes("\n"));
  });
});

describe("checkAnswers: awkward ids and option names", () => {
  const odd: Record<string, Question> = json(
    Object.fromEntries([
      ["__proto__", { type: "choice", criteria: JSON.parse('{"__proto__": "p", "constructor": "c", "a.b": "d", "ünï 🎲": "u"}') }],
      ["constructor", { type: "noul" }],
      ["a.b", { type: "score", criteria: ["zero", "one"] }],
      ["题目 🎲", { type: "choice", criteria: { toString: 1, hasOwnProperty: 2 } }],
      ["0", { type: "noul" }],
    ]),
  );
  // Object.fromEntries defines "__proto__" as an own property; JSON round-trips it.
  assert.ok(Object.hasOwn(odd, "__proto__"));

  const raw = JSON.parse(
    JSON.stringify({
      "0": { type: "noul", noul: 0.5 },
      constructor: { type: "noul", noul: 0.1 },
      "a.b": { type: "score", score: 0.5, probabilities: { "0": 0.5, "1": 0.5 }, confidence: 0 },
      "题目 🎲": { type: "choice", choice: "hasOwnProperty", probabilities: { toString: 0.25, hasOwnProperty: 0.75 }, confidence: 0.5 },
    }).replace(
      /^\{/,
      '{"__proto__": {"type": "choice", "choice": "__proto__", "probabilities": {"a.b": 0.1, "__proto__": 0.4, "constructor": 0.3, "ünï 🎲": 0.2}, "confidence": 0.2},',
    ),
  ) as unknown;

  test("pass and survive JSON.stringify", () => {
    const result = checkAnswers(odd, raw);
    assert.ok(result.ok, result.ok ? "" : result.problem);
    assert.deepEqual(Object.keys(result.answers).sort(), Object.keys(odd).sort());
    const printed = JSON.parse(JSON.stringify(result.answers)) as Record<string, Record<string, unknown>>;
    assert.ok(Object.hasOwn(printed, "__proto__"));
    const proto = printed.__proto__ as Record<string, unknown>;
    assert.equal(proto.choice, "__proto__");
    assert.deepEqual(Object.keys(proto.probabilities as object), ["__proto__", "constructor", "a.b", "ünï 🎲"]);
    // Own keys, not prototypes: the answers map and its probabilities keep Object.prototype.
    assert.equal(Object.getPrototypeOf(result.answers), Object.prototype);
    assert.ok(Object.hasOwn(result.answers, "__proto__"));
    const protoAnswer = result.answers.__proto__ as { probabilities: Record<string, number> };
    assert.equal(Object.getPrototypeOf(protoAnswer.probabilities), Object.prototype);
    assert.equal(Object.getOwnPropertyDescriptor(protoAnswer.probabilities, "__proto__")?.value, 0.4);
    assert.deepEqual(printed["a.b"]!.legend, { "0": "zero", "1": "one" });
  });

  test("an inherited __proto__ or constructor is not an answer", () => {
    const withoutProto = JSON.parse(JSON.stringify(raw)) as Record<string, unknown>;
    const copy: Record<string, unknown> = {};
    for (const key of Object.keys(withoutProto))
      if (key !== "__proto__") Object.defineProperty(copy, key, { value: withoutProto[key], enumerable: true });
    expectProblemFor(odd, copy, 'answer for question "__proto__" is missing');
    const noCtor = Object.fromEntries(Object.entries(withoutProto).filter(([k]) => k !== "constructor"));
    expectProblemFor(odd, noCtor, 'answer for question "constructor" is missing');
  });

  test("option names that exist only on Object.prototype are not options", () => {
    const qs: Record<string, Question> = { q: { type: "choice", criteria: { a: 1, b: 2 } } };
    const r = checkAnswers(qs, { q: { type: "choice", choice: "constructor", probabilities: { a: 0.5, b: 0.5 }, confidence: 0 } });
    assert.ok(!r.ok && r.problem.includes('"constructor"'));
    const r2 = checkAnswers(qs, { q: { type: "choice", choice: "a", probabilities: { a: 0.5, b: 0.25, __proto__: 0.25 }, confidence: 0 } });
    // An object literal's __proto__ sets the prototype (0.25 is ignored), so the map is plain { a, b }, summing to 0.75.
    assert.ok(!r2.ok && r2.problem.includes("sum to 0.75"), r2.ok ? "" : r2.problem);
  });
});

function expectProblemFor(qs: Record<string, Question>, raw: unknown, fragment: string): void {
  const result = checkAnswers(qs, raw);
  assert.ok(!result.ok, "expected a problem");
  assert.ok(result.problem.includes(fragment), result.problem);
}

describe("checkAnswers: property", () => {
  const SPECIAL = ["__proto__", "constructor", "toString", "a.b", "0", "10", "ünï 🎲", "hasOwnProperty"];
  const idArb = fc.oneof(fc.string({ minLength: 1, maxLength: 100 }), fc.constantFrom(...SPECIAL));
  const optionArb = fc.oneof(fc.string({ maxLength: 30 }), fc.constantFrom(...SPECIAL));
  const criteriaItem = fc.oneof(fc.string(), fc.integer(), fc.constant(null), fc.dictionary(fc.string(), fc.string(), { maxKeys: 2 }));

  const questionArb: fc.Arbitrary<Question> = fc.oneof(
    fc.uniqueArray(optionArb, { minLength: 1, maxLength: 12 }).chain((options) =>
      fc.array(criteriaItem, { minLength: options.length, maxLength: options.length }).map((descs): Question => {
        const criteria = Object.create(null) as Record<string, unknown>;
        for (const [i, o] of options.entries()) criteria[o] = descs[i];
        return json({ type: "choice", criteria });
      }),
    ),
    fc.array(criteriaItem, { minLength: 1, maxLength: 20 }).map((criteria): Question => json({ type: "score", criteria })),
    fc.constant<Question>({ type: "noul" }),
  );

  const questionsArb = fc.uniqueArray(idArb, { minLength: 1, maxLength: 8 }).chain((ids) =>
    fc.array(questionArb, { minLength: ids.length, maxLength: ids.length }).map((qs) => {
      const out = Object.create(null) as Record<string, Question>;
      for (const [i, id] of ids.entries()) out[id] = qs[i] as Question;
      return json<Record<string, Question>>(out);
    }),
  );

  /** k probabilities summing to 1 from random weights. */
  const distribution = (k: number) =>
    fc.array(fc.double({ min: 0, max: 1, noNaN: true }), { minLength: k, maxLength: k }).map((ws) => {
      const weights = ws.map((w) => w + 1e-6);
      const total = weights.reduce((a, b) => a + b, 0);
      return weights.map((w) => w / total);
    });

  function answerArb(q: Question): fc.Arbitrary<unknown> {
    if (q.type === "noul") return fc.double({ min: 0, max: 1, noNaN: true }).map((noul) => ({ type: "noul", noul }));
    const keys = q.type === "choice" ? Object.keys(q.criteria) : q.criteria.map((_, i) => String(i));
    return fc
      .tuple(distribution(keys.length), fc.nat({ max: keys.length - 1 }), fc.double({ min: 0, max: 1, noNaN: true }))
      .map(([ps, pick, confidence]) => {
        const probabilities = Object.create(null) as Record<string, number>;
        for (const [i, k] of keys.entries()) probabilities[k] = ps[i] as number;
        if (q.type === "choice") return { type: "choice", choice: keys[pick], probabilities, confidence, extra: "dropped" };
        const score = Math.min(
          keys.length - 1,
          ps.reduce((s, p, i) => s + i * p, 0),
        );
        return { type: "score", score, probabilities, confidence };
      });
  }

  test("random questions with random valid distributions pass; keys equal the question ids", () => {
    fc.assert(
      fc.property(
        questionsArb.chain((qs) => {
          const ids = Object.keys(qs);
          return fc.tuple(fc.constant(qs), fc.tuple(...ids.map((id) => answerArb(qs[id] as Question))));
        }),
        ([qs, answerList]) => {
          const ids = Object.keys(qs);
          const raw = Object.create(null) as Record<string, unknown>;
          for (const [i, id] of ids.entries()) raw[id] = answerList[i];
          const result = checkAnswers(qs, json(raw));
          if (!result.ok) throw new Error(result.problem);
          assert.deepEqual(Object.keys(result.answers), ids);
          for (const id of ids) {
            const a: Answer = result.answers[id]!;
            const q = qs[id]!;
            assert.equal(a.type, q.type);
            if (a.type !== "noul") {
              const expected = q.type === "choice" ? Object.keys(q.criteria) : (q.criteria as unknown[]).map((_, i) => String(i));
              assert.deepEqual(Object.keys(a.probabilities), expected);
              assert.ok(!("extra" in a));
            }
          }
          // Checking the (printed) result again is a fixed point.
          const again = checkAnswers(qs, json(result.answers));
          assert.ok(again.ok);
          assert.deepEqual(json(again.answers), json(result.answers));
        },
      ),
      { numRuns: 300 },
    );
  });
});
