/**
 * Latency of the embedded engine (src/models/llama/) on generated GGUF models.
 *
 *   npx tsx bench/embedded-engine.ts               # the tiny test model (seconds)
 *   npx tsx bench/embedded-engine.ts --realistic   # also a ~0.5B-parameter model of Qwen2.5-0.5B shapes
 *                                                  # (random Q8_0 weights, ~530 MB written to a temp dir; ~1–2 min)
 * Options: --runs N (repetitions per measurement, default 5), --threads N (default: all cores).
 *
 * Prints, per model: load time, the latency of a one-question request (~200 prompt tokens), the
 * latency per extra question (slope over 1, 2, 4 and 8 questions), and the process's peak memory.
 * Random weights answer with noise: these are cost figures, not answer quality.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { availableParallelism, tmpdir } from "node:os";
import { join } from "node:path";
import { REALISTIC_0_5B, type TestGgufOptions, writeTestGguf } from "../scripts/make-test-gguf.ts";
import type { Question } from "../src/contract/decision.ts";
import { checkAnswers } from "../src/gateway/answer-check.ts";
import { openLlamaService } from "../src/models/llama/llama-service.ts";
import { SYSTEM_INSTRUCTIONS } from "../src/models/llama/prompt.ts";

const args = process.argv.slice(2);
const flag = (name: string) => args.includes(name);
const value = (name: string, fallback: number) => {
  const at = args.indexOf(name);
  return at >= 0 ? Number(args[at + 1]) : fallback;
};
const RUNS = value("--runs", 5);
const THREADS = value("--threads", availableParallelism());

const STATE = {
  ticket: "Hello, I was charged twice for my subscription this month and I would like the second payment refunded.",
  customer: { tier: "gold", since: "2021-04-02", country: "DE" },
  history: ["2026-10-01 invoice paid", "2026-11-01 invoice paid", "2026-11-01 invoice paid again"],
};

const QUESTION_KINDS: Question[] = [
  {
    type: "choice",
    instructions: "What is the ticket about?",
    criteria: { billing: "Payments and invoices", bug: "Something broken", other: null },
  },
  { type: "score", instructions: "How urgent is it?", criteria: ["not urgent", "soon", "today", "now"] },
  { type: "noul", instructions: "Does the customer ask for a refund?" },
];

function questions(n: number): Record<string, Question> {
  return Object.fromEntries(Array.from({ length: n }, (_, i) => [`q${i}`, QUESTION_KINDS[i % QUESTION_KINDS.length] as Question]));
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] as number;
}

async function benchModel(label: string, options: TestGgufOptions, runs: number): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "tds-bench-"));
  try {
    let t = performance.now();
    const info = writeTestGguf(join(dir, "model.gguf"), options);
    const writeMs = performance.now() - t;
    const rssBefore = process.memoryUsage().rss;
    t = performance.now();
    const service = openLlamaService({
      name: label,
      source: info.path,
      threads: THREADS,
      poolSize: 1,
      batchSize: 512,
      contextSize: 4096,
      logger: { info: () => {}, warn: (m) => console.warn(m), error: (m) => console.error(m) },
    });
    await service.ready();
    const loadMs = performance.now() - t;
    const rssLoaded = process.memoryUsage().rss;

    const call = (n: number) => ({ model: label, state: STATE, questions: questions(n) });
    const rendered = await service.render(call(1));
    const promptTokens = (rendered.questions[0]?.tokens.length ?? 0) as number;
    await service.decide(call(1), { timeoutMs: 600_000 }); // warm-up

    const rows: Array<{ n: number; ms: number; input: number }> = [];
    for (const n of [1, 2, 4, 8]) {
      const times: number[] = [];
      let input = 0;
      for (let r = 0; r < runs; r++) {
        const result = await service.decide(call(n), { timeoutMs: 600_000 });
        const checked = checkAnswers(call(n).questions, result.answers);
        if (!checked.ok) throw new Error(checked.problem);
        times.push(result.latencyMs);
        input = result.usage.input_tokens;
      }
      rows.push({ n, ms: median(times), input });
    }
    // Least-squares slope of latency over the number of questions.
    const mx = rows.reduce((a, r) => a + r.n, 0) / rows.length;
    const my = rows.reduce((a, r) => a + r.ms, 0) / rows.length;
    const slope = rows.reduce((a, r) => a + (r.n - mx) * (r.ms - my), 0) / rows.reduce((a, r) => a + (r.n - mx) ** 2, 0);
    const rssServing = process.memoryUsage().rss;
    await service.close();

    console.log(`\n## ${label}`);
    console.log(
      `${(info.bytes / 1e6).toFixed(1)} MB file, ${(info.parameters / 1e6).toFixed(1)}M parameters, ${info.vocabSize} tokens; ` +
        `written in ${writeMs.toFixed(0)} ms, loaded in ${loadMs.toFixed(0)} ms (backend included on first load)`,
    );
    console.log(
      `threads ${THREADS}, batch 512, context 4096, ${runs} runs per row (median); prompt of one question: ${promptTokens} tokens`,
    );
    console.log("| questions | input tokens | latency ms |");
    console.log("| ---: | ---: | ---: |");
    for (const r of rows) console.log(`| ${r.n} | ${r.input} | ${r.ms.toFixed(1)} |`);
    const mbOf = (bytes: number) => `${(bytes / 1e6).toFixed(0)} MB`;
    console.log(`per extra question: ${slope.toFixed(1)} ms (least-squares slope over the rows)`);
    console.log(
      `memory: process RSS ${mbOf(rssBefore)} before the load, ${mbOf(rssLoaded)} loaded, ${mbOf(rssServing)} after the requests ` +
        `(+${mbOf(rssServing - rssBefore)} for the model, its context and the answers); peak RSS so far ${mbOf(process.resourceUsage().maxRSS * 1024)}`,
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * The words of the prompt (system text, state, questions) as whole tokens, so the prompt tokenizes
 * word by word as with a real model's vocabulary (about 200 tokens for one question, not 500 letters).
 */
const PROMPT_WORDS = [
  ...new Set(
    [
      SYSTEM_INSTRUCTIONS,
      JSON.stringify(STATE),
      ...QUESTION_KINDS.map((q) => JSON.stringify(q)),
      "Type Instructions Options Levels lowest highest Reply means",
    ]
      .join(" ")
      .match(/[A-Za-z]{3,}/g) ?? [],
  ),
];

await benchModel("tiny test model (2 layers, 64 wide, F32)", { extraWords: PROMPT_WORDS }, RUNS);
if (flag("--realistic")) {
  await benchModel(
    "random model of Qwen2.5-0.5B shapes (24 layers, 896 wide, 151,936 tokens, Q8_0)",
    { ...REALISTIC_0_5B, extraWords: PROMPT_WORDS },
    Math.max(1, Math.min(RUNS, 3)),
  );
}
