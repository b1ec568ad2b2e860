/**
 * The check of a batch submission: every line as POST /v1/systemone checks a body, errors naming their line
 * (bounded), custom_id unique, max_batch_requests, and nothing accepted once a line is invalid.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { describe, test } from "node:test";
import { ndjsonLines } from "../../src/batches/ndjson-lines.ts";
import { type AcceptedLine, checkSubmission, type SubmissionCheckOptions } from "../../src/batches/submission-check.ts";
import { MAX_FIELD_ERRORS } from "../../src/contract/validation.ts";
import type { PipelineDeps } from "../../src/gateway/decision-pipeline.ts";
import { DecisionPipeline } from "../../src/gateway/decision-pipeline.ts";

/** The real max_questions check, with max_questions = 3. */
const pipeline = new DecisionPipeline({ config: { limits: { maxQuestions: 3 } } } as unknown as PipelineDeps);

const LIMITS = { maxLineBytes: 64 * 1024, maxTotalBytes: 16 * 1024 * 1024 };

const request = (customId: string, extra: Record<string, unknown> = {}) =>
  JSON.stringify({ custom_id: customId, state: { n: customId }, questions: { q: { type: "noul" } }, ...extra });

async function* chunksOf(text: string | Buffer, size = 7): AsyncGenerator<Buffer> {
  const bytes = typeof text === "string" ? Buffer.from(text, "utf8") : text;
  for (let i = 0; i < bytes.length; i += size) yield bytes.subarray(i, i + size);
}

async function check(text: string | Buffer, options: Partial<SubmissionCheckOptions> = {}) {
  const accepted: AcceptedLine[] = [];
  const result = await checkSubmission(ndjsonLines(chunksOf(text), LIMITS), {
    maxRequests: 1000,
    checkQuestionCount: (body) => pipeline.checkQuestionCount(body),
    ...options,
    accept: async (line) => {
      accepted.push(line);
      await options.accept?.(line);
    },
  });
  assert.equal(result.accepted, accepted.length);
  return { ...result, lines: accepted };
}

