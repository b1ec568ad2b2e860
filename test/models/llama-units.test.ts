import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { buildTestVocab, writeTestGguf } from "../../scripts/make-test-gguf.ts";
import type { Question } from "../../src/contract/decision.ts";
import { checkAnswers } from "../../src/gateway/answer-check.ts";
import { type LabelTokenizer, NoUsableLabelsError, pickLabels, prefixFree } from "../../src/models/llama/labels.ts";
import { Deadline, SlotPool } from "../../src/models/llama/pool.ts";
import { renderQuestionText, renderSystemText } from "../../src/models/llama/prompt.ts";
import { argmax, buildAnswer, peakConfidence, renormalise, restrictAndRenormalise } from "../../src/models/llama/scoring.ts";
import { expectKind } from "../fixtures/gguf/tiny-model.ts";

/**
 * A tokenizer over a fixed vocabulary: a listed label is one token; otherwise each character is its
 * listed token, or two byte-like tokens when it is not listed either.
 */
function fakeTokenizer(single: string[], unusable: string[] = []): LabelTokenizer {
  const ids = new Map(single.map((s, i) => [s, 1000 + i]));
  return (label) => {
    if (unusable.includes(label)) return null;
    const id = ids.get(label);
    if (id !== undefined) return [id];
    return Array.from(label).flatMap((c) => {
      const own = ids.get(c);
      return own !== undefined ? [own] : [c.charCodeAt(0), c.charCodeAt(0)];
    });
  };
}

const LETTERS = Array.from({ length: 26 }, (_, i) => String.fromCharCode(65 + i));

describe("labels", () => {
  test("single letters, skipping labels that are not one token", () => {
    const set = pickLabels("options", 3, fakeTokenizer(["A", "C", "D", "E"]));
    assert.deepEqual(set.labels, ["A", "C", "D"]);
    assert.deepEqual(set.tokens, [[1000], [1001], [1002]]);
    assert.equal(set.singleToken, true);
  });

  test("labels that would change the prompt's tokens are skipped", () => {
    const set = pickLabels("options", 2, fakeTokenizer(["A", "B", "C"], ["A"]));
    assert.deepEqual(set.labels, ["B", "C"]);
  });

  test("two letters from 27 options on; digits for up to 10 levels, letters beyond", () => {
    const two = Array.from({ length: 26 * 26 }, (_, i) => String.fromCharCode(65 + Math.floor(i / 26), 65 + (i % 26)));
    const tok = fakeTokenizer([...LETTERS, ...two, ..."0123456789"]);
    assert.equal(pickLabels("options", 27, tok).labels[26], "BA");
    assert.deepEqual(pickLabels("levels", 4, tok).labels, ["0", "1", "2", "3"]);
    assert.deepEqual(pickLabels("levels", 11, tok).labels.slice(0, 2), ["A", "B"]);
    assert.equal(pickLabels("options", 255, tok).singleToken, true);
  });

  test("noul: the first pair of single tokens", () => {
    assert.deepEqual(pickLabels("noul", 2, fakeTokenizer(["Yes", "No"])).labels, ["Yes", "No"]);
    assert.deepEqual(pickLabels("noul", 2, fakeTokenizer(["yes", "no", "Y", "N"])).labels, ["yes", "no"]);
    assert.deepEqual(pickLabels("noul", 2, fakeTokenizer(["Y", "N"])).labels, ["Y", "N"]);
  });

  test("falls back to prefix-free multi-token labels", () => {
    const set = pickLabels("options", 40, fakeTokenizer(LETTERS));
    assert.equal(set.singleToken, false);
    assert.equal(set.labels.length, 40);
    assert.deepEqual(set.labels.slice(0, 2), ["AA", "AB"]);
    assert.deepEqual(set.tokens[0], [1000, 1000]);
    assert.ok(prefixFree(set.tokens));
    const noul = pickLabels("noul", 2, fakeTokenizer([]));
    assert.deepEqual(noul.labels, ["Yes", "No"]);
    assert.equal(noul.singleToken, false);
  });

  test("no usable labels is an error", () => {
    assert.throws(() => pickLabels("options", 30, () => null), NoUsableLabelsError);
    assert.throws(() => pickLabels("options", 700, fakeTokenizer([])), NoUsableLabelsError);
  });

  test("prefix-free check", () => {
    assert.equal(prefixFree([[1], [2, 3], [2, 4]]), true);
    assert.equal(prefixFree([[1], [1, 2]]), false);
    assert.equal(
      prefixFree([
        [1, 2],
        [1, 2],
      ]),
      false,
    );
  });
});

