/**
 * Shared pieces of the fuzz suite: request generators and mutators (fast-check), and the check every
 * fuzzed exchange must pass: never a 5xx, every error body an ErrorResponse, every 200 a DecisionResponse,
 * and only a 200 adds a usage record, a model call, a charge (paid) or a day-counter unit (preview).
 */
import assert from "node:assert/strict";
import { connect } from "node:net";
import fc from "fast-check";
import { utcDay } from "../../src/domain/utc-day.ts";
import type { SqliteStore } from "../../src/store/sqlite/sqlite-store.ts";
import { assertShape } from "../support/contract-check.ts";
import type { Gateway } from "../support/gateway-harness.ts";

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** Sets an own enumerable property, so that `__proto__` is an ordinary key (as JSON.parse makes it). */
export function setOwn(target: Record<string, unknown>, key: string, value: unknown): void {
  Object.defineProperty(target, key, { value, enumerable: true, writable: true, configurable: true });
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

/** Deep copy that keeps `__proto__` own keys. */
export function clone<T>(v: T): T {
  return JSON.parse(JSON.stringify(v)) as T;
}

// ── generators ───────────────────────────────────────────────────────────────────────────────

/** Names that break naive code: prototype members, path separators, unicode, the empty string. */
export const trickyName = fc.constantFrom(
  "__proto__",
  "constructor",
  "prototype",
  "toString",
  "hasOwnProperty",
  "valueOf",
  "a.b",
  "0",
  "",
  " ",
  "é",
  "🙂",
  "\u0000",
  "null",
  "length",
);
const name = fc.oneof(
  { weight: 4, arbitrary: fc.string({ minLength: 1, maxLength: 12 }) },
  { weight: 1, arbitrary: trickyName.filter((s) => s.length > 0) },
);

const anyJson = fc.jsonValue({ maxDepth: 3 }) as fc.Arbitrary<Json>;

const choice = fc.record({
  type: fc.constant("choice"),
  instructions: fc.option(anyJson, { nil: undefined }),
  criteria: fc.dictionary(name, anyJson, { minKeys: 1, maxKeys: 6 }),
});
const score = fc.record({
  type: fc.constant("score"),
  instructions: fc.option(anyJson, { nil: undefined }),
  criteria: fc.array(anyJson, { minLength: 1, maxLength: 6 }),
});
const noul = fc.record({
  type: fc.constant("noul"),
  instructions: fc.option(anyJson, { nil: undefined }),
  criteria: fc.option(fc.oneof(fc.constant(null), fc.record({ true: anyJson, false: anyJson }, { requiredKeys: [] })), { nil: undefined }),
});

/** A request the contract accepts (1 to 5 questions of any type, any state, model omitted or null). */
export const validRequest: fc.Arbitrary<Record<string, unknown>> = fc
  .record({
    state: anyJson,
    questions: fc.dictionary(name, fc.oneof(choice, score, noul), { minKeys: 1, maxKeys: 5 }),
    model: fc.option(fc.constantFrom(null, "fake-small", "jev-latest"), { nil: undefined }),
  })
  .map((r) => {
    // Rebuild with own properties only (dictionary may have made `__proto__` a real prototype link) and drop undefined.
    const out: Record<string, unknown> = {};
    setOwn(out, "state", r.state);
    const questions: Record<string, unknown> = {};
    for (const id of Object.keys(r.questions)) {
      const q: Record<string, unknown> = {};
      for (const [k, v] of Object.entries(r.questions[id]!)) if (v !== undefined) setOwn(q, k, v);
      setOwn(questions, id, q);
    }
    setOwn(out, "questions", questions);
    if (r.model !== undefined) setOwn(out, "model", r.model);
    return clone(out);
  });

/** Every path (list of keys) to a value in a JSON document, the root included. */
export function pathsOf(doc: unknown, limit = 400): string[][] {
  const out: string[][] = [[]];
  const walk = (v: unknown, path: string[]) => {
    if (out.length >= limit) return;
    if (Array.isArray(v)) {
      for (const [i, x] of v.entries()) {
        out.push([...path, String(i)]);
        walk(x, [...path, String(i)]);
      }
    } else if (isObject(v)) {
      for (const k of Object.keys(v)) {
        out.push([...path, k]);
        walk(v[k], [...path, k]);
      }
    }
  };
  walk(doc, []);
  return out;
}

function parentOf(doc: unknown, path: string[]): { parent: unknown; key: string } | null {
  if (path.length === 0) return null;
  let at: unknown = doc;
  for (const k of path.slice(0, -1)) at = (at as Record<string, unknown>)[k];
  return { parent: at, key: path[path.length - 1]! };
}

function put(doc: unknown, path: string[], value: unknown): unknown {
  const where = parentOf(doc, path);
  if (!where) return value;
  if (Array.isArray(where.parent)) where.parent[Number(where.key)] = value;
  else setOwn(where.parent as Record<string, unknown>, where.key, value);
  return doc;
}

/** One mutation of a request document, chosen and parameterised by fast-check. */
export type Mutation =
  | { kind: "replace"; at: number; value: Json }
  | { kind: "delete"; at: number }
  | { kind: "add"; at: number; key: string; value: Json }
  | { kind: "huge"; at: number; bytes: number; unit: string }
  | { kind: "nest"; at: number; depth: number; array: boolean }
  | { kind: "questions"; count: number };

export const mutation: fc.Arbitrary<Mutation> = fc.oneof(
  fc.record({
    kind: fc.constant("replace" as const),
    at: fc.nat(),
    value: fc.oneof(anyJson, fc.constantFrom<Json>(null, 0, -1, 1e308, "", "noul", "choice", "score", [], {}, true)),
  }),
  fc.record({ kind: fc.constant("delete" as const), at: fc.nat() }),
  fc.record({
    kind: fc.constant("add" as const),
    at: fc.nat(),
    key: fc.oneof(
      trickyName,
      fc.string({ maxLength: 8 }),
      fc.constantFrom("temperature", "messages", "stream", "tools", "type", "criteria", "state"),
    ),
    value: anyJson,
  }),
  fc.record({
    kind: fc.constant("huge" as const),
    at: fc.nat(),
    bytes: fc.integer({ min: 1000, max: 9000 }),
    unit: fc.constantFrom("a", "é", "€", "🙂", "\\", '"', "\u0000"),
  }),
  // At most 3 × 1000 levels: deeper documents could not be built and sent with JSON.stringify by the test itself
  // (8 KiB hold ~4,000 levels at most; deeper nesting is tested with the default limit, from raw text).
  fc.record({ kind: fc.constant("nest" as const), at: fc.nat(), depth: fc.integer({ min: 1, max: 1000 }), array: fc.boolean() }),
  fc.record({ kind: fc.constant("questions" as const), count: fc.constantFrom(0, 1, 32, 33, 40) }),
);

/** A string of about `bytes` UTF-8 bytes once JSON-encoded. */
function hugeString(bytes: number, unit: string): string {
  const per = Buffer.byteLength(JSON.stringify(unit), "utf8") - 2;
  return unit.repeat(Math.max(1, Math.floor(bytes / Math.max(1, per))));
}

function nested(depth: number, array: boolean, inner: Json): Json {
  let v: Json = inner;
  for (let i = 0; i < depth; i++) v = array ? [v] : { a: v };
  return v;
}

export function applyMutation(doc: unknown, m: Mutation): unknown {
  if (m.kind === "questions") {
    if (!isObject(doc)) return doc;
    const questions: Record<string, unknown> = {};
    for (let i = 0; i < m.count; i++) setOwn(questions, `q${i}`, { type: "noul" });
    setOwn(doc, "questions", questions);
    return doc;
  }
  const paths = pathsOf(doc);
  const path = paths[m.at % paths.length]!;
  switch (m.kind) {
    case "replace":
      return put(doc, path, clone(m.value));
    case "delete": {
      const where = parentOf(doc, path);
      if (!where) return doc;
      if (Array.isArray(where.parent)) where.parent.splice(Number(where.key), 1);
      else delete (where.parent as Record<string, unknown>)[where.key];
      return doc;
    }
    case "add": {
      // Into the object at the path, or its parent object.
      let target: unknown = path.reduce<unknown>((at, k) => (at as Record<string, unknown>)[k], doc);
      if (!isObject(target)) target = parentOf(doc, path)?.parent;
      if (isObject(target)) setOwn(target, m.key, clone(m.value));
      return doc;
    }
    case "huge":
      return put(doc, path, hugeString(m.bytes, m.unit));
    case "nest": {
      const current = path.reduce<unknown>((at, k) => (at as Record<string, unknown>)[k], doc) as Json;
      return put(doc, path, nested(m.depth, m.array, current));
    }
  }
}

/**
 * JSON text of `doc` in which the object at the `at`-th object position (mod their count) repeats its first
 * key: `"k":extra` is written before the original pair (`first`: the original, later, wins) or after it.
 */
export function stringifyWithDuplicate(doc: unknown, at: number, extra: Json, first: boolean): string {
  let objects = 0;
  const count = (v: unknown) => {
    if (Array.isArray(v)) v.forEach(count);
    else if (isObject(v)) {
      if (Object.keys(v).length > 0) objects++;
      Object.values(v).forEach(count);
    }
  };
  count(doc);
  const target = objects === 0 ? -1 : at % objects;
  let seen = 0;
  const write = (v: unknown): string => {
    if (Array.isArray(v)) return `[${v.map(write).join(",")}]`;
    if (!isObject(v)) return JSON.stringify(v) ?? "null";
    const keys = Object.keys(v);
    const pairs = keys.map((k) => `${JSON.stringify(k)}:${write(v[k])}`);
    if (keys.length > 0 && seen++ === target) {
      const dup = `${JSON.stringify(keys[0])}:${JSON.stringify(extra)}`;
      if (first) pairs.unshift(dup);
      else pairs.splice(1, 0, dup);
    }
    return `{${pairs.join(",")}}`;
  };
  return write(doc);
}

// ── the check of one exchange ────────────────────────────────────────────────────────────────

interface Books {
  usage: number;
  calls: number;
  balance: { available: number; reserved: number; spent: number; granted: number };
  day: { org: number; global: number };
}

export async function books(gw: Gateway): Promise<Books> {
  const row = (gw.store as SqliteStore).db
    .prepare<[string], { n: number }>("SELECT count(*) AS n FROM usage_records WHERE org_id = ?")
    .get(gw.orgId)!;
  return {
    usage: row.n,
    calls: gw.fake!.calls.decide,
    balance: await gw.store.getBalance(gw.orgId),
    day: await gw.store.previewUsage(gw.orgId, utcDay(Date.now())),
  };
}

export interface Outcome {
  status: number;
  body: unknown;
  text: string;
}

/** Tally of statuses seen, for the test's diagnostics. */
export class Tally {
  readonly counts = new Map<number, number>();
  add(status: number): void {
    this.counts.set(status, (this.counts.get(status) ?? 0) + 1);
  }
  toString(): string {
    return [...this.counts]
      .sort((a, b) => a[0] - b[0])
      .map(([s, n]) => `${s}×${n}`)
      .join(" ");
  }
}

/**
 * Sends one request and checks the properties of every fuzzed exchange; returns what came back.
 * `sample` names the input in failure messages (the minimal reproduction after shrinking).
 */
export async function checkedExchange(gw: Gateway, send: () => Promise<Response>, sample: () => string, tally?: Tally): Promise<Outcome> {
  const before = await books(gw);
  const res = await send();
  const text = await res.text();
  tally?.add(res.status);
  const where = () => `status ${res.status}: ${text.slice(0, 300)}\ninput: ${sample().slice(0, 600)}`;
  assert.ok(res.status < 500, `never a 5xx for client input — ${where()}`);
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    assert.fail(`the body is JSON — ${where()}`);
  }
  const after = await books(gw);
  const paid = gw.config.serviceMode === "paid";
  if (res.status === 200) {
    assertShape("decision", body);
    const cost = (body as { usage: { cost_microusd: number } }).usage.cost_microusd;
    assert.equal(after.usage, before.usage + 1, `one usage record for a 200 — ${where()}`);
    assert.equal(after.calls, before.calls + 1, `one model call for a 200 — ${where()}`);
    if (paid) {
      assert.deepEqual(
        after.balance,
        {
          available: before.balance.available - cost,
          reserved: before.balance.reserved,
          spent: before.balance.spent + cost,
          granted: before.balance.granted,
        },
        `charged exactly the 200's cost — ${where()}`,
      );
    } else {
      assert.equal(cost, 0);
      assert.deepEqual(
        after.day,
        { org: before.day.org + 1, global: before.day.global + 1 },
        `one day-counter unit for a 200 — ${where()}`,
      );
    }
  } else {
    assert.ok(res.status >= 400, `an error status — ${where()}`);
    assertShape("error", body);
    assert.deepEqual(after, before, `nothing recorded, called, charged or counted for a rejected request — ${where()}`);
  }
  return { status: res.status, body, text };
}

