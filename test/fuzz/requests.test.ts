/**
 * Fuzzing POST /v1/systemone with generated and mutated bodies (fast-check, ~300 inputs per property)
 * against ONE long-running gateway per mode — paid with credits, and preview — both with
 * max_request_bytes = 8192 and the fake model answering normally. For every input: never a 5xx (only
 * 200 and 4xx are valid for client input), every error body an ErrorResponse, every 200 a
 * DecisionResponse, and only a 200 adds a usage record, a model call, a charge or a day-counter unit.
 * The process hosting both gateways stays up with stable memory (RSS before and after, reported), and
 * Object.prototype is untouched. Raw sockets (node:net) send lying Content-Lengths and broken framing:
 * a connection the server closes on them is allowed (Node/Fastify then answer 400 without a contract
 * body), the server must stay up and the accounting exact. Deep nesting beyond what 8 KiB can hold runs
 * against a gateway with the default byte limit (1 MiB). Failures print the (shrunk) input that
 * reproduces them. TDS_FUZZ_RUNS changes the number of inputs per property (default 300).
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import v8 from "node:v8";
import vm from "node:vm";
import fc from "fast-check";
import { assertShape } from "../support/contract-check.ts";
import { type Gateway, sampleRequest, startGateway } from "../support/gateway-harness.ts";
import {
  applyMutation,
  books,
  checkedExchange,
  clone,
  httpRequest,
  type Json,
  mutation,
  post,
  type RawResponse,
  rawExchange,
  runProperty,
  stringifyWithDuplicate,
  Tally,
  utf8Bytes,
  validRequest,
} from "./support.ts";

const LIMIT = 8192;
const RUNS = Number(process.env.TDS_FUZZ_RUNS ?? 300);
const FUZZ_ENV = { TDS_MAX_REQUEST_BYTES: String(LIMIT), TDS_MODEL_TIMEOUT_MS: "5000" };
// The default reserve_tokens (32768) covers the token bound of any body within LIMIT: only max_request_bytes gives 413.
const PAID = { ...FUZZ_ENV, TDS_SERVICE_MODE: "paid", TDS_PRICE_PER_MILLION_INPUT_USD: "1" };
const GRANT = 1_000_000_000;

const rssMb = () => process.memoryUsage().rss / 2 ** 20;
const heapMb = () => process.memoryUsage().heapUsed / 2 ** 20;
/** global.gc when node runs with --expose-gc; otherwise the flag is turned on now and gc taken from a fresh context. */
const gc: (() => void) | undefined =
  (globalThis as { gc?: () => void }).gc ??
  (() => {
    try {
      v8.setFlagsFromString("--expose-gc");
      return vm.runInNewContext("gc") as () => void;
    } catch {
      return undefined;
    }
  })();
const settle = async () => {
  for (let i = 0; i < 3; i++) {
    gc?.();
    await new Promise((r) => setTimeout(r, 50));
  }
};

let paid: Gateway;
let preview: Gateway;
const protoBefore = Object.getOwnPropertyNames(Object.prototype).sort();
let rssBefore = 0;
let heapBefore = 0;
const gateways = () =>
  [
    ["paid", paid],
    ["preview", preview],
  ] as const;

before(async () => {
  paid = await startGateway({ env: PAID });
  preview = await startGateway({ env: FUZZ_ENV });
  await paid.store.grantCredits({ orgId: paid.orgId, amountMicrousd: GRANT, nowMs: Date.now() });
  // Warm both (model list cached, statements prepared) before the memory baseline.
  for (const [, gw] of gateways())
    for (let i = 0; i < 20; i++) assert.equal((await gw.decide(sampleRequest({ state: { i } }))).status, 200);
  await settle();
  rssBefore = rssMb();
  heapBefore = heapMb();
});

after(async () => {
  await paid?.close();
  await preview?.close();
});