describe("scoring", () => {
  test("renormalisation over the labels", () => {
    const dist = new Map([
      [1, 0.2],
      [2, 0.1],
      [3, 0.5],
    ]);
    const p = restrictAndRenormalise(dist, [1, 2]) as number[];
    assert.ok(Math.abs((p[0] as number) - 2 / 3) < 1e-15 && Math.abs((p[1] as number) - 1 / 3) < 1e-15);
    assert.deepEqual(restrictAndRenormalise(dist, [1, 99]), [1, 0]);
    assert.equal(renormalise([0, 0]), null);
    assert.throws(() => renormalise([Number.NaN, 1]), /invalid label probability/);
  });

  test("confidence = (max p − 1/k) / (1 − 1/k); 1 for one option; ties go to the first option", () => {
    assert.equal(peakConfidence([0.25, 0.25, 0.25, 0.25]), 0);
    assert.equal(peakConfidence([1, 0]), 1);
    assert.equal(peakConfidence([1]), 1);
    assert.ok(Math.abs(peakConfidence([0.5, 0.25, 0.25]) - 0.25) < 1e-15);
    assert.equal(argmax([0.4, 0.4, 0.2]), 0);
    assert.equal(argmax([0.1, 0.45, 0.45]), 1);
  });

  test("answers in the contract shape, keyed by the original names (even __proto__)", () => {
    const questions: Record<string, Question> = {
      c: { type: "choice", criteria: JSON.parse('{"__proto__": "odd name", "constructor": null, "b": 1}') as Record<string, unknown> },
      s: { type: "score", criteria: ["low", { detail: "mid" }, "high"] },
      n: { type: "noul" },
    };
    const answers = {
      c: buildAnswer(questions.c as Question, [0.2, 0.5, 0.3]),
      s: buildAnswer(questions.s as Question, [0.2, 0.3, 0.5]),
      n: buildAnswer(questions.n as Question, [0.7, 0.3]),
    };
    const checked = checkAnswers(questions, answers);
    assert.ok(checked.ok, checked.ok ? "" : checked.problem);
    assert.equal((answers.c as { choice: string }).choice, "constructor");
    assert.deepEqual(Object.keys((answers.c as { probabilities: object }).probabilities), ["__proto__", "constructor", "b"]);
    assert.ok(Math.abs((answers.s as { score: number }).score - 1.3) < 1e-12);
    assert.ok(Math.abs((answers.s as { confidence: number }).confidence - 0.25) < 1e-12);
    assert.deepEqual(
      (answers.s as { legend: object }).legend,
      Object.assign(Object.create(null), { 0: "low", 1: { detail: "mid" }, 2: "high" }),
    );
    assert.deepEqual(answers.n, { type: "noul", noul: 0.7 });
  });

  test("question texts list every option with its label and description", () => {
    const text = renderQuestionText({ type: "choice", instructions: { ask: "which?" }, criteria: { red: "warm", blue: null } }, ["A", "B"]);
    assert.equal(
      text,
      'Type: choice\nInstructions: {"ask":"which?"}\nOptions:\nA: red — warm\nB: blue\nReply with the label of one option.',
    );
    assert.equal(
      renderQuestionText({ type: "score", criteria: ["low", "high"] }, ["0", "1"]),
      "Type: score\nLevels, from the lowest (0) to the highest (1):\n0: low\n1: high\nReply with the label of one level.",
    );
    assert.match(renderQuestionText({ type: "score", criteria: ["low", "high"] }, ["A", "B"]), /\nA: level 0 — low\nB: level 1 — high\n/);
    assert.equal(
      renderQuestionText({ type: "noul", instructions: "Refund?", criteria: { true: "asks for money back" } }, ["Yes", "No"]),
      "Type: yes or no\nInstructions: Refund?\nYes means: asks for money back\nReply Yes or No.",
    );
  });
});