/** POST /v1/systemone with raw bytes and headers (the key added), as fetch sends it. */
export function post(
  gw: Gateway,
  body: string | Uint8Array,
  headers: Record<string, string> = { "content-type": "application/json" },
): Promise<Response> {
  return fetch(`${gw.url}/v1/systemone`, { method: "POST", headers: { authorization: `Bearer ${gw.key}`, ...headers }, body });
}

/**
 * fc.assert with the failing assertion's own message in the error (fast-check alone reports only the
 * counterexample), shortened so a huge generated body cannot flood the report.
 */
export async function runProperty<T>(property: fc.IAsyncProperty<T>, numRuns: number): Promise<void> {
  const details = await fc.check(property, { numRuns });
  if (!details.failed) return;
  const error = details.errorInstance instanceof Error ? details.errorInstance.message : String(details.errorInstance);
  let example: string;
  try {
    example = fc.stringify(details.counterexample);
  } catch {
    example = "(too deep to print)";
  }
  throw new Error(
    `Property failed after ${details.numRuns} runs (seed ${details.seed}, path ${JSON.stringify(details.counterexamplePath)}, shrunk ${details.numShrinks} times)\n` +
      `${error.slice(0, 3000)}\ncounterexample: ${example.slice(0, 3000)}`,
  );
}

