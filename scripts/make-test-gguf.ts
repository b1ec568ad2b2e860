/**
 * Writes a small, valid GGUF v3 language model with seeded random weights: a test fixture for the
 * embedded engine (src/models/llama/). Dependency-free; deterministic (same options → same bytes).
 *
 * Layout (ggml docs/gguf.md): header (magic "GGUF", version 3, tensor count, metadata count), the
 * metadata key/value pairs, the tensor infos (name, dimensions innermost first, type, offset from the
 * start of the data section), padding to `general.alignment`, the tensor data (each tensor aligned).
 *
 * The model: architecture `llama`, a SentencePiece vocabulary (`tokenizer.ggml.model = "llama"`) of
 * `<unk>`, `<s>`, `</s>`, the 256 byte tokens, ChatML control tokens, "▁", the printable ASCII
 * characters alone and after "▁", (by default) the 676 two-letter labels "AA" … "ZZ", and a few whole
 * words with all their prefixes (so SentencePiece merges reach " yes", "Yes", " A" …). A ChatML
 * template is stored in `tokenizer.chat_template`. A random-weight model answers with noise: it is a
 * test fixture, never a decision model.
 *
 *   npx tsx scripts/make-test-gguf.ts out.gguf [--few-labels] [--seed N] [--realistic]
 */
import { closeSync, openSync, writeSync } from "node:fs";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { mulberry32 } from "../test/support/seeded-random.ts";

export type TestWeightType = "F32" | "F16" | "Q8_0";

export interface TestGgufOptions {
  /** PRNG seed of the weights. Default 1. */
  seed?: number;
  /** Transformer blocks. Default 2. */
  layers?: number;
  /** Embedding width (a multiple of 32 for Q8_0). Default 64. */
  width?: number;
  /** Attention heads. Default 4. */
  heads?: number;
  /** Key/value heads (grouped-query attention). Default `heads`. */
  kvHeads?: number;
  /** Feed-forward width. Default 2 × width. */
  feedForward?: number;
  /** `llama.context_length` (the training context). Default 4096. */
  contextLength?: number;
  /** Type of the 2-D weight tensors (norms stay F32). Default "F32". */
  weightType?: TestWeightType;
  /**
   * "many" (default): the vocabulary has the two-letter tokens "AA" … "ZZ", so up to 702 options get
   * single-token labels. "few": it has not, so more than 26 options need multi-token labels.
   */
  labels?: "many" | "few";
  /** Pads the vocabulary with unused filler tokens up to this size (model-shaped benchmarks). */
  vocabSize?: number;
  /** Omits `output.weight`: llama.cpp then reuses `token_embd` (tied embeddings, as Qwen2.5-0.5B). Default false. */
  tieOutput?: boolean;
  /** Jinja chat template; null for none. Default {@link TEST_CHAT_TEMPLATE}. */
  chatTemplate?: string | null;
  /** `general.name`. Default "tds-test-model". */
  name?: string;
  /** Standard deviation of the logits, i.e. how peaked the next-token distribution is. Default 4. */
  logitSpread?: number;
  /** More whole words (with their prefixes), e.g. so a benchmark's text tokenizes word by word as with a real vocabulary. */
  extraWords?: string[];
}

export interface TestGgufInfo {
  path: string;
  bytes: number;
  vocabSize: number;
  parameters: number;
}

/** ChatML, as many instruct models use it. */
export const TEST_CHAT_TEMPLATE =
  "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/** Whole words added with all their prefixes, bare and after "▁". */
const WORDS = [
  "Yes",
  "No",
  "yes",
  "no",
  "true",
  "false",
  "state",
  "question",
  "answer",
  "option",
  "level",
  "choice",
  "score",
  "label",
  "Reply",
];

const GGUF_MAGIC = 0x46554747; // "GGUF" read as a little-endian u32
const GGUF_VERSION = 3;
const ALIGNMENT = 32;

// Metadata value types.
const T_UINT32 = 4;
const T_INT32 = 5;
const T_FLOAT32 = 6;
const T_BOOL = 7;
const T_STRING = 8;
const T_ARRAY = 9;

// ggml tensor types.
const GGML_F32 = 0;
const GGML_F16 = 1;
const GGML_Q8_0 = 8;
const Q8_0_BLOCK = 32;