describe("pool and deadlines", () => {
  const deadlines: Deadline[] = [];
  /** A deadline disposed after the test (its timer would keep the process alive). */
  const deadline = (ms: number, signal?: AbortSignal) => {
    const d = new Deadline(ms, signal);
    deadlines.push(d);
    return d;
  };
  after(() => {
    for (const d of deadlines) d.dispose();
  });

  test("FIFO hand-over, overloaded when the queue is full, waiters leave on their deadline", async () => {
    const pool = new SlotPool(["slot"], 2);
    const long = () => deadline(60_000);
    const first = await pool.acquire(long());
    const order: string[] = [];
    const second = pool.acquire(long()).then((l) => {
      order.push("second");
      return l;
    });
    const quick = deadline(20);
    const third = pool.acquire(quick);
    await expectKind(pool.acquire(long()), "overloaded", /queue limit 2/);
    await expectKind(third, "timeout");
    assert.equal(pool.waiting, 1);
    const fourth = pool.acquire(long()).then((l) => {
      order.push("fourth");
      return l;
    });
    first.release();
    first.release(); // idempotent
    (await second).release();
    (await fourth).release();
    assert.deepEqual(order, ["second", "fourth"]);
    assert.equal(pool.busy, 0);
  });

  test("abort and close", async () => {
    const pool = new SlotPool([1], 4);
    const lease = await pool.acquire(deadline(60_000));
    const ac = new AbortController();
    const waiting = pool.acquire(deadline(60_000, ac.signal));
    ac.abort();
    await expectKind(waiting, "aborted");
    const pending = pool.acquire(deadline(60_000));
    const { ModelServiceError } = await import("../../src/models/model-service.ts");
    pool.close(new ModelServiceError("unavailable", "closed"));
    await expectKind(pending, "unavailable");
    await expectKind(pool.acquire(deadline(60_000)), "unavailable");
    lease.release();
  });
});

describe("test GGUF writer", () => {
  test("writes a deterministic GGUF v3 file; the few-labels vocabulary lacks two-letter tokens", () => {
    const dir = mkdtempSync(join(tmpdir(), "tds-gguf-unit-"));
    try {
      const a = writeTestGguf(join(dir, "a.gguf"));
      const b = writeTestGguf(join(dir, "b.gguf"));
      const c = writeTestGguf(join(dir, "c.gguf"), { seed: 2 });
      const bytes = readFileSync(a.path);
      assert.deepEqual(bytes, readFileSync(b.path));
      assert.notDeepEqual(bytes, readFileSync(c.path));
      assert.equal(bytes.subarray(0, 4).toString("latin1"), "GGUF");
      assert.equal(bytes.readUInt32LE(4), 3);
      assert.equal(bytes.length, a.bytes);
      assert.ok(bytes.includes(Buffer.from("tokenizer.chat_template")));
      const many = buildTestVocab();
      const few = buildTestVocab({ labels: "few" });
      assert.ok(many.tokens.includes("AB") && !few.tokens.includes("AB"));
      assert.ok(few.tokens.includes("▁yes") && few.tokens.includes("Yes") && few.tokens.includes("<0x0A>"));
      assert.equal(buildTestVocab({ vocabSize: 5000 }).tokens.length, 5000);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("the state in the prompt", () => {
  test("is the client's own JSON text when known, so every number is as written; a string state stays plain text", () => {
    const text = '{"n": 12345678901234567890, "x": 1e999999}';
    assert.ok(renderSystemText({ n: 12345678901234567000, x: Infinity }, text).endsWith(`State:\n${text}`));
    assert.ok(renderSystemText({ n: 1 }).endsWith('State:\n{"n":1}'));
    assert.ok(renderSystemText("plain words", '"plain words"').endsWith("State:\nplain words"));
  });
});
