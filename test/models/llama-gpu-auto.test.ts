/**
 * gpu "auto" in a process of its own: a second llama.cpp backend in one process (the CPU one of the other engine
 * tests, then this one) takes llama.cpp's log away from node-llama-cpp's logger (3.21.1), and every later native line
 * goes straight to stderr, where a failing load's lines would look like a failed test.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import type { Question } from "../../src/contract/decision.ts";
import { checkAnswers } from "../../src/gateway/answer-check.ts";
import { type ModelDir, makeModelDir, recordingLogger, tinyService } from "../fixtures/gguf/tiny-model.ts";

const questions: Record<string, Question> = {
  c: { type: "choice", criteria: { x: null, y: null } },
  s: { type: "score", criteria: ["low", "high"] },
  n: { type: "noul" },
};

let models: ModelDir;
before(() => {
  models = makeModelDir();
});
after(() => models?.cleanup());

test('gpu "auto": the best build the install has (the CPU one here: the GPU packages are overridden to empty ones)', async () => {
  const logger = recordingLogger();
  const service = tinyService(models.model("tiny"), { logger, gpu: "auto" });
  await service.ready();
  assert.ok(
    checkAnswers(questions, (await service.decide({ model: "tiny", state: "facts", questions }, { timeoutMs: 30_000 })).answers).ok,
  );
  assert.ok(
    logger.lines.some((l) => l.level === "info" && / on (the CPU|cuda|vulkan|metal), /.test(l.msg)),
    JSON.stringify(logger.lines),
  );
  await service.close();
});
