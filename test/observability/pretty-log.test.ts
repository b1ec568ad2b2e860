import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { createLogger, resolveLogFormat } from "../../src/observability/logging.ts";
import { formatLogLine } from "../../src/observability/pretty-log.ts";

describe("log format", () => {
  test("pretty on a terminal, JSON otherwise, TDS_LOG_FORMAT wins", () => {
    assert.equal(resolveLogFormat(null, { write: () => true, isTTY: true }), "pretty");
    assert.equal(resolveLogFormat(null, { write: () => true }), "json");
    assert.equal(resolveLogFormat("json", { write: () => true, isTTY: true }), "json");
    assert.equal(resolveLogFormat("pretty", { write: () => true }), "pretty");
  });

  test("a readable line: time, level, component, message, request summary, other fields; the error's stack indented", () => {
    const time = Date.UTC(2026, 10, 26, 9, 8, 7, 654);
    const line = JSON.stringify({
      level: 40,
      time,
      pid: 1,
      hostname: "h",
      component: "store",
      msg: "slow commit",
      steps: 3,
      note: "two words",
    });
    assert.equal(formatLogLine(line, false), '09:08:07.654 WARN  [store] slow commit  steps=3  note="two words"\n');
    const request = JSON.stringify({
      level: 30,
      time,
      msg: "request completed",
      request_id: "req_1",
      res: { statusCode: 200 },
      req: { method: "GET", url: "/v1/models" },
      responseTime: 1.234,
    });
    assert.equal(formatLogLine(request, false), "09:08:07.654 INFO  request completed  GET /v1/models 200 1.2 ms  request_id=req_1\n");
    const failed = formatLogLine(
      JSON.stringify({ level: 50, time, msg: "boom", err: { message: "x", stack: "Error: x\n    at f (a.ts:1:1)" } }),
      false,
    );
    assert.equal(failed, "09:08:07.654 ERROR boom\n    Error: x\n        at f (a.ts:1:1)\n");
    assert.equal(formatLogLine("not json", false), "not json\n");
    // biome-ignore lint/suspicious/noControlCharactersInRegex: matches the ANSI colour sequence (ESC [ 33m) the terminal format writes
    assert.match(formatLogLine(line, true), /\x1b\[33mWARN /);
  });

  test("the pretty logger redacts Authorization like the JSON one", () => {
    const lines: string[] = [];
    const log = createLogger({ logLevel: "info", logFormat: "pretty" }, { write: (t) => lines.push(t), isTTY: false });
    log.info({ req: { headers: { authorization: "Bearer tds_secret_value" } } }, "incoming");
    assert.equal(lines.length, 1);
    assert.doesNotMatch(lines[0]!, /tds_secret_value/);
    assert.match(lines[0]!, /\[redacted\]/);
    // biome-ignore lint/suspicious/noControlCharactersInRegex: must find any ANSI escape sequence (ESC [) to prove there is none
    assert.doesNotMatch(lines[0]!, /\x1b\[/, "no colours when the output is not a terminal");
  });
});
