import assert from "node:assert/strict";
import { DecisionResponse } from "../../src/contract/decision.ts";
import { ErrorResponse } from "../../src/contract/errors.ts";
import { ModelsResponse } from "../../src/contract/models.ts";
import { compileSchema } from "../../src/contract/validation.ts";

const checks = {
  decision: compileSchema(DecisionResponse),
  error: compileSchema(ErrorResponse),
  models: compileSchema(ModelsResponse),
};

/** Asserts a body is exactly the contract's shape (no extra or missing fields). */
export function assertShape(kind: keyof typeof checks, body: unknown): void {
  const validate = checks[kind];
  assert.ok(
    validate(body),
    `${kind} body does not match the contract: ${JSON.stringify(validate.errors)}\n${JSON.stringify(body).slice(0, 2000)}`,
  );
}

/** Reads an error response and asserts its shape; returns the body. */
export async function errorBody(res: Response, status: number): Promise<{ detail: string; errors?: { field: string; message: string }[] }> {
  const text = await res.text();
  assert.equal(res.status, status, `expected ${status}, got ${res.status}: ${text}`);
  const body = JSON.parse(text);
  assertShape("error", body);
  return body;
}

export function fields(body: { errors?: { field: string }[] }): string[] {
  return (body.errors ?? []).map((e) => e.field);
}

/** The parsed JSON body of a response, untyped for assertions. */
export async function json(res: Response): Promise<any> {
  return JSON.parse(await res.text());
}
