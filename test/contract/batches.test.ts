/**
 * The batch contract: a line is checked exactly as POST /v1/systemone checks its body (same field errors, same
 * count), plus its custom_id; the API objects are valid JSON Schemas that accept what they describe.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import fc from "fast-check";
import { Batch, BatchList, BatchRequestLine, BatchResultLine, boundBatchRequestLine } from "../../src/contract/batches.ts";
import { DecisionRequest } from "../../src/contract/decision.ts";
import { boundDecisionRequest } from "../../src/contract/decision-bound.ts";
import { compileBoundedSchema, compileSchema, summarizeFieldErrors } from "../../src/contract/validation.ts";
import { applyMutation, mutation, setOwn, validRequest } from "../fuzz/support.ts";

const validateBody = compileBoundedSchema(DecisionRequest, boundDecisionRequest);
const validateLine = compileBoundedSchema(BatchRequestLine, boundBatchRequestLine);
const validateLineUnbounded = compileSchema(BatchRequestLine);

function summary(validate: { (data: unknown): boolean; errors?: unknown }, data: unknown) {
  if (validate(data)) return null;
  return summarizeFieldErrors(validate.errors as never);
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

/** The request with `custom_id` first, every other field kept as an own field (`__proto__` included). */
function asLine(request: Record<string, unknown>, customId: unknown): Record<string, unknown> {
  const line: Record<string, unknown> = {};
  setOwn(line, "custom_id", customId);
  for (const key of Object.keys(request)) setOwn(line, key, request[key]);
  return line;
}

describe("batch contract", () => {
  test("property: a line with a valid custom_id has exactly the field errors /v1/systemone gives its body", () => {
    fc.assert(
      fc.property(validRequest, fc.array(mutation, { maxLength: 4 }), (request, mutations) => {
        let doc: unknown = request;
        for (const m of mutations) doc = applyMutation(doc, m);
        fc.pre(isObject(doc) && !Object.hasOwn(doc, "custom_id"));
        const line = asLine(doc as Record<string, unknown>, "row-1");
        assert.deepEqual(summary(validateLine, line), summary(validateBody, doc));
      }),
      { numRuns: 400 },
    );
  });

  test("property: the bounded line check lists the same first errors and total as the unbounded one", () => {
    fc.assert(
      fc.property(
        validRequest,
        fc.array(mutation, { maxLength: 3 }),
        fc.integer({ min: 0, max: 120 }),
        fc.oneof(fc.constant<unknown>("row"), fc.constant<unknown>(""), fc.constant<unknown>(7), fc.constant<unknown>("x".repeat(65))),
        (request, mutations, unknownCount, customId) => {
          let doc: unknown = request;
          for (const m of mutations) doc = applyMutation(doc, m);
          fc.pre(isObject(doc) && !Object.hasOwn(doc, "custom_id"));
          // More than 32 questions never reach the schema (max_questions is checked first); the bound checks 33 of them.
          fc.pre(!isObject(doc.questions) || Object.keys(doc.questions).length <= 32);
          const line = asLine(doc, customId);
          for (let i = 0; i < unknownCount; i++) setOwn(line, `u${i}`, i);
          assert.deepEqual(summary(validateLine, line), summary(validateLineUnbounded, line));
        },
      ),
      { numRuns: 300 },
    );
  });

  test("custom_id: required, a string of 1 to 64 characters", () => {
    const request = { state: 1, questions: { q: { type: "noul" } } };
    assert.equal(validateLine(asLine(request, "a")), true);
    assert.equal(validateLine(asLine(request, "é".repeat(64))), true);
    assert.deepEqual(summary(validateLine, request)?.errors, [{ field: "custom_id", message: "is required" }]);
    assert.deepEqual(summary(validateLine, asLine(request, 12))?.errors, [{ field: "custom_id", message: "must be a string" }]);
    assert.deepEqual(summary(validateLine, asLine(request, "é".repeat(65)))?.errors, [
      { field: "custom_id", message: "must be at most 64 characters long" },
    ]);
  });

  test("the API objects accept what they describe and refuse unknown fields", () => {
    const batch = {
      id: "batch_abc",
      object: "batch",
      status: "queued",
      model: null,
      created_at: "2026-11-27T21:00:00.000Z",
      started_at: null,
      ended_at: null,
      expires_at: "2026-11-28T21:00:00.000Z",
      request_counts: { total: 3, succeeded: 0, failed: 0 },
      cost_microusd: 0,
      cost_usd: "0.000000",
    };
    const validBatch = compileSchema(Batch);
    assert.equal(validBatch(batch), true);
    assert.equal(validBatch({ ...batch, status: "validating" }), false, "validating batches are never shown");
    assert.equal(validBatch({ ...batch, extra: 1 }), false);
    assert.equal(validBatch({ ...batch, expires_at: null }), false, "every batch has a completion window");
    assert.equal(compileSchema(BatchList)({ data: [batch], next_cursor: null }), true);
    const validResult = compileSchema(BatchResultLine);
    assert.equal(validResult({ custom_id: "a", request_id: "req_1", status: 402, body: { detail: "x" } }), true);
    assert.equal(validResult({ custom_id: "a", request_id: "req_1", status: 200, body: [] }), false);
    assert.equal(validResult({ custom_id: "a", request_id: null, status: 409, body: { detail: "x" } }), true, "a request that never ran");
  });
});