describe("batch submission check", () => {
  test("valid lines are accepted in order, with their line, custom_id, text and request; bytes and SHA-256 of the input", async () => {
    const text = `${request("a")}\n\n${request("b", { model: "fake-small" })}\r\n${request("c", { model: null })}`;
    const result = await check(text);
    assert.deepEqual(result.errors, []);
    assert.equal(result.moreErrors, 0);
    assert.deepEqual(
      result.lines.map(({ position, line, customId }) => ({ position, line, customId })),
      [
        { position: 0, line: 1, customId: "a" },
        { position: 1, line: 3, customId: "b" },
        { position: 2, line: 4, customId: "c" },
      ],
    );
    assert.equal(result.lines[1]!.text, request("b", { model: "fake-small" }));
    assert.deepEqual(result.lines[1]!.request, JSON.parse(request("b", { model: "fake-small" })));
    assert.equal(result.bytes, Buffer.byteLength(text));
    assert.equal(result.sha256, createHash("sha256").update(text).digest("hex"));
  });

  test("accept is awaited before the next line is read", async () => {
    const order: string[] = [];
    await check(`${request("a")}\n${request("b")}\n`, {
      accept: async (line) => {
        order.push(`start ${line.customId}`);
        await new Promise((r) => setTimeout(r, 5));
        order.push(`end ${line.customId}`);
      },
    });
    assert.deepEqual(order, ["start a", "end a", "start b", "end b"]);
  });

  test("an invalid line among valid ones: its error names the line and the field, nothing is accepted from it on", async () => {
    const bad = JSON.stringify({ custom_id: "bad", state: 1, questions: { q: { type: "maybe" } } });
    const result = await check([request("a"), request("b"), "", bad, request("c"), request("d")].join("\n"));
    assert.deepEqual(
      result.lines.map((l) => l.customId),
      ["a", "b"],
    );
    assert.deepEqual(result.errors, [
      { field: "line 4: questions.q.type", message: 'must be one of "choice", "score", "noul" (got "maybe")' },
    ]);
    assert.equal(result.moreErrors, 0);
  });

  test("errors are reported on every line, not only the first invalid one", async () => {
    const result = await check(
      [
        request("a", { state: undefined }),
        request("b"),
        JSON.stringify({ custom_id: "", state: 1, questions: {} }),
        JSON.stringify({ custom_id: "x".repeat(65), state: 1, questions: { q: { type: "score", criteria: [] } } }),
        JSON.stringify({ state: 1, questions: { q: { type: "noul" } } }),
        "[1, 2]",
      ].join("\n"),
    );
    assert.deepEqual(result.errors, [
      { field: "line 1: state", message: "is required" },
      { field: "line 3: custom_id", message: "must be at least 1 characters long" },
      { field: "line 3: questions", message: "must have at least 1 questions" },
      { field: "line 4: custom_id", message: "must be at most 64 characters long" },
      { field: "line 4: questions.q.criteria", message: "must have at least 1 levels" },
      { field: "line 5: custom_id", message: "is required" },
      { field: "line 6", message: "must be an object" },
    ]);
    assert.equal(result.accepted, 0);
  });

  test("unknown fields are rejected, not stripped, at the top and inside questions", async () => {
    const result = await check(
      `${request("a", { temperature: 0.5 })}\n${JSON.stringify({ custom_id: "b", state: 1, questions: { q: { type: "noul", extra: 1 } } })}`,
    );
    assert.deepEqual(result.errors, [
      { field: "line 1: temperature", message: "is not a field of the contract (unknown fields are rejected)" },
      { field: "line 2: questions.q.extra", message: "is not a field of the contract (unknown fields are rejected)" },
    ]);
    assert.equal(result.accepted, 0);
  });

  test("a custom_id that is not well-formed Unicode or holds a control character is refused on its line", async () => {
    const line = (customIdJson: string) => `{"custom_id": ${customIdJson}, "state": 1, "questions": {"q": {"type": "noul"}}}`;
    const message = "must be well-formed Unicode without control characters (U+0000–U+001F, U+007F–U+009F)";
    const result = await check(
      [
        line('"lone \\ud800"'),
        line('"lone \\udfff"'),
        line('"nul \\u0000"'),
        line('"tab\\t"'),
        line('"del \\u007f"'),
        line('"c1 \\u0085"'),
        line('"pair \\ud83d\\ude00"'),
        line('"lone \\ud801"'),
      ].join("\n"),
    );
    assert.deepEqual(
      result.errors,
      [1, 2, 3, 4, 5, 6, 8].map((n) => ({ field: `line ${n}: custom_id`, message })),
      "a surrogate pair (line 7) is well-formed",
    );
    assert.equal(result.accepted, 0);
    const alone = await check(line('"pair \\ud83d\\ude00 and U+00A0\\u00a0"'));
    assert.deepEqual([alone.errors, alone.lines.map((l) => l.customId)], [[], ["pair \u{1f600} and U+00A0\u00a0"]]);
  });

  test("a line with many unknown fields: bounded errors, exact count, custom_id never taken for one of them", async () => {
    const unknown: Record<string, number> = {};
    for (let i = 0; i < 120; i++) unknown[`f${i}`] = i;
    const line = JSON.stringify({ ...unknown, custom_id: "a", state: 1, questions: { q: { type: "noul" } } });
    const result = await check(line);
    assert.equal(result.errors.length, MAX_FIELD_ERRORS);
    assert.equal(result.moreErrors, 120 - MAX_FIELD_ERRORS);
    assert.ok(result.errors.every((e, i) => e.field === `line 1: f${i}`));
  });

  test("a repeated custom_id names both lines; the first one stays accepted (as are those before the repeat)", async () => {
    const result = await check([request("a"), request("b"), request("a"), request("c"), request("b")].join("\n"));
    assert.deepEqual(result.errors, [
      { field: "line 3: custom_id", message: "repeats the custom_id of line 1: custom_ids must be unique within a batch" },
      { field: "line 5: custom_id", message: "repeats the custom_id of line 2: custom_ids must be unique within a batch" },
    ]);
    assert.deepEqual(
      result.lines.map((l) => l.customId),
      ["a", "b"],
    );
  });

  test("a repeated custom_id is found even when the first line has other errors", async () => {
    const result = await check([request("a", { extra: 1 }), request("a")].join("\n"));
    assert.deepEqual(
      result.errors.map((e) => e.field),
      ["line 1: extra", "line 2: custom_id"],
    );
  });

  test("max_questions: checked before the schema, as the route does (one error for the line)", async () => {
    const questions = { a: { type: "noul" }, b: { type: "noul" }, c: { type: "noul" }, d: { type: "bad" } };
    const result = await check(`${request("a")}\n${JSON.stringify({ custom_id: "x", state: 1, questions, extra: 1 })}\n`);
    assert.deepEqual(result.errors, [{ field: "line 2: questions", message: "must have at most 3 questions (max_questions); got 4" }]);
    assert.equal(result.accepted, 1);
  });

  test("JSON as the API parses it: invalid JSON, too deep, invalid UTF-8 name their line; for a member named twice the last counts", async () => {
    const deep = `${"[".repeat(300)}${"]".repeat(300)}`;
    const twice = `{"custom_id":"first","custom_id":"second","state":1,"questions":{"q":{"type":"noul"}}}`;
    const text = Buffer.concat([
      Buffer.from(`${twice}\n{"custom_id":\n${deep}\n`),
      Buffer.from([0x7b, 0xc3, 0x28, 0x7d, 0x0a]),
      Buffer.from(request("z")),
    ]);
    const result = await check(text);
    assert.equal(result.errors.length, 3);
    assert.equal(result.errors[0]!.field, "line 2");
    assert.match(result.errors[0]!.message, /^is not valid JSON: /);
    assert.deepEqual(result.errors.slice(1), [
      { field: "line 3", message: "nests arrays and objects deeper than 256 levels" },
      { field: "line 4", message: "is not valid UTF-8" },
    ]);
    assert.deepEqual(
      result.lines.map((l) => l.customId),
      ["second"],
    );
  });

  test("61 invalid lines: the first 50 errors are listed, the rest counted", async () => {
    const lines = Array.from({ length: 61 }, (_, i) => request(`r${i}`, { extra: i }));
    const result = await check(lines.join("\n"));
    assert.equal(result.errors.length, MAX_FIELD_ERRORS);
    assert.equal(result.errors[49]!.field, "line 50: extra");
    assert.equal(result.moreErrors, 11);
    assert.equal(result.accepted, 0);
  });

  test("more lines than max_batch_requests: one error at the first line past it, the lines past it are not checked", async () => {
    const lines = [request("a"), request("b"), request("c"), "not json", request("a")];
    const result = await check(lines.join("\n"), { maxRequests: 2 });
    assert.deepEqual(result.errors, [{ field: "line 3", message: "is past max_batch_requests: a batch holds at most 2 requests" }]);
    assert.equal(result.moreErrors, 0);
    assert.deepEqual(
      result.lines.map((l) => l.customId),
      ["a", "b"],
    );
  });

  test("an input without a request is refused", async () => {
    const result = await check("\n \r\n\n");
    assert.deepEqual(result.errors, [{ field: "(body)", message: "has no requests: send one JSON object a line" }]);
  });

  test("413 errors of the splitter pass through; the custom_id of a 64-character and a 64-emoji id is accepted", async () => {
    await assert.rejects(
      checkSubmission(ndjsonLines(chunksOf(`${request("a")}\n${request("b")}\n`), { maxLineBytes: 100, maxTotalBytes: 90 }), {
        maxRequests: 10,
        checkQuestionCount: () => {},
        accept: () => {},
      }),
      (error: unknown) => (error as { status?: number }).status === 413,
    );
    const result = await check(`${request("x".repeat(64))}\n${request("🙂".repeat(64))}\n${request("🙂".repeat(65))}`);
    assert.deepEqual(result.errors, [{ field: "line 3: custom_id", message: "must be at most 64 characters long" }]);
    assert.equal(result.accepted, 2);
  });
});
