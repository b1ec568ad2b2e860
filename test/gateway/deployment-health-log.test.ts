import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { deploymentHealthLine } from "../../src/gateway/deployment-health-log.ts";
import { ModelServiceError } from "../../src/models/model-service.ts";

const HOSTILE = `could not connect to postgres://admin:S3cret@10.1.2.3\n\u001b[31mFORGED\u001b[0m ${"x".repeat(3000)}`;

describe("the log line of a deployment's health change", () => {
  test("a healthy deployment that fails: warn, with the kind, the status and the words, escaped and bounded", () => {
    const failure = new ModelServiceError("bad_status", "model service answered HTTP 503", 503, { upstreamText: HOSTILE });
    const line = deploymentHealthLine("decider", "gpu-a", "cooling_down", { from: "healthy", failure });
    assert.ok(line);
    assert.equal(line.level, "warn");
    assert.equal(line.message, "deployment failing");
    assert.equal(line.fields.failure, "bad_status");
    assert.equal(line.fields.upstream_status, 503);
    const reason = line.fields.reason!;
    assert.ok(reason.startsWith("model service answered HTTP 503: could not connect to postgres://"), reason);
    assert.ok(reason.includes("\\n\\u001b[31mFORGED"), "control characters escaped");
    // biome-ignore lint/suspicious/noControlCharactersInRegex: the test looks for raw control characters
    assert.ok(!/[\u0000-\u001f]/.test(reason));
    assert.ok(reason.endsWith("…") && Array.from(reason).length < 520, "bounded");
  });

  test("moves between a cooldown and a probe while it stays down: no line", () => {
    const failure = new ModelServiceError("unavailable", "connection refused");
    assert.equal(deploymentHealthLine("decider", "gpu-a", "probing", { from: "cooling_down", failure }), null);
    assert.equal(deploymentHealthLine("decider", "gpu-a", "cooling_down", { from: "probing", failure }), null);
  });

  test("back to healthy: info, whatever it came from", () => {
    for (const from of ["cooling_down", "probing"] as const) {
      assert.deepEqual(deploymentHealthLine("decider", "gpu-a", "healthy", { from, failure: null }), {
        level: "info",
        fields: { model: "decider", deployment: "gpu-a" },
        message: "deployment healthy again",
      });
    }
  });

  test("an engine that is not ready: info, the kind only (the engine logs what it is doing)", () => {
    const failure = new ModelServiceError("not_ready", "the model is loading (42 %)");
    assert.deepEqual(deploymentHealthLine("decider", "in-process", "cooling_down", { from: "healthy", failure }), {
      level: "info",
      fields: { model: "decider", deployment: "in-process", failure: "not_ready" },
      message: "deployment failing",
    });
  });
});