describe("fuzzed request bodies (paid and preview gateways, max_request_bytes 8192)", { timeout: 120_000 }, () => {
  for (const mode of ["paid", "preview"] as const) {
    test(`${mode}: valid requests with 0–3 mutations (wrong types, missing and extra fields, huge strings, nesting, question counts)`, async (t) => {
      const gw = mode === "paid" ? paid : preview;
      const tally = new Tally();
      await runProperty(
        fc.asyncProperty(validRequest, fc.array(mutation, { maxLength: 3 }), async (request, mutations) => {
          let doc: unknown = clone(request);
          for (const m of mutations) doc = applyMutation(doc, m);
          const text = JSON.stringify(doc) ?? "null";
          const out = await checkedExchange(
            gw,
            () => gw.decide(text),
            () => text,
            tally,
          );
          // Size is judged in UTF-8 bytes: over the limit is always 413, an unmutated request under it always 200.
          if (utf8Bytes(text) > LIMIT) assert.equal(out.status, 413, `over the byte limit: ${out.text}`);
          else assert.notEqual(out.status, 413, `under the byte limit (${utf8Bytes(text)} bytes): ${out.text}`);
          if (mutations.length === 0 && utf8Bytes(text) <= LIMIT)
            assert.equal(out.status, 200, `a valid request: ${out.text}\n${text.slice(0, 600)}`);
        }),
        RUNS,
      );
      t.diagnostic(`${mode}: ${tally}`);
    });
  }

  test("bodies just under and just over max_request_bytes, padded with multi-byte characters: ≤ limit → 200, > limit → 413", async (t) => {
    const tally = new Tally();
    const base = JSON.stringify({ ...sampleRequest(), state: "" });
    await runProperty(
      fc.asyncProperty(
        fc.constantFrom("paid" as const, "preview" as const),
        fc.integer({ min: -40, max: 40 }),
        fc.constantFrom("a", "é", "€", "🙂"),
        async (mode, delta, unit) => {
          const gw = mode === "paid" ? paid : preview;
          // Pad the state to (limit + delta) bytes as closely as the unit allows.
          const target = LIMIT + delta - utf8Bytes(base);
          const unitBytes = utf8Bytes(unit);
          let pad = unit.repeat(Math.max(0, Math.floor(target / unitBytes)));
          pad += "x".repeat(Math.max(0, target - utf8Bytes(pad)));
          const text = JSON.stringify({ ...sampleRequest(), state: pad });
          const bytes = utf8Bytes(text);
          const out = await checkedExchange(
            gw,
            () => gw.decide(text),
            () => `${bytes} bytes of ${JSON.stringify(unit)}`,
            tally,
          );
          assert.equal(out.status, bytes <= LIMIT ? 200 : 413, `${bytes} bytes: ${out.text.slice(0, 200)}`);
        },
      ),
      RUNS,
    );
    t.diagnostic(tally.toString());
  });

  test("__proto__, constructor and other prototype names as keys at every level", async (t) => {
    const tally = new Tally();
    const names = fc.constantFrom("__proto__", "constructor", "prototype", "toString", "hasOwnProperty", "__defineGetter__", "valueOf");
    await runProperty(
      fc.asyncProperty(
        fc.constantFrom("paid" as const, "preview" as const),
        validRequest,
        fc.array(fc.tuple(fc.nat(), names, fc.jsonValue({ maxDepth: 2 })), { minLength: 1, maxLength: 4 }),
        async (mode, request, adds) => {
          const gw = mode === "paid" ? paid : preview;
          let doc: unknown = clone(request);
          for (const [at, key, value] of adds) doc = applyMutation(doc, { kind: "add", at, key, value: value as never });
          const text = JSON.stringify(doc);
          const out = await checkedExchange(
            gw,
            () => gw.decide(text),
            () => text,
            tally,
          );
          if (out.status === 200) {
            // The answers are keyed exactly by the question ids as sent, prototype names included.
            const sent = Object.keys((JSON.parse(text) as { questions: object }).questions).sort();
            assert.deepEqual(Object.keys((out.body as { answers: object }).answers).sort(), sent);
          }
        },
      ),
      RUNS,
    );
    assert.deepEqual(Object.getOwnPropertyNames(Object.prototype).sort(), protoBefore, "Object.prototype untouched");
    assert.equal(({} as Record<string, unknown>).polluted, undefined);
    t.diagnostic(tally.toString());
  });

  test("raw bodies: duplicate keys, invalid UTF-8, random bytes, garbage content types", async (t) => {
    const tally = new Tally();
    const valid = JSON.stringify(sampleRequest());
    const rawCase = fc.oneof(
      // Duplicate keys (raw JSON text) in any object of a valid request: the first or the second occurrence is the extra value.
      fc.record({
        kind: fc.constant("duplicate" as const),
        request: validRequest,
        at: fc.nat(),
        value: fc.jsonValue({ maxDepth: 2 }),
        first: fc.boolean(),
      }),
      // Invalid UTF-8 inside a string of an otherwise valid body.
      fc.record({
        kind: fc.constant("utf8" as const),
        bytes: fc.array(fc.constantFrom(0x80, 0xbf, 0xc0, 0xc1, 0xf5, 0xff, 0xed, 0xa0, 0xe0), { minLength: 1, maxLength: 4 }),
        at: fc.nat(),
      }),
      fc.record({ kind: fc.constant("random" as const), bytes: fc.uint8Array({ minLength: 0, maxLength: 512 }) }),
      fc.record({
        kind: fc.constant("content-type" as const),
        type: fc.oneof(
          fc.constantFrom(
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonx",
            "application/json-patch+json",
            "application/xml",
            "*/*",
            "",
            ";",
            "application/",
            "json",
            "application/json, text/plain",
            "text/json",
            "application/ld+json",
          ),
          fc.string({ unit: fc.constantFrom(..."abcdefghijklmnopqrstuvwxyz/;=+-. \t*\"'0123456789"), maxLength: 40 }),
        ),
      }),
    );
    await runProperty(
      fc.asyncProperty(fc.constantFrom("paid" as const, "preview" as const), rawCase, async (mode, c) => {
        const gw = mode === "paid" ? paid : preview;
        if (c.kind === "duplicate") {
          const text = stringifyWithDuplicate(c.request, c.at, c.value as Json, c.first);
          const out = await checkedExchange(
            gw,
            () => gw.decide(text),
            () => text,
            tally,
          );
          // Answered like the same document with the duplicate resolved as JSON.parse does (the last one wins).
          const normal = await checkedExchange(
            gw,
            () => gw.decide(JSON.stringify(JSON.parse(text))),
            () => text,
            tally,
          );
          assert.equal(out.status, normal.status, `duplicate keys: ${text.slice(0, 400)}`);
          return;
        }
        if (c.kind === "utf8") {
          // Bytes spliced into the state string: 422 exactly when they make the body invalid UTF-8 (some splices,
          // such as E0 BF 80, are valid sequences: then the request is simply valid).
          const bytes = Buffer.from(valid, "utf8");
          const pos = bytes.indexOf(Buffer.from("I was charged")) + (c.at % 10);
          const body = Buffer.concat([bytes.subarray(0, pos), Buffer.from(c.bytes), bytes.subarray(pos)]);
          let validUtf8 = true;
          try {
            new TextDecoder("utf-8", { fatal: true }).decode(body);
          } catch {
            validUtf8 = false;
          }
          const out = await checkedExchange(
            gw,
            () => post(gw, new Uint8Array(body)),
            () => body.toString("hex"),
            tally,
          );
          if (validUtf8) assert.notEqual(out.status, 422, out.text);
          else {
            assert.equal(out.status, 422, out.text);
            assert.match((out.body as { detail: string }).detail, /UTF-8/);
          }
          return;
        }
        if (c.kind === "random") {
          const out = await checkedExchange(
            gw,
            () => post(gw, c.bytes),
            () => Buffer.from(c.bytes).toString("hex"),
            tally,
          );
          assert.ok(out.status === 422 || out.status === 413, out.text);
          return;
        }
        const type = c.type;
        try {
          new Headers({ "content-type": type });
        } catch {
          fc.pre(false); // not a header value fetch can send
        }
        const out = await checkedExchange(
          gw,
          () => post(gw, valid, { "content-type": type }),
          () => `content-type ${JSON.stringify(type)}`,
          tally,
        );
        if (!/^application\/json$/i.test(type.split(";")[0]!.trim()))
          assert.equal(out.status, 422, `content-type ${JSON.stringify(type)}: ${out.text}`);
      }),
      RUNS,
    );
    t.diagnostic(tally.toString());
  });
});

