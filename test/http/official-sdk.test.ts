import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { AuthenticationError, choice, noul, score, TypeSafeClient, UnprocessableEntityError } from "@typesafe-ai/sdk";
import { type Gateway, startGateway } from "../support/gateway-harness.ts";

describe("the official @typesafe-ai/sdk against the gateway", () => {
  let gw: Gateway;
  let client: TypeSafeClient;
  before(async () => {
    gw = await startGateway();
    client = new TypeSafeClient({ apiKey: gw.key, baseURL: gw.url, logLevel: "off" });
  });
  after(async () => gw.close());

  test("models.list() returns the models array", async () => {
    const models = await client.models.list();
    assert.deepEqual(
      models.map((m: { name: string }) => m.name),
      ["fake-small", "fake-large"],
    );
  });

  test("systemOne() with all three question types, the SDK's default model and its request id", async () => {
    const { data, requestId } = await client
      .systemOne({
        state: "I was charged twice. Please help.",
        questions: {
          topic: choice("What is this about?", { billing: "Payments", shipping: "Delivery", other: null }),
          mood: score("How upset is the customer?", ["calm", "annoyed", "angry"]),
          refund: noul("Do they want a refund?"),
        },
      })
      .withResponse();
    assert.equal(requestId, (data as unknown as { request_id: string }).request_id);
    assert.equal(data.model, "fake-small", "jev-latest maps to the default model");
    assert.equal(data.answers.topic.type, "choice");
    assert.ok(["billing", "shipping", "other"].includes(data.answers.topic.choice));
    assert.equal(data.answers.mood.type, "score");
    assert.equal(typeof data.answers.refund.noul, "number");
    assert.equal(gw.fake!.received.at(-1)!.model, "fake-small");
  });

  test("errors surface as the SDK's typed errors with the gateway's detail", async () => {
    await assert.rejects(
      client.systemOne({ state: "x", questions: { q: noul("?") }, model: "no-such-model" }),
      (err: unknown) => err instanceof UnprocessableEntityError && /Unknown model/.test(err.message),
    );
    const bad = new TypeSafeClient({ apiKey: "tds_wrong", baseURL: gw.url, logLevel: "off", retry: { maxRetries: 0 } });
    await assert.rejects(bad.models.list(), (err: unknown) => err instanceof AuthenticationError);
  });
});
