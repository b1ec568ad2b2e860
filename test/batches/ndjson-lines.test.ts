/**
 * The NDJSON line splitter: the same lines whatever the chunking, line endings, blank lines, the limits (413 naming
 * the line), invalid UTF-8, the SHA-256 of the input, and memory bounded by one line and one chunk.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { describe, test } from "node:test";
import v8 from "node:v8";
import vm from "node:vm";
import fc from "fast-check";
import { type NdjsonLine, NdjsonLineTooLongError, NdjsonTooLargeError, ndjsonLines } from "../../src/batches/ndjson-lines.ts";
import { ServiceError } from "../../src/domain/errors.ts";

const LIMITS = { maxLineBytes: 1024, maxTotalBytes: 1024 * 1024 };

async function* chunksOf(...chunks: (string | Uint8Array)[]): AsyncGenerator<Uint8Array> {
  for (const chunk of chunks) yield typeof chunk === "string" ? Buffer.from(chunk, "utf8") : chunk;
}

/** `bytes` cut at the given offsets. */
function cutAt(bytes: Buffer, offsets: number[]): Buffer[] {
  const points = [...new Set(offsets.map((o) => o % (bytes.length + 1)))].sort((a, b) => a - b);
  const out: Buffer[] = [];
  let from = 0;
  for (const p of points) {
    out.push(bytes.subarray(from, p));
    from = p;
  }
  out.push(bytes.subarray(from));
  return out;
}

async function linesOf(limits: typeof LIMITS, ...chunks: (string | Uint8Array)[]): Promise<NdjsonLine[]> {
  const out: NdjsonLine[] = [];
  for await (const line of ndjsonLines(chunksOf(...chunks), limits)) out.push(line);
  return out;
}

async function refusal(limits: typeof LIMITS, ...chunks: (string | Uint8Array)[]): Promise<{ error: unknown; before: NdjsonLine[] }> {
  const before: NdjsonLine[] = [];
  try {
    for await (const line of ndjsonLines(chunksOf(...chunks), limits)) before.push(line);
  } catch (error) {
    return { error, before };
  }
  assert.fail("the input was not refused");
}

/** What the lines of a whole input are, computed the obvious way. */
function expectedLines(text: string): NdjsonLine[] {
  const parts = text.split("\n");
  if (parts.at(-1) === "") parts.pop();
  return parts
    .map((part, i) => ({ line: i + 1, text: part.endsWith("\r") ? part.slice(0, -1) : part }))
    .filter((l) => !/^[ \t\r]*$/.test(l.text));
}