// llama.cpp token types.
const TOKEN_NORMAL = 1;
const TOKEN_UNKNOWN = 2;
const TOKEN_CONTROL = 3;
const TOKEN_UNUSED = 5;
const TOKEN_BYTE = 6;

type MetaValue =
  | { type: "u32"; value: number }
  | { type: "i32"; value: number }
  | { type: "f32"; value: number }
  | { type: "bool"; value: boolean }
  | { type: "string"; value: string }
  | { type: "string[]"; value: string[] }
  | { type: "f32[]"; value: Float32Array }
  | { type: "i32[]"; value: Int32Array };

interface TensorSpec {
  name: string;
  /** ggml order: innermost (contiguous) dimension first. */
  dims: number[];
  type: number;
  fill: "ones" | { scale: number };
}

interface Vocab {
  tokens: string[];
  scores: Float32Array;
  types: Int32Array;
  bos: number;
  eos: number;
  unk: number;
}

export function buildTestVocab(options: Pick<TestGgufOptions, "labels" | "vocabSize" | "extraWords"> = {}): Vocab {
  const tokens: string[] = [];
  const types: number[] = [];
  const scores: number[] = [];
  const seen = new Set<string>();
  const add = (text: string, type: number, score = 0) => {
    if (seen.has(text)) return;
    seen.add(text);
    tokens.push(text);
    types.push(type);
    scores.push(score);
  };
  add("<unk>", TOKEN_UNKNOWN);
  add("<s>", TOKEN_CONTROL);
  add("</s>", TOKEN_CONTROL);
  for (let b = 0; b < 256; b++) add(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`, TOKEN_BYTE);
  add("<|im_start|>", TOKEN_CONTROL);
  add("<|im_end|>", TOKEN_CONTROL);
  // SentencePiece merges pick the candidate with the highest score: longer pieces score higher.
  const normal = (text: string) => add(text, TOKEN_NORMAL, Array.from(text).length - tokens.length * 1e-6);
  normal("▁");
  for (let c = 0x21; c <= 0x7e; c++) normal(String.fromCharCode(c));
  for (let c = 0x21; c <= 0x7e; c++) normal(`▁${String.fromCharCode(c)}`);
  if ((options.labels ?? "many") === "many") {
    for (let a = 0; a < 26; a++) {
      for (let b = 0; b < 26; b++) normal(String.fromCharCode(65 + a, 65 + b));
    }
  }
  for (const word of [...WORDS, ...(options.extraWords ?? [])]) {
    for (let i = 2; i <= word.length; i++) {
      normal(word.slice(0, i));
      normal(`▁${word.slice(0, i - 1)}`);
      normal(`▁${word.slice(0, i)}`);
    }
  }
  const target = options.vocabSize ?? 0;
  for (let i = 0; tokens.length < target; i++) add(`<unused_${i}>`, TOKEN_UNUSED, -1e9);
  return { tokens, scores: Float32Array.from(scores), types: Int32Array.from(types), bos: 1, eos: 2, unk: 0 };
}

export function writeTestGguf(path: string, options: TestGgufOptions = {}): TestGgufInfo {
  const seed = options.seed ?? 1;
  const layers = options.layers ?? 2;
  const width = options.width ?? 64;
  const heads = options.heads ?? 4;
  const kvHeads = options.kvHeads ?? heads;
  const ff = options.feedForward ?? width * 2;
  const weightType = options.weightType ?? "F32";
  const chatTemplate = options.chatTemplate === undefined ? TEST_CHAT_TEMPLATE : options.chatTemplate;
  if (width % heads !== 0 || heads % kvHeads !== 0) throw new Error("width must be a multiple of heads, heads of kvHeads");
  if (weightType === "Q8_0" && (width % Q8_0_BLOCK !== 0 || ff % Q8_0_BLOCK !== 0)) {
    throw new Error("Q8_0 needs width and feedForward to be multiples of 32");
  }
  const headDim = width / heads;
  const kvWidth = headDim * kvHeads;
  const vocab = buildTestVocab(options);
  const nVocab = vocab.tokens.length;

  const meta: Array<[string, MetaValue]> = [
    ["general.architecture", { type: "string", value: "llama" }],
    ["general.name", { type: "string", value: options.name ?? "tds-test-model" }],
    ["general.alignment", { type: "u32", value: ALIGNMENT }],
    ["general.file_type", { type: "u32", value: weightType === "F32" ? 0 : weightType === "F16" ? 1 : 7 }],
    ["general.quantization_version", { type: "u32", value: 2 }],
    ["llama.context_length", { type: "u32", value: options.contextLength ?? 4096 }],
    ["llama.embedding_length", { type: "u32", value: width }],
    ["llama.block_count", { type: "u32", value: layers }],
    ["llama.feed_forward_length", { type: "u32", value: ff }],
    ["llama.attention.head_count", { type: "u32", value: heads }],
    ["llama.attention.head_count_kv", { type: "u32", value: kvHeads }],
    ["llama.rope.dimension_count", { type: "u32", value: headDim }],
    ["llama.rope.freq_base", { type: "f32", value: 10000 }],
    ["llama.attention.layer_norm_rms_epsilon", { type: "f32", value: 1e-5 }],
    ["llama.vocab_size", { type: "u32", value: nVocab }],
    ["tokenizer.ggml.model", { type: "string", value: "llama" }],
    ["tokenizer.ggml.tokens", { type: "string[]", value: vocab.tokens }],
    ["tokenizer.ggml.scores", { type: "f32[]", value: vocab.scores }],
    ["tokenizer.ggml.token_type", { type: "i32[]", value: vocab.types }],
    ["tokenizer.ggml.bos_token_id", { type: "u32", value: vocab.bos }],
    ["tokenizer.ggml.eos_token_id", { type: "u32", value: vocab.eos }],
    ["tokenizer.ggml.unknown_token_id", { type: "u32", value: vocab.unk }],
    ["tokenizer.ggml.add_bos_token", { type: "bool", value: true }],
    ["tokenizer.ggml.add_eos_token", { type: "bool", value: false }],
  ];
  if (chatTemplate !== null) meta.push(["tokenizer.chat_template", { type: "string", value: chatTemplate }]);

  const wType = weightType === "F32" ? GGML_F32 : weightType === "F16" ? GGML_F16 : GGML_Q8_0;
  const matrix = (name: string, inner: number, outer: number, scale = 1 / Math.sqrt(inner)): TensorSpec => ({
    name,
    dims: [inner, outer],
    type: wType,
    fill: { scale },
  });
  const norm = (name: string): TensorSpec => ({ name, dims: [width], type: GGML_F32, fill: "ones" });
  // The logits are the normalised hidden state (unit scale per dimension) times the output rows.
  const outputScale = (options.logitSpread ?? 4) / Math.sqrt(width);
  const tensors: TensorSpec[] = [
    matrix("token_embd.weight", width, nVocab, options.tieOutput ? outputScale : 1),
    norm("output_norm.weight"),
  ];
  if (!options.tieOutput) tensors.push(matrix("output.weight", width, nVocab, outputScale));
  for (let l = 0; l < layers; l++) {
    tensors.push(
      norm(`blk.${l}.attn_norm.weight`),
      matrix(`blk.${l}.attn_q.weight`, width, width),
      matrix(`blk.${l}.attn_k.weight`, width, kvWidth),
      matrix(`blk.${l}.attn_v.weight`, width, kvWidth),
      matrix(`blk.${l}.attn_output.weight`, width, width),
      norm(`blk.${l}.ffn_norm.weight`),
      matrix(`blk.${l}.ffn_gate.weight`, width, ff),
      matrix(`blk.${l}.ffn_up.weight`, width, ff),
      matrix(`blk.${l}.ffn_down.weight`, ff, width),
    );
  }

  // Header, metadata and tensor infos.
  const head = new ByteWriter();
  head.u32(GGUF_MAGIC);
  head.u32(GGUF_VERSION);
  head.u64(tensors.length);
  head.u64(meta.length);
  for (const [key, value] of meta) {
    head.string(key);
    writeMeta(head, value);
  }
  let offset = 0;
  const offsets: number[] = [];
  let parameters = 0;
  for (const t of tensors) {
    const elements = t.dims.reduce((a, b) => a * b, 1);
    parameters += elements;
    offsets.push(offset);
    head.string(t.name);
    head.u32(t.dims.length);
    for (const d of t.dims) head.u64(d);
    head.u32(t.type);
    head.u64(offset);
    offset = alignUp(offset + tensorBytes(t.type, elements), ALIGNMENT);
  }
  head.padTo(ALIGNMENT);

  const fd = openSync(path, "w");
  let written = 0;
  try {
    written += writeAll(fd, head.toBuffer());
    const dataStart = written;
    tensors.forEach((t, index) => {
      const pad = dataStart + (offsets[index] as number) - written;
      if (pad > 0) written += writeAll(fd, Buffer.alloc(pad));
      const elements = t.dims.reduce((a, b) => a * b, 1);
      const rng = mulberry32(hashSeed(seed, t.name));
      written += writeTensorData(fd, t, elements, rng);
    });
    const end = dataStart + offset;
    if (end > written) written += writeAll(fd, Buffer.alloc(end - written));
  } finally {
    closeSync(fd);
  }
  return { path, bytes: written, vocabSize: nVocab, parameters };
}

/** Writes one tensor's data in chunks (large tensors never sit in memory whole); returns the bytes written. */
function writeTensorData(fd: number, t: TensorSpec, elements: number, rng: () => number): number {
  const scale = t.fill === "ones" ? 0 : t.fill.scale;
  let written = 0;
  const CHUNK = 1 << 18; // elements per chunk, a multiple of the Q8_0 block
  for (let start = 0; start < elements; start += CHUNK) {
    const n = Math.min(CHUNK, elements - start);
    if (t.type === GGML_F32) {
      const out = new Float32Array(n);
      for (let i = 0; i < n; i++) out[i] = t.fill === "ones" ? 1 : (rng() * 2 - 1) * scale * Math.sqrt(3);
      written += writeAll(fd, Buffer.from(out.buffer));
    } else if (t.type === GGML_F16) {
      const out = new Uint16Array(n);
      for (let i = 0; i < n; i++) out[i] = toHalf((rng() * 2 - 1) * scale * Math.sqrt(3));
      written += writeAll(fd, Buffer.from(out.buffer));
    } else {
      // Q8_0: blocks of 32 values, an F16 scale d then 32 int8 quants q; value = d × q.
      const blocks = n / Q8_0_BLOCK;
      const out = Buffer.alloc(blocks * 34);
      const quants = new Int8Array(out.buffer, out.byteOffset, out.length);
      const d = toHalf((scale * Math.sqrt(3)) / 127);
      for (let b = 0; b < blocks; b++) {
        const at = b * 34;
        out[at] = d & 0xff;
        out[at + 1] = d >>> 8;
        for (let i = 0; i < Q8_0_BLOCK; i += 4) {
          const r = (rng() * 0x100000000) >>> 0;
          for (let k = 0; k < 4; k++) quants[at + 2 + i + k] = (((r >>> (k * 8)) & 0xff) % 255) - 127;
        }
      }
      written += writeAll(fd, out);
    }
  }
  return written;
}

function tensorBytes(type: number, elements: number): number {
  if (type === GGML_F32) return elements * 4;
  if (type === GGML_F16) return elements * 2;
  return (elements / Q8_0_BLOCK) * 34;
}

function writeMeta(w: ByteWriter, v: MetaValue): void {
  switch (v.type) {
    case "u32":
      w.u32(T_UINT32);
      w.u32(v.value);
      return;
    case "i32":
      w.u32(T_INT32);
      w.i32(v.value);
      return;
    case "f32":
      w.u32(T_FLOAT32);
      w.f32(v.value);
      return;
    case "bool":
      w.u32(T_BOOL);
      w.u8(v.value ? 1 : 0);
      return;
    case "string":
      w.u32(T_STRING);
      w.string(v.value);
      return;
    case "string[]":
      w.u32(T_ARRAY);
      w.u32(T_STRING);
      w.u64(v.value.length);
      for (const s of v.value) w.string(s);
      return;
    case "f32[]":
      w.u32(T_ARRAY);
      w.u32(T_FLOAT32);
      w.u64(v.value.length);
      for (const x of v.value) w.f32(x);
      return;
    case "i32[]":
      w.u32(T_ARRAY);
      w.u32(T_INT32);
      w.u64(v.value.length);
      for (const x of v.value) w.i32(x);
      return;
  }
}

class ByteWriter {
  private chunks: Buffer[] = [];
  private length = 0;
  private push(b: Buffer): void {
    this.chunks.push(b);
    this.length += b.length;
  }
  u8(v: number): void {
    this.push(Buffer.from([v]));
  }
  u32(v: number): void {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(v);
    this.push(b);
  }
  i32(v: number): void {
    const b = Buffer.alloc(4);
    b.writeInt32LE(v);
    this.push(b);
  }
  f32(v: number): void {
    const b = Buffer.alloc(4);
    b.writeFloatLE(v);
    this.push(b);
  }
  u64(v: number): void {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(BigInt(v));
    this.push(b);
  }
  string(s: string): void {
    const bytes = Buffer.from(s, "utf8");
    this.u64(bytes.length);
    this.push(bytes);
  }
  padTo(alignment: number): void {
    const pad = alignUp(this.length, alignment) - this.length;
    if (pad > 0) this.push(Buffer.alloc(pad));
  }
  toBuffer(): Buffer {
    return Buffer.concat(this.chunks, this.length);
  }
}

function writeAll(fd: number, buf: Buffer): number {
  let done = 0;
  while (done < buf.length) done += writeSync(fd, buf, done, buf.length - done);
  return buf.length;
}

function alignUp(n: number, a: number): number {
  return Math.ceil(n / a) * a;
}

const HALF_SCRATCH = new Float32Array(1);
const HALF_BITS = new Uint32Array(HALF_SCRATCH.buffer);

/** IEEE 754 binary16 bits of a float (round to nearest even; enough for random weights). */
function toHalf(value: number): number {
  HALF_SCRATCH[0] = value;
  const bits = HALF_BITS[0] as number;
  const sign = (bits >>> 16) & 0x8000;
  const exp = (bits >>> 23) & 0xff;
  let mant = bits & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  let e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    mant = (mant | 0x800000) >>> (1 - e);
    return sign | ((mant + 0x1000 + ((mant >>> 13) & 1) - 1) >>> 13);
  }
  const rounded = mant + 0x1000 + ((mant >>> 13) & 1) - 1;
  if (rounded & 0x800000) {
    mant = 0;
    e += 1;
    if (e >= 0x1f) return sign | 0x7c00;
  } else {
    mant = rounded;
  }
  return sign | (e << 10) | (mant >>> 13);
}

function hashSeed(seed: number, name: string): number {
  let h = (2166136261 ^ seed) >>> 0;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 16777619) >>> 0;
  return h;
}

/** Shapes of Qwen2.5-0.5B (24 blocks, 896 wide, 14/2 heads, 4864 feed-forward, 151,936 tokens, tied output). */
export const REALISTIC_0_5B: TestGgufOptions = {
  layers: 24,
  width: 896,
  heads: 14,
  kvHeads: 2,
  feedForward: 4864,
  vocabSize: 151936,
  contextLength: 32768,
  tieOutput: true,
  weightType: "Q8_0",
  name: "random-qwen2.5-0.5b-shapes",
};

function main(argv: string[]): void {
  const args = argv.slice(2);
  const out = args.find((a) => !a.startsWith("--") && !/^\d+$/.test(a));
  if (!out) {
    console.error("usage: npx tsx scripts/make-test-gguf.ts OUT.gguf [--few-labels] [--seed N] [--realistic]");
    process.exitCode = 2;
    return;
  }
  const seedAt = args.indexOf("--seed");
  const options: TestGgufOptions = {
    ...(args.includes("--realistic") ? REALISTIC_0_5B : {}),
    ...(args.includes("--few-labels") ? { labels: "few" as const } : {}),
    ...(seedAt >= 0 ? { seed: Number(args[seedAt + 1]) } : {}),
  };
  const started = performance.now();
  const info = writeTestGguf(resolve(out), options);
  console.log(
    `wrote ${info.path}: ${info.bytes} bytes, ${info.vocabSize} tokens, ${info.parameters} parameters in ${Math.round(performance.now() - started)} ms`,
  );
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) main(process.argv);
