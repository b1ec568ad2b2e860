import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import type { Question } from "../../src/contract/decision.ts";
import {
  ANSWER_RESERVE_TOKENS,
  type ContextLimits,
  commonPrefixLength,
  contextLimits,
  labelKindOf,
  labelPrefixes,
  type PromptPiece,
  planCall,
  planTokenBound,
  QUESTION_RESERVE_TOKENS,
  type RenderPrompt,
} from "../../src/models/llama/evaluation-plan.ts";
import type { LabelTokenizer } from "../../src/models/llama/labels.ts";
import { renderQuestionText, renderSystemText } from "../../src/models/llama/prompt.ts";
import { type ModelCall, type ModelErrorKind, ModelServiceError } from "../../src/models/model-service.ts";

/**
 * The planner without a model: a fake chat template `<s>[SYS]system[USR]user[ASST]` whose markup is one
 * token each (1 … 4) and whose text is one token per character (its code), so every expected token array
 * can be written down.
 */
const BOS = 1;
const SYS = 2;
const USR = 3;
const ASST = 4;
const codes = (text: string): number[] => Array.from(text, (c) => c.codePointAt(0) as number);
const promptTokens = (system: string, user: string): number[] => [BOS, SYS, ...codes(system), USR, ...codes(user), ASST];
/** Each character its own token: one-letter labels are one token, longer ones several. */
const perCharacter: LabelTokenizer = (label) => codes(label);

interface FakePromptOptions {
  /** The labels' tokens at the answer position of prompts that end like the probes (default: per character). */
  labels?: LabelTokenizer;
  /** The last-piece key of a prompt (default: the same for every prompt, as the closing markup is). */
  tailKey?: (user: string) => string;
  /** The labels' tokens after a given user message (default: `labels`). */
  labelsAfter?: (user: string) => LabelTokenizer;
}

interface FakePrompts {
  render: RenderPrompt<number>;
  /** The user messages rendered, in order. */
  rendered: string[];
  /** The user messages whose label tokenizer was asked for. */
  labelTokenizerOf: string[];
}

function fakePrompts(options: FakePromptOptions = {}): FakePrompts {
  const labels = options.labels ?? perCharacter;
  const rendered: string[] = [];
  const labelTokenizerOf: string[] = [];
  const render = (system: string, user: string): PromptPiece<number> => {
    rendered.push(user);
    return {
      tokens: () => promptTokens(system, user),
      tailKey: () => options.tailKey?.(user) ?? "special:[ASST]",
      labelTokenizer: () => {
        labelTokenizerOf.push(user);
        return options.labelsAfter?.(user) ?? labels;
      },
    };
  };
  return { render, rendered, labelTokenizerOf };
}

/** Asserts that `plan` throws a ModelServiceError of this kind, with a message matching `pattern`. */
function throwsKind(plan: () => unknown, kind: ModelErrorKind, pattern: RegExp): void {
  assert.throws(plan, (err: unknown) => {
    assert.ok(err instanceof ModelServiceError, `expected a ModelServiceError, got ${String(err)}`);
    assert.equal(err.kind, kind, `kind of "${err.message}"`);
    assert.match(err.message, pattern);
    return true;
  });
}

const roomy: ContextLimits = { maxState: 100_000, maxBranch: 100_000 };

const topic: Question = { type: "choice", criteria: { billing: "money", bug: "defects", other: null } };
const urgency: Question = { type: "score", criteria: ["low", "medium", "high", "critical"] };
const refund: Question = { type: "noul", criteria: { true: "refund asked", false: "no refund" } };

function call(
  questions: Record<string, Question>,
  state: unknown = { ticket: "my card was charged twice" },
  text?: ModelCall["text"],
): ModelCall {
  return { model: "fake", state, questions, ...(text ? { text } : {}) };
}

