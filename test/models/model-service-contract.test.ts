/**
 * The ModelService contract (model-service-contract.ts) on every adapter: the System One HTTP adapter against the
 * fake model server on 127.0.0.1, the in-process llama.cpp engine on a GGUF generated at test time, the in-process
 * fake (test/support/fake-model-service.ts), and the model router over the fake.
 */
import { after } from "node:test";
import type { Question } from "../../src/contract/decision.ts";
import { openLlamaService } from "../../src/models/llama/llama-service.ts";
import type { ModelCall } from "../../src/models/model-service.ts";
import { createModelRouter } from "../../src/models/routing/router.ts";
import { openSystemOneHttpService } from "../../src/models/systemone-http/systemone-http-service.ts";
import { startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { type ModelDir, makeModelDir, manyOptions, recordingLogger } from "../fixtures/gguf/tiny-model.ts";
import { createFakeModelService } from "../support/fake-model-service.ts";
import { describeModelServiceContract } from "./model-service-contract.ts";

const small: Record<string, Question> = { ok: { type: "noul", instructions: "Is it fine?" } };

/** A call the fake server and the in-process fake never answer. */
const hangingCall = (model: string): ModelCall => ({ model, state: { fake_behavior: "hang" }, questions: small });

describeModelServiceContract(
  "System One HTTP adapter (fake model server)",
  async () => {
    // The fake server publishes max_state 4096 for fake-small but enforces only its input limit (state plus questions,
    // 8192 tokens by default): set that limit to the published max_state, so that it enforces what it publishes.
    const fake = await startFakeModelServer({ host: "127.0.0.1", maxInputTokens: 4096 });
    const service = openSystemOneHttpService({ baseUrl: fake.url, connections: 4 });
    return {
      service,
      model: "fake-small",
      close: async () => {
        await service.close();
        await fake.close();
      },
    };
  },
  { slowCall: hangingCall, publishesContext: true, listModelsObservesCallOptions: true, inFlightAtClose: "answered", deterministic: true },
);

let models: ModelDir | undefined;
after(() => models?.cleanup());

/** Keeps the engine's single context busy for hundreds of milliseconds. */
const slowEngineCall = (model: string): ModelCall => ({
  model,
  state: { facts: ["the sky is blue"] },
  questions: Object.fromEntries(
    Array.from({ length: 6 }, (_, i) => [
      `q${i}`,
      { type: "choice", instructions: `question ${i}`, criteria: manyOptions(100) } as Question,
    ]),
  ),
});

describeModelServiceContract(
  "in-process llama.cpp engine (generated GGUF)",
  async () => {
    models ??= makeModelDir();
    const service = openLlamaService({
      name: "tiny",
      source: models.model("tiny"),
      threads: 1,
      batchSize: 64,
      contextSize: 4096,
      poolSize: 1,
      logger: recordingLogger(),
    });
    await service.ready();
    return { service, model: "tiny", close: () => service.close() };
  },
  {
    slowCall: slowEngineCall,
    publishesContext: true,
    listModelsObservesCallOptions: false,
    inFlightAtClose: "unavailable",
    deterministic: true,
  },
);

describeModelServiceContract(
  "in-process fake",
  async () => {
    const service = createFakeModelService({ tokenBound: true, poolSize: 2 });
    return { service, model: "fake-small", close: () => service.close() };
  },
  { slowCall: hangingCall, publishesContext: true, listModelsObservesCallOptions: true, inFlightAtClose: "answered", deterministic: true },
);

describeModelServiceContract(
  "model router over the in-process fake",
  async () => {
    const fake = createFakeModelService({ tokenBound: true });
    const router = createModelRouter("fake-small", [{ name: "fake-a", service: fake, upstreamName: "fake-small" }], {
      ownsServices: true,
      healthCheckIntervalMs: null,
    });
    return { service: router, model: "fake-small", close: () => router.close() };
  },
  // A call the router has accepted but not yet sent to its deployment when close() (ownsServices) closes the service
  // fails "unavailable", after close() resolved; one already sent is answered before. So inFlightAtClose is left open.
  { slowCall: hangingCall, publishesContext: true, listModelsObservesCallOptions: false, closeAwaitsInFlight: false, deterministic: true },
);