describe("deep nesting", { timeout: 30_000 }, () => {
  test("within 8 KiB: up to ~4,000 levels of arrays or objects in state, instructions and criteria → 200/413/422, never 5xx", async (t) => {
    const tally = new Tally();
    for (const [, gw] of gateways()) {
      for (const depth of [100, 1000, 2000, 3000, 4000, 4070]) {
        for (const where of ["state", "instructions", "criteria"] as const) {
          const deep = `${"[".repeat(depth)}${"]".repeat(depth)}`;
          const text =
            where === "state"
              ? `{"state":${deep},"questions":{"q":{"type":"noul"}}}`
              : where === "instructions"
                ? `{"state":1,"questions":{"q":{"type":"noul","instructions":${deep}}}}`
                : `{"state":1,"questions":{"q":{"type":"choice","criteria":{"a":${deep}}}}}`;
          await checkedExchange(
            gw,
            () => gw.decide(text),
            () => `${depth} levels of arrays in ${where}`,
            tally,
          );
        }
      }
    }
    t.diagnostic(tally.toString());
  });

  test("with the default byte limit (1 MiB): 5,000 to 300,000 levels of arrays in state → 200 or 422, never 5xx", async (t) => {
    // The default model publishes a context: it bounds even a 600 KB state's tokens within the default reserve_tokens.
    const gw = await startGateway({ env: { TDS_SERVICE_MODE: "paid", TDS_PRICE_PER_MILLION_INPUT_USD: "1" } });
    const tally = new Tally();
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: GRANT, nowMs: Date.now() });
      const failures: string[] = [];
      for (const depth of [5000, 20_000, 300_000]) {
        for (const [label, text] of [
          ["state", `{"state":${"[".repeat(depth)}${"]".repeat(depth)},"questions":{"q":{"type":"noul"}}}`],
          ["instructions", `{"state":1,"questions":{"q":{"type":"noul","instructions":${"[".repeat(depth)}${"]".repeat(depth)}}}}`],
        ] as const) {
          try {
            await checkedExchange(
              gw,
              () => gw.decide(text),
              () => `${depth} levels of arrays in ${label}`,
              tally,
            );
          } catch (err) {
            failures.push(`${(err as Error).message.split("\n")[0]!.slice(0, 200)} [${depth} levels in ${label}]`);
          }
        }
      }
      t.diagnostic(tally.toString());
      assert.deepEqual(failures, [], "deeply nested client input must not be answered with a 5xx");
    } finally {
      await gw.close();
    }
  });
});