describe("evaluation plan (no model)", () => {
  test("the state part is the probes' common prefix; each question's prompt starts with it and ends at the answer position", () => {
    const c = call({ topic, urgency, refund });
    const prompts = fakePrompts();
    const plan = planCall(c, roomy, prompts.render);
    const system = renderSystemText(c.state);
    assert.deepEqual(plan.stateTokens, [BOS, SYS, ...codes(system), USR]);
    assert.deepEqual(prompts.rendered.slice(0, 2), ["A", "B"], "two probes that differ only in the user message, first");
    assert.deepEqual(
      plan.questions.map((q) => q.id),
      ["topic", "urgency", "refund"],
    );
    for (const q of plan.questions) {
      assert.equal(q.text, renderQuestionText(q.question, q.labels));
      assert.deepEqual(q.tokens, promptTokens(system, q.text));
      assert.deepEqual(q.tokens.slice(0, plan.stateTokens.length), plan.stateTokens);
    }
  });

  test("the state's own JSON text, when the call has it, is what the state part holds", () => {
    const exact = '{"n":123456789012345678901234567890}';
    const plan = planCall(call({ refund }, { n: 1.2345678901234568e29 }, { state: exact, questions: "{}" }), roomy, fakePrompts().render);
    assert.deepEqual(plan.stateTokens, [BOS, SYS, ...codes(renderSystemText(null, exact)), USR]);
    assert.ok(renderSystemText(null, exact).endsWith(exact));
  });

  test("labels: letters for options, digits for levels, the first single-token noul pair; their tokens at the answer position", () => {
    const plan = planCall(call({ topic, urgency, refund }), roomy, fakePrompts().render);
    const [t, u, r] = plan.questions;
    assert.deepEqual([t?.labels, t?.labelTokens, t?.singleToken], [["A", "B", "C"], [[65], [66], [67]], true]);
    assert.deepEqual([u?.labels, u?.labelTokens, u?.singleToken], [["0", "1", "2", "3"], [[48], [49], [50], [51]], true]);
    // "Yes"/"No" and "yes"/"no" are several tokens here: "Y"/"N" is the first pair of single tokens.
    assert.deepEqual([r?.labels, r?.labelTokens, r?.singleToken], [["Y", "N"], [[89], [78]], true]);
  });

  test("labels are picked once per kind and count, at the probe; prompts that end like the probe reuse their tokens", () => {
    let asked = 0;
    const counting: LabelTokenizer = (label) => {
      asked++;
      return perCharacter(label);
    };
    const prompts = fakePrompts({ labels: counting });
    const plan = planCall(call({ a: topic, b: topic, c: { type: "choice", criteria: { x: 1, y: 2 } } }), roomy, prompts.render);
    assert.deepEqual(prompts.labelTokenizerOf, ["A"], "only the probe's label tokenizer");
    assert.equal(asked, 3 + 2, "three labels for the 3-option questions (once for both), two for the 2-option one");
    const [a, b] = plan.questions;
    assert.deepEqual(a?.labelTokens, b?.labelTokens);
    assert.notEqual(a?.labelTokens, b?.labelTokens, "each question gets its own arrays");
  });

  test("a prompt that ends in another last piece checks the labels at its own answer position", () => {
    const odd: Question = { type: "choice", criteria: { x: 1, y: 2 }, instructions: "odd-one" };
    const tailKey = (user: string) => (user.includes("odd-one") ? "text:odd" : "special:[ASST]");
    // The same single tokens there: planned with them.
    const same = fakePrompts({ tailKey });
    const plan = planCall(call({ odd }), roomy, same.render);
    assert.equal(same.labelTokenizerOf.length, 2, "the probe's and the odd question's");
    assert.deepEqual(plan.questions[0]?.labelTokens, [[65], [66]]);
    // Other tokens there: the call cannot be answered faithfully.
    const other = fakePrompts({
      tailKey,
      labelsAfter: (user) => (user.includes("odd-one") ? (label) => [label === "A" ? 65 : 99] : perCharacter),
    });
    throwsKind(
      () => planCall(call({ odd }), roomy, other.render),
      "invalid_response",
      /^question "odd": the label "B" does not tokenize the same after this question$/,
    );
    // A label that cannot be used there at all.
    const unusable = fakePrompts({ tailKey, labelsAfter: (user) => (user.includes("odd-one") ? () => null : perCharacter) });
    throwsKind(
      () => planCall(call({ odd }), roomy, unusable.render),
      "invalid_response",
      /^question "odd": the label "A" does not tokenize the same/,
    );
  });

  test("a vocabulary without single-token labels: prefix-free multi-token labels, and the prefixes to evaluate", () => {
    // Every label is a marker token then its characters: none is a single token.
    const marked: LabelTokenizer = (label) => [7, ...codes(label)];
    const plan = planCall(call({ topic, refund }), roomy, fakePrompts({ labels: marked }).render);
    const [t, r] = plan.questions;
    assert.deepEqual(
      [t?.labels, t?.labelTokens, t?.singleToken],
      [
        ["A", "B", "C"],
        [
          [7, 65],
          [7, 66],
          [7, 67],
        ],
        false,
      ],
    );
    assert.deepEqual(
      [r?.labels, r?.labelTokens, r?.singleToken],
      [
        ["Yes", "No"],
        [
          [7, 89, 101, 115],
          [7, 78, 111],
        ],
        false,
      ],
    );
    assert.deepEqual(labelPrefixes(t?.labelTokens ?? []), [[7]]);
    assert.deepEqual(labelPrefixes(r?.labelTokens ?? []), [[7], [7, 78], [7, 89], [7, 89, 101]]);
  });

  test("labelPrefixes: distinct proper prefixes, ordered by their comma-joined ids as strings", () => {
    assert.deepEqual(
      labelPrefixes([
        [10, 2, 3],
        [9, 1],
        [10, 2, 4],
      ]),
      [[10], [10, 2], [9]],
    );
    assert.deepEqual(labelPrefixes([[5], [6]]), [], "single tokens have no proper prefix");
  });

  test("an over-long state is context_rejected before anything else is looked at", () => {
    const c = call({ topic }, "x".repeat(50));
    const stateLength = planCall(c, roomy, fakePrompts().render).stateTokens.length;
    const noLabels = fakePrompts({ labels: () => null });
    throwsKind(
      () => planCall(c, { maxState: stateLength - 1, maxBranch: 100_000 }, noLabels.render),
      "context_rejected",
      new RegExp(`^state is ${stateLength} tokens; the model's max_state is ${stateLength - 1}$`),
    );
    assert.deepEqual(noLabels.labelTokenizerOf, [], "no label was looked at");
    assert.equal(
      planCall(c, { maxState: stateLength, maxBranch: 100_000 }, fakePrompts().render).stateTokens.length,
      stateLength,
      "at the limit: accepted",
    );
  });

  test("a question whose prompt is longer than max_branch is context_rejected, naming it; at the limit it is accepted", () => {
    const long: Question = { type: "noul", instructions: "y".repeat(200) };
    const lengths = planCall(call({ topic, long }), roomy, fakePrompts().render).questions.map((q) => q.tokens.length);
    const [short, longest] = lengths as [number, number];
    assert.ok(longest > short);
    throwsKind(
      () => planCall(call({ topic, long }), { maxState: 100_000, maxBranch: longest - 1 }, fakePrompts().render),
      "context_rejected",
      new RegExp(`^question "long": the state plus the question is ${longest} tokens; the model's max_branch is ${longest - 1}$`),
    );
    assert.equal(planCall(call({ topic, long }), { maxState: 100_000, maxBranch: longest }, fakePrompts().render).questions.length, 2);
  });

  test("labels the vocabulary cannot offer, or too long to answer within the reserve, are invalid_response", () => {
    throwsKind(
      () => planCall(call({ topic }), roomy, fakePrompts({ labels: () => null }).render),
      "invalid_response",
      /^question "topic": this model's vocabulary has no usable labels \(/,
    );
    const longest = ANSWER_RESERVE_TOKENS + 2;
    const padded: LabelTokenizer = (label) => [...Array.from({ length: longest - 1 }, () => 7), ...codes(label)];
    throwsKind(
      () => planCall(call({ topic }), roomy, fakePrompts({ labels: padded }).render),
      "invalid_response",
      new RegExp(`^question "topic": labels of ${longest} tokens are too long$`),
    );
    const fits: LabelTokenizer = (label) => [...Array.from({ length: ANSWER_RESERVE_TOKENS }, () => 7), ...codes(label)];
    assert.equal(
      planCall(call({ topic }), roomy, fakePrompts({ labels: fits }).render).questions[0]?.labelTokens[0]?.length,
      ANSWER_RESERVE_TOKENS + 1,
    );
  });

  test("the token bound: the state once plus each question's own tokens in; one token per question out, every label token for multi-token labels", () => {
    const single = planCall(call({ topic, refund }), roomy, fakePrompts().render);
    const state = single.stateTokens.length;
    const own = single.questions.map((q) => q.tokens.length - state);
    assert.deepEqual(planTokenBound(single), { input: state + (own[0] ?? 0) + (own[1] ?? 0), output: 2 });

    const multi = planCall(call({ topic, refund }), roomy, fakePrompts({ labels: (label) => [7, ...codes(label)] }).render);
    // topic: 1 + (2 + 2 + 2); refund ("Yes"/"No"): 1 + (4 + 3).
    assert.equal(planTokenBound(multi).output, 7 + 8);
    assert.deepEqual(planTokenBound({ stateTokens: [1, 2, 3], questions: [] }), { input: 3, output: 0 });
  });

  test("context limits: the reserves below the context size; configured limits only lower them", () => {
    assert.deepEqual(contextLimits(4096), {
      maxBranch: 4096 - ANSWER_RESERVE_TOKENS,
      maxState: 4096 - ANSWER_RESERVE_TOKENS - QUESTION_RESERVE_TOKENS,
    });
    assert.deepEqual(contextLimits(4096, { maxState: 1000, maxBranch: 2000 }), { maxState: 1000, maxBranch: 2000 });
    assert.deepEqual(contextLimits(4096, { maxBranch: 500 }), { maxBranch: 500, maxState: 500 - QUESTION_RESERVE_TOKENS });
    assert.deepEqual(contextLimits(4096, { maxState: 9999, maxBranch: 9999 }), contextLimits(4096));
    assert.ok(contextLimits(64).maxState < 1, "a context this small leaves no room for a state");
  });

  test("label kinds and common prefixes", () => {
    assert.deepEqual(labelKindOf(topic), ["options", 3]);
    assert.deepEqual(labelKindOf(urgency), ["levels", 4]);
    assert.deepEqual(labelKindOf(refund), ["noul", 2]);
    assert.equal(commonPrefixLength([1, 2, 3], [1, 2, 4, 5]), 2);
    assert.equal(commonPrefixLength([], [1]), 0);
    assert.equal(commonPrefixLength([1, 2], [1, 2]), 2);
  });

  test("the planner is pure: nothing it imports, however indirectly, loads node-llama-cpp or does I/O", () => {
    const root = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
    const seen = new Set<string>();
    const packages = new Set<string>();
    const visit = (file: string) => {
      if (seen.has(file)) return;
      seen.add(file);
      const text = readFileSync(file, "utf8");
      for (const m of text.matchAll(/^(import|export)\s+(type\s+)?[^;]*?from\s+["']([^"']+)["']/gm)) {
        const spec = m[3] as string;
        if (m[2]) continue; // erased at run time
        if (spec.startsWith(".")) visit(join(dirname(file), spec));
        else packages.add(spec);
      }
    };
    visit(join(root, "src/models/llama/evaluation-plan.ts"));
    assert.ok(seen.has(join(root, "src/models/llama/labels.ts")), "the walk follows relative imports");
    assert.deepEqual(
      [...packages].filter(
        (p) => p === "node-llama-cpp" || p.startsWith("node:fs") || p.startsWith("node:net") || p.startsWith("node:http"),
      ),
      [],
    );
  });
});
