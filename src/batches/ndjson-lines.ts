import { createHash, type Hash } from "node:crypto";
import { ServiceError } from "../domain/errors.ts";

/** One non-blank line: its number (1-based, blank lines counted) and its text; `text` null when it is not valid UTF-8. */
export interface NdjsonLine {
  line: number;
  text: string | null;
}

export interface NdjsonLimits {
  /** The most bytes of one line, its line ending not counted (max_request_bytes). */
  maxLineBytes: number;
  /** The most bytes of the whole input (max_batch_bytes). */
  maxTotalBytes: number;
}

/** A line longer than maxLineBytes: 413, the rest of the input is not read. */
export class NdjsonLineTooLongError extends ServiceError {
  constructor(
    readonly line: number,
    readonly maxLineBytes: number,
  ) {
    super("body_too_large", `Line ${line} is longer than max_request_bytes (${maxLineBytes} bytes).`);
  }
}

/** An input longer than maxTotalBytes: 413, the rest of the input is not read. */
export class NdjsonTooLargeError extends ServiceError {
  constructor(readonly maxTotalBytes: number) {
    super("body_too_large", `Request body exceeds max_batch_bytes (${maxTotalBytes} bytes).`);
  }
}

const NEWLINE = 0x0a;
const CARRIAGE_RETURN = 0x0d;
const SPACE = 0x20;
const TAB = 0x09;
const UTF8_BOM = [0xef, 0xbb, 0xbf] as const;

/** The BOM is kept: only one at the very start of the input is dropped, as the API's body parser drops it. */
const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

function isBlank(bytes: Uint8Array): boolean {
  for (const b of bytes) if (b !== SPACE && b !== TAB && b !== CARRIAGE_RETURN) return false;
  return true;
}

function startsWithBom(bytes: Uint8Array): boolean {
  return bytes.length >= 3 && bytes[0] === UTF8_BOM[0] && bytes[1] === UTF8_BOM[1] && bytes[2] === UTF8_BOM[2];
}

/** The bytes of a line that spans chunks, copied out of them (a slice would keep each whole chunk alive). */
class PendingBytes {
  private buffer = Buffer.allocUnsafe(0);
  length = 0;

  /** `capacity`: the most bytes ever appended before the length is reset. */
  constructor(private readonly capacity: number) {}

  append(bytes: Uint8Array): void {
    const needed = this.length + bytes.length;
    if (needed > this.buffer.length) {
      const grown = Buffer.allocUnsafe(Math.min(this.capacity, Math.max(needed, this.buffer.length * 2, 4096)));
      this.buffer.copy(grown, 0, 0, this.length);
      this.buffer = grown;
    }
    this.buffer.set(bytes, this.length);
    this.length = needed;
  }

  view(): Buffer {
    return this.buffer.subarray(0, this.length);
  }
}

/**
 * The lines of an NDJSON input (a request stream), split as the bytes arrive: in memory at any time, one chunk and
 * at most one line (maxLineBytes + 1 bytes). Lines end with `\n` or `\r\n`; the last one may have no ending; blank
 * lines (spaces, tabs) are counted but not yielded. While the bytes pass, their SHA-256 and count are taken.
 *
 * Throws NdjsonLineTooLongError or NdjsonTooLargeError (both 413 body_too_large) as soon as a limit is passed; the
 * source is then left unread (its iterator is returned: whether that destroys the stream is the source's choice).
 */
export class NdjsonLines implements AsyncIterable<NdjsonLine> {
  private readonly hash: Hash = createHash("sha256");
  private digest: string | null = null;
  private started = false;
  /** Bytes read so far. */
  bytes = 0;

  constructor(
    private readonly source: AsyncIterable<Uint8Array>,
    private readonly limits: NdjsonLimits,
  ) {}

  /** SHA-256 (hex) of every byte of the input; only once the lines have been read to the end. */
  get sha256(): string {
    if (this.digest === null) throw new Error("NdjsonLines: the SHA-256 is known only after the last line");
    return this.digest;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<NdjsonLine> {
    if (this.started) throw new Error("NdjsonLines: an input is read once");
    this.started = true;
    const { maxLineBytes, maxTotalBytes } = this.limits;
    // A `\r` that may end the line is not counted against maxLineBytes until the next byte tells.
    const mostPending = maxLineBytes + 1;
    const pending = new PendingBytes(mostPending);
    /** Lines ended so far. */
    let ended = 0;
    const finish = (bytes: Uint8Array): NdjsonLine | null => {
      ended++;
      let content = bytes.length > 0 && bytes[bytes.length - 1] === CARRIAGE_RETURN ? bytes.subarray(0, -1) : bytes;
      if (content.length > maxLineBytes) throw new NdjsonLineTooLongError(ended, maxLineBytes);
      if (ended === 1 && startsWithBom(content)) content = content.subarray(3);
      if (isBlank(content)) return null;
      try {
        return { line: ended, text: utf8.decode(content) };
      } catch {
        return { line: ended, text: null };
      }
    };
    for await (const chunk of this.source) {
      this.bytes += chunk.length;
      if (this.bytes > maxTotalBytes) throw new NdjsonTooLargeError(maxTotalBytes);
      this.hash.update(chunk);
      let start = 0;
      for (;;) {
        const end = chunk.indexOf(NEWLINE, start);
        if (end < 0) {
          if (pending.length + chunk.length - start > mostPending) throw new NdjsonLineTooLongError(ended + 1, maxLineBytes);
          pending.append(chunk.subarray(start));
          break;
        }
        let line: NdjsonLine | null;
        if (pending.length === 0) {
          line = finish(chunk.subarray(start, end));
        } else {
          if (pending.length + end - start > mostPending) throw new NdjsonLineTooLongError(ended + 1, maxLineBytes);
          pending.append(chunk.subarray(start, end));
          line = finish(pending.view());
          pending.length = 0;
        }
        start = end + 1;
        if (line !== null) yield line;
      }
    }
    if (pending.length > 0) {
      const line = finish(pending.view());
      pending.length = 0;
      if (line !== null) yield line;
    }
    this.digest = this.hash.digest("hex");
  }
}

/** The lines of `source`; see NdjsonLines. */
export function ndjsonLines(source: AsyncIterable<Uint8Array>, limits: NdjsonLimits): NdjsonLines {
  return new NdjsonLines(source, limits);
}