describe("lying Content-Length and broken framing (raw sockets)", { timeout: 60_000 }, () => {
  /** Responses the gateway itself wrote carry its request id; those must be contract bodies. Framing errors are Node/Fastify's. */
  const framingBodies = new Map<string, number>();
  function checkResponses(responses: RawResponse[], input: () => string): void {
    for (const r of responses) {
      assert.ok(r.status < 500, `never a 5xx: ${r.status} ${r.body.slice(0, 200)} — ${input()}`);
      if (r.headers["x-service-request-id"] !== undefined) {
        const body = JSON.parse(r.body);
        if (r.status === 200) assertShape("decision", body);
        else assertShape("error", body);
      } else {
        assert.equal(r.status, 400, `a response without a request id is a framing error: ${r.status} ${r.body}`);
        framingBodies.set(r.body, (framingBodies.get(r.body) ?? 0) + 1);
      }
    }
  }
  async function assertUp(gw: Gateway): Promise<void> {
    const res = await fetch(`${gw.url}/api/config`);
    assert.equal(res.status, 200, "the server is still up");
    await res.arrayBuffer();
  }

  test("Content-Length larger than the body, then the client half-closes or resets: no 5xx, nothing recorded, server up", async (t) => {
    const tally = new Tally();
    const valid = JSON.stringify(sampleRequest());
    await runProperty(
      fc.asyncProperty(
        fc.constantFrom("paid" as const, "preview" as const),
        fc.oneof(
          fc.constant(valid),
          fc.string({ maxLength: 300 }),
          fc.integer({ min: 1, max: valid.length - 1 }).map((n) => valid.slice(0, n)),
        ),
        fc.integer({ min: 1, max: 12_000 }),
        fc.constantFrom("end" as const, "destroy" as const),
        async (mode, body, extra, after) => {
          const gw = mode === "paid" ? paid : preview;
          const before = await books(gw);
          const length = utf8Bytes(body) + extra;
          const out = await rawExchange(
            gw.url,
            httpRequest(gw.key, ["Content-Type: application/json", `Content-Length: ${length}`], body),
            { after, waitMs: 3000 },
          );
          const input = () => `Content-Length ${length} for ${utf8Bytes(body)} bytes, then ${after}: ${body.slice(0, 200)}`;
          for (const r of out.responses) tally.add(r.status);
          checkResponses(out.responses, input);
          for (const r of out.responses) assert.notEqual(r.status, 200, input());
          if (after === "end") assert.ok(out.closedByServer, `the server closes a half-closed connection with a short body — ${input()}`);
          assert.deepEqual(await books(gw), before, `nothing recorded, called, charged or counted — ${input()}`);
          await assertUp(gw);
        },
      ),
      Math.ceil(RUNS / 2),
    );
    t.diagnostic(`${tally}; bodies without a request id: ${JSON.stringify([...framingBodies])}`);
  });

  test("Content-Length smaller than the body: the prefix is the request, the rest a broken next request; exactly one record and charge for a valid prefix", async (t) => {
    const tally = new Tally();
    await runProperty(
      fc.asyncProperty(
        fc.constantFrom("paid" as const, "preview" as const),
        fc.record({ n: fc.nat(1000) }).map(({ n }) => JSON.stringify(sampleRequest({ state: { n } }))),
        fc.oneof(fc.string({ minLength: 1, maxLength: 200 }), fc.constantFrom("}", "xyz", "\r\n\r\n", "GET / HTTP/1.1\r\n\r\n", "\u0000")),
        fc.oneof(fc.constant(0), fc.integer({ min: 1, max: 400 })),
        async (mode, valid, suffix, cut) => {
          const gw = mode === "paid" ? paid : preview;
          const before = await books(gw);
          const body = valid + suffix;
          // cut = 0: the Content-Length covers exactly the valid request and the suffix follows; else it stops inside it.
          const length = Math.max(1, utf8Bytes(valid) - cut);
          const out = await rawExchange(
            gw.url,
            httpRequest(gw.key, ["Content-Type: application/json", `Content-Length: ${length}`], body),
            { after: "wait", waitMs: 600 },
          );
          const input = () => `Content-Length ${length} for ${utf8Bytes(body)} bytes: ${body.slice(0, 300)}`;
          for (const r of out.responses) tally.add(r.status);
          checkResponses(out.responses, input);
          await assertUp(gw);
          // cut = 0: the first request is valid and is served, even when the broken rest closes the connection before
          // its 200 is written (the gateway finishes it anyway): wait for its record to complete — it is written in_flight
          // at admission, before the model call (which may wait for a model list lookup). cut > 0: a truncated body is never a request.
          const inFlight = async () => (await gw.store.listUsage(gw.orgId, { limit: 1 })).records[0]?.outcome === "in_flight";
          let after = await books(gw);
          for (let i = 0; cut === 0 && (after.usage === before.usage || (await inFlight())) && i < 100; i++) {
            await new Promise((r) => setTimeout(r, 20));
            after = await books(gw);
          }
          const added = after.usage - before.usage;
          assert.equal(added, cut === 0 ? 1 : 0, `${added} records — ${input()}`);
          assert.equal(after.calls - before.calls, added, `one model call per record — ${input()}`);
          if (gw === paid) {
            const record = added === 1 ? (await gw.store.listUsage(gw.orgId, { limit: 1 })).records[0]! : null;
            const cost = record?.costMicrousd ?? 0;
            assert.deepEqual(
              after.balance,
              { ...before.balance, available: before.balance.available - cost, spent: before.balance.spent + cost },
              input(),
            );
          } else {
            assert.deepEqual(after.day, { org: before.day.org + added, global: before.day.global + added }, input());
          }
        },
      ),
      Math.ceil(RUNS / 2),
    );
    t.diagnostic(`${tally}; bodies without a request id: ${JSON.stringify([...framingBodies])}`);
  });

  test("broken framing: bad, negative, duplicate or huge Content-Length, Content-Length with chunked, bad chunks", async (t) => {
    const body = JSON.stringify(sampleRequest());
    const n = utf8Bytes(body);
    const cases: Array<[string, string[], string]> = [
      ["non-numeric", ["Content-Length: abc"], body],
      ["negative", ["Content-Length: -5"], body],
      ["two different", [`Content-Length: ${n}`, `Content-Length: ${n + 1}`], body],
      ["with chunked", [`Content-Length: ${n}`, "Transfer-Encoding: chunked"], body],
      ["huge", ["Content-Length: 99999999999999"], body],
      ["plus sign", [`Content-Length: +${n}`], body],
      ["chunked, bad size", ["Transfer-Encoding: chunked"], `zz\r\n${body}\r\n0\r\n\r\n`],
      ["chunked, no end", ["Transfer-Encoding: chunked"], `${n.toString(16)}\r\n${body}\r\n`],
      ["chunked, over the limit", ["Transfer-Encoding: chunked"], `${(LIMIT + 10).toString(16)}\r\n${"x".repeat(LIMIT + 10)}\r\n0\r\n\r\n`],
      ["no Content-Length, no body framing", [], body],
    ];
    const tally = new Tally();
    for (const [, gw] of gateways()) {
      for (const [name, headers, payload] of cases) {
        const before = await books(gw);
        const out = await rawExchange(gw.url, httpRequest(gw.key, ["Content-Type: application/json", ...headers], payload), {
          after: "end",
          waitMs: 3000,
        });
        for (const r of out.responses) tally.add(r.status);
        checkResponses(out.responses, () => name);
        for (const r of out.responses) assert.notEqual(r.status, 200, name);
        assert.ok(out.closedByServer || out.responses.length > 0, `${name}: the server answers or closes`);
        assert.deepEqual(await books(gw), before, `${name}: nothing recorded or charged`);
        await assertUp(gw);
      }
    }
    t.diagnostic(`${tally}; bodies without a request id: ${JSON.stringify([...framingBodies])}`);
  });
});

describe("the process after the fuzz run", () => {
  test("still serves both gateways; RSS stable (< +100 MB)", async (t) => {
    for (const [, gw] of gateways()) {
      const res = await gw.decide(sampleRequest());
      assert.equal(res.status, 200);
      assertShape("decision", await res.json());
    }
    await settle();
    const rssAfter = rssMb();
    const heapAfter = heapMb();
    t.diagnostic(
      `RSS of the test process hosting both gateways: ${rssBefore.toFixed(1)} MB before, ${rssAfter.toFixed(1)} MB after (${(rssAfter - rssBefore).toFixed(1)} MB); ` +
        `V8 heap used ${heapBefore.toFixed(1)} → ${heapAfter.toFixed(1)} MB (gc ${gc ? "run before each reading" : "not available"})`,
    );
    assert.ok(rssAfter - rssBefore < 100, `RSS grew by ${(rssAfter - rssBefore).toFixed(1)} MB`);
    assert.deepEqual(Object.getOwnPropertyNames(Object.prototype).sort(), protoBefore);
  });
});