export const utf8Bytes = (s: string) => Buffer.byteLength(s, "utf8");

// ── raw HTTP over node:net ───────────────────────────────────────────────────────────────────

export interface RawResponse {
  status: number;
  headers: Record<string, string>;
  body: string;
}

export interface RawExchange {
  responses: RawResponse[];
  /** The server closed (or reset) the connection before `waitMs` ran out. */
  closedByServer: boolean;
  /** Bytes received that do not form a complete response. */
  trailing: string;
}

/** Splits what a server sent on one connection into responses (Content-Length framing, as the gateway sends). */
export function parseResponses(data: Buffer): { responses: RawResponse[]; trailing: string } {
  const responses: RawResponse[] = [];
  let at = 0;
  for (;;) {
    const end = data.indexOf("\r\n\r\n", at);
    if (end < 0) break;
    const head = data.subarray(at, end).toString("latin1").split("\r\n");
    const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(head[0] ?? "")?.[1]);
    const headers: Record<string, string> = {};
    for (const line of head.slice(1)) {
      const i = line.indexOf(":");
      if (i > 0) headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
    }
    if (/chunked/i.test(headers["transfer-encoding"] ?? "")) {
      // Chunked (Node's own 400 for a request without Host is sent this way).
      let p = end + 4;
      const parts: Buffer[] = [];
      let complete = false;
      for (;;) {
        const lineEnd = data.indexOf("\r\n", p);
        if (lineEnd < 0) break;
        const size = parseInt(data.subarray(p, lineEnd).toString("latin1"), 16);
        if (!Number.isFinite(size) || lineEnd + 2 + size + 2 > data.length) break;
        parts.push(data.subarray(lineEnd + 2, lineEnd + 2 + size));
        p = lineEnd + 2 + size + 2;
        if (size === 0) {
          complete = true;
          break;
        }
      }
      if (!complete) break;
      responses.push({ status, headers, body: Buffer.concat(parts).toString("utf8") });
      at = p;
      continue;
    }
    const length = Number(headers["content-length"] ?? 0);
    if (end + 4 + length > data.length) break;
    responses.push({ status, headers, body: data.subarray(end + 4, end + 4 + length).toString("utf8") });
    at = end + 4 + length;
  }
  return { responses, trailing: data.subarray(at).toString("latin1") };
}

