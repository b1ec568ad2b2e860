/**
 * The costliest bodies up to max_request_bytes (test/support/costly-bodies.ts), ten of a shape sent at once through a
 * real gateway while /healthz is polled: each gets its 422 with the expected field errors (at most 50 listed, the exact
 * total in the detail), and /healthz keeps answering 200 meanwhile. How fast is bench/costly-bodies.ts's business.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Agent, request } from "undici";
import { MAX_FIELD_ERRORS } from "../../src/contract/validation.ts";
import { assertShape } from "../support/contract-check.ts";
import { COSTLY_SHAPES, type Expected, fitBody } from "../support/costly-bodies.ts";
import { type Gateway, startGateway } from "../support/gateway-harness.ts";

const AT_ONCE = 10;

interface Answer {
  status: number;
  body: { detail: string; errors?: { field: string; message: string }[] };
}

/** `count` copies of `body` sent at once on as many connections, /healthz polled on another (1 ms apart) until all are answered. */
async function sendAtOnce(
  gw: Gateway,
  body: string,
  count: number,
): Promise<{ answers: Answer[]; health: number[]; healthMeanwhile: number }> {
  // Agents of their own, closed after: no connection is reused across shapes (a kept-alive one may be closing).
  const decisions = new Agent({ connections: count });
  const healthAgent = new Agent({ connections: 1 });
  const health: number[] = [];
  let healthMeanwhile = 0;
  let inFlight = true;
  try {
    const sent = Promise.all(
      Array.from({ length: count }, async (): Promise<Answer> => {
        const res = await request(`${gw.url}/v1/systemone`, {
          method: "POST",
          headers: { authorization: `Bearer ${gw.key}`, "content-type": "application/json" },
          body,
          dispatcher: decisions,
        });
        return { status: res.statusCode, body: JSON.parse(await res.body.text()) as Answer["body"] };
      }),
    ).finally(() => (inFlight = false));
    const poller = (async () => {
      while (inFlight) {
        const startedMeanwhile = inFlight;
        const res = await request(`${gw.url}/healthz`, { dispatcher: healthAgent });
        await res.body.text();
        health.push(res.statusCode);
        if (startedMeanwhile) healthMeanwhile++;
        await new Promise((r) => setTimeout(r, 1));
      }
    })();
    const answers = await sent;
    await poller;
    return { answers, health, healthMeanwhile };
  } finally {
    await decisions.close();
    await healthAgent.close();
  }
}

function assertAnswer(answer: Answer, expected: Expected, what: string): void {
  assert.equal(answer.status, expected.status, `${what}: ${JSON.stringify(answer.body).slice(0, 300)}`);
  assertShape("error", answer.body);
  const { detail, errors } = answer.body;
  if (expected.detail) {
    assert.match(detail, expected.detail, what);
    return;
  }
  const total = expected.total!;
  assert.deepEqual(errors?.[0], expected.first, what);
  assert.equal(errors?.length, Math.min(total, MAX_FIELD_ERRORS), `${what}: how many are listed`);
  assert.equal(new Set(errors!.map((e) => `${e.field}\u0000${e.message}`)).size, errors!.length, `${what}: each problem once`);
  const first = `Invalid request body: ${expected.first!.field}: ${expected.first!.message}`;
  const more = total > 1 ? ` (and ${total - 1} more)` : "";
  const showing = total > MAX_FIELD_ERRORS ? ` (showing the first ${MAX_FIELD_ERRORS} of ${total} problems)` : "";
  assert.equal(detail, `${first}${more}${showing}`, `${what}: the detail`);
}

// A hang guard only.
describe(`the costliest bodies of ~1 MiB, ${AT_ONCE} at once: each answered, /healthz answered meanwhile`, { timeout: 600_000 }, () => {
  let gw: Gateway;
  before(async () => {
    gw = await startGateway();
  });
  after(async () => gw.close());

  for (const shape of COSTLY_SHAPES) {
    test(shape.name, async () => {
      const { body, n } = fitBody(shape);
      const expected = shape.expect(n);
      const calls = gw.fake!.calls.decide;
      const { answers, health, healthMeanwhile } = await sendAtOnce(gw, body, AT_ONCE);
      assert.equal(answers.length, AT_ONCE);
      for (const [i, answer] of answers.entries()) assertAnswer(answer, expected, `${shape.name} #${i}`);
      assert.ok(
        health.every((s) => s === 200),
        `/healthz statuses ${health.join(",")}`,
      );
      assert.ok(healthMeanwhile >= 1, "a /healthz request was sent while the bodies were processed, and answered");
      assert.equal(gw.fake!.calls.decide, calls, "the model is not called");
    });
  }
});