describe("ndjson lines", () => {
  test("\\n and \\r\\n endings, blank lines counted but not yielded, a last line without an ending", async () => {
    const lines = await linesOf(LIMITS, '{"a":1}\n\n{"b":2}\r\n  \t\r\n\r\n {"c":3} \n{"d":4}');
    assert.deepEqual(lines, [
      { line: 1, text: '{"a":1}' },
      { line: 3, text: '{"b":2}' },
      { line: 6, text: ' {"c":3} ' },
      { line: 7, text: '{"d":4}' },
    ]);
    assert.deepEqual(await linesOf(LIMITS, "x\n"), [{ line: 1, text: "x" }]);
    assert.deepEqual(await linesOf(LIMITS, "x\r\n", "\r\n"), [{ line: 1, text: "x" }]);
    assert.deepEqual(await linesOf(LIMITS), []);
    assert.deepEqual(await linesOf(LIMITS, "", "\n\n", ""), []);
  });

  test("a line split across chunks, a \\r\\n split between two chunks, a character split between chunks", async () => {
    const euro = Buffer.from("€", "utf8");
    const lines = await linesOf(LIMITS, "ab", "c\r", "\nd", euro.subarray(0, 1), euro.subarray(1, 2), euro.subarray(2), "e");
    assert.deepEqual(lines, [
      { line: 1, text: "abc" },
      { line: 2, text: "d€e" },
    ]);
  });

  test("property: the same lines, bytes and SHA-256 wherever the input is cut", async () => {
    const lineText = fc.oneof(
      fc.string({ unit: "grapheme", maxLength: 40 }).map((s) => s.replace(/[\r\n]/g, "")),
      fc.constantFrom("", " ", "\t", '{"custom_id":"x"}', "é€🙂", "\r"),
    );
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.tuple(lineText, fc.constantFrom("\n", "\r\n")), { maxLength: 20 }),
        fc.boolean(),
        fc.array(fc.nat(), { maxLength: 30 }),
        async (parts, lastEnds, cuts) => {
          let text = parts.map(([line, end]) => line + end).join("");
          if (!lastEnds && parts.length > 0) text = text.replace(/\r?\n$/, "");
          const bytes = Buffer.from(text, "utf8");
          const reader = ndjsonLines(chunksOf(...cutAt(bytes, cuts)), LIMITS);
          const lines: NdjsonLine[] = [];
          for await (const line of reader) lines.push(line);
          assert.deepEqual(lines, expectedLines(text));
          assert.equal(reader.bytes, bytes.length);
          assert.equal(reader.sha256, createHash("sha256").update(bytes).digest("hex"));
        },
      ),
      { numRuns: 300 },
    );
  });

  test("a UTF-8 byte order mark is dropped at the start of the input only", async () => {
    const bom = Buffer.from([0xef, 0xbb, 0xbf]);
    assert.deepEqual(await linesOf(LIMITS, bom.subarray(0, 2), bom.subarray(2), "{}\n", bom, "{}\n"), [
      { line: 1, text: "{}" },
      { line: 2, text: "\uFEFF{}" },
    ]);
  });

  test("invalid UTF-8: the line comes with text null, the lines after it are read", async () => {
    const lines = await linesOf(LIMITS, "a\n", Buffer.from([0x7b, 0xff, 0x7d, 0x0a]), "\n", Buffer.from([0xe2, 0x82]), "\nb");
    assert.deepEqual(lines, [
      { line: 1, text: "a" },
      { line: 2, text: null },
      { line: 4, text: null },
      { line: 5, text: "b" },
    ]);
  });

  test("a line over maxLineBytes is a 413 naming it, in one chunk or across chunks; the line ending is not counted", async () => {
    const limits = { maxLineBytes: 10, maxTotalBytes: 1000 };
    const ten = "0123456789";
    assert.deepEqual(await linesOf(limits, `${ten}\n${ten}\r\n${ten}`), [
      { line: 1, text: ten },
      { line: 2, text: ten },
      { line: 3, text: ten },
    ]);
    assert.deepEqual(await linesOf(limits, `${ten}\r`, "\n"), [{ line: 1, text: ten }]);
    for (const chunks of [[`a\n\n${ten}x\nb\n`], ["a\n\n01234", "56789", "x", "\nb\n"], ["a\n\n", `${ten}x`], ["a\n\n", `${ten}\rx\n`]]) {
      const { error, before } = await refusal(limits, ...chunks);
      assert.ok(error instanceof NdjsonLineTooLongError, String(chunks));
      assert.ok(error instanceof ServiceError);
      assert.equal(error.status, 413);
      assert.equal(error.line, 3);
      assert.match(error.detail!, /^Line 3 is longer than max_request_bytes \(10 bytes\)\.$/);
      assert.deepEqual(before, [{ line: 1, text: "a" }]);
    }
  });

  test("an input over maxTotalBytes is a 413 once the limit is passed, nothing more is read", async () => {
    const limits = { maxLineBytes: 100, maxTotalBytes: 20 };
    assert.equal((await linesOf(limits, "0123456789\n", "01234567\n")).length, 2);
    let readAfter = false;
    async function* source() {
      yield Buffer.from("0123456789\n");
      yield Buffer.from("0123456789\n");
      readAfter = true;
      yield Buffer.from("x\n");
    }
    const before: NdjsonLine[] = [];
    await assert.rejects(
      async () => {
        for await (const line of ndjsonLines(source(), limits)) before.push(line);
      },
      (error: unknown) =>
        error instanceof NdjsonTooLargeError && error.status === 413 && /max_batch_bytes \(20 bytes\)/.test(error.detail!),
    );
    assert.deepEqual(before, [{ line: 1, text: "0123456789" }]);
    assert.equal(readAfter, false);
  });

  test("the SHA-256 is known only after the last line; an input is read once", async () => {
    const reader = ndjsonLines(chunksOf("a\nb\n"), LIMITS);
    assert.throws(() => reader.sha256);
    for await (const _ of reader) assert.throws(() => reader.sha256);
    assert.equal(reader.sha256, createHash("sha256").update("a\nb\n").digest("hex"));
    await assert.rejects(async () => {
      for await (const _ of reader);
    });
  });

  test("memory: 50 MB of lines in 64 KiB chunks keep the memory within a few MB of where it started", async () => {
    const gc: () => void =
      (globalThis as { gc?: () => void }).gc ??
      (() => {
        v8.setFlagsFromString("--expose-gc");
        return vm.runInNewContext("gc") as () => void;
      })();
    const line = `${JSON.stringify({ custom_id: "row-000000", state: { text: "x".repeat(300) }, questions: { q: { type: "noul" } } })}\n`;
    const TOTAL = 50 * 1024 * 1024;
    const CHUNK = 64 * 1024;
    const lineBytes = Buffer.byteLength(line);
    const lineCount = Math.ceil(TOTAL / lineBytes);
    // The input is made as it is read: the test itself holds one chunk at a time.
    async function* input() {
      const pattern = Buffer.from(line.repeat(Math.ceil((2 * CHUNK) / lineBytes) + 1));
      let offset = 0;
      const total = lineCount * lineBytes;
      while (offset < total) {
        const at = offset % lineBytes;
        const size = Math.min(CHUNK, total - offset);
        yield Buffer.from(pattern.subarray(at, at + size));
        offset += size;
      }
    }
    // Buffers live outside the JavaScript heap: both are counted.
    const used = () => process.memoryUsage().heapUsed + process.memoryUsage().external;
    gc();
    const heapBefore = used();
    let highest = 0;
    let count = 0;
    const reader = ndjsonLines(input(), { maxLineBytes: 1024 * 1024, maxTotalBytes: 200 * 1024 * 1024 });
    for await (const { text } of reader) {
      count++;
      assert.equal(text!.length, lineBytes - 1);
      if (count % 20_000 === 0) {
        gc();
        highest = Math.max(highest, used() - heapBefore);
      }
    }
    gc();
    highest = Math.max(highest, used() - heapBefore);
    assert.equal(count, lineCount);
    assert.equal(reader.bytes, lineCount * lineBytes);
    assert.ok(reader.bytes >= TOTAL);
    assert.ok(highest < 8 * 1024 * 1024, `memory grew by ${(highest / 2 ** 20).toFixed(1)} MB while reading 50 MB`);
  });
});