/**
 * Writes `bytes` on a fresh connection to the gateway, then (`after`) half-closes, destroys after
 * `holdMs`, or just waits; collects whatever comes back for at most `waitMs`.
 */
export function rawExchange(
  url: string,
  bytes: Buffer,
  options: { after: "end" | "destroy" | "wait"; holdMs?: number; waitMs?: number },
): Promise<RawExchange> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve) => {
    const socket = connect(Number(port), hostname);
    const chunks: Buffer[] = [];
    let closedByServer = false;
    let done = false;
    const finish = () => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      socket.destroy();
      resolve({ ...parseResponses(Buffer.concat(chunks)), closedByServer });
    };
    socket.on("data", (d) => chunks.push(d));
    socket.on("error", () => undefined);
    socket.on("end", () => {
      closedByServer = true;
    });
    socket.on("close", () => {
      if (!done && options.after !== "destroy") closedByServer = true;
      finish();
    });
    socket.write(bytes);
    if (options.after === "end") socket.end();
    if (options.after === "destroy") setTimeout(() => socket.destroy(), options.holdMs ?? 20);
    const timer = setTimeout(finish, options.waitMs ?? 2000);
  });
}

export function httpRequest(key: string, headers: string[], body: Buffer | string): Buffer {
  const head = ["POST /v1/systemone HTTP/1.1", "Host: 127.0.0.1", `Authorization: Bearer ${key}`, ...headers].join("\r\n");
  return Buffer.concat([Buffer.from(`${head}\r\n\r\n`, "latin1"), typeof body === "string" ? Buffer.from(body, "utf8") : body]);
}
