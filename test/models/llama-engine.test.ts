import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { LlamaContext, LlamaModel, Token } from "node-llama-cpp";
import type { ChoiceAnswer, NoulAnswer, Question, ScoreAnswer } from "../../src/contract/decision.ts";
import { checkAnswers } from "../../src/gateway/answer-check.ts";
import { getBackend } from "../../src/models/llama/backend.ts";
import type { LlamaService, RenderedQuestion } from "../../src/models/llama/llama-service.ts";
import type { ModelCall } from "../../src/models/model-service.ts";
import { expectKind, type ModelDir, makeModelDir, manyOptions, tinyService } from "../fixtures/gguf/tiny-model.ts";

const questions: Record<string, Question> = {
  topic: {
    type: "choice",
    instructions: "What is the ticket about?",
    criteria: { billing: "Payments and invoices", bug: "Something broken", other: null },
  },
  urgency: { type: "score", instructions: "How urgent is it?", criteria: ["not urgent", "soon", "today", "now"] },
  refund: {
    type: "noul",
    instructions: "Does the customer ask for a refund?",
    criteria: { true: "a refund is asked for", false: "no refund" },
  },
};

const state = { ticket: "I was charged twice for my subscription this month.", customer_tier: "gold" };

function call(qs: Record<string, Question> = questions, s: unknown = state): ModelCall {
  return { model: "tiny", state: s, questions: qs };
}

const OPTS = { timeoutMs: 30_000 };

let models: ModelDir;
let service: LlamaService;
let fewService: LlamaService;
let modelPath: string;
/** An independent context on the same model file, for checking the engine's numbers. */
let checkModel: LlamaModel;
let checkContext: LlamaContext;

before(async () => {
  models = makeModelDir();
  modelPath = models.model("tiny");
  service = tinyService(modelPath);
  fewService = tinyService(models.model("few-labels", { labels: "few" }), { name: "few" });
  await Promise.all([service.ready(), fewService.ready()]);
  const llama = await getBackend();
  checkModel = await llama.loadModel({ modelPath, gpuLayers: 0 });
  checkContext = await checkModel.createContext({ contextSize: 4096, batchSize: 64, threads: 1, sequences: 1, flashAttention: false });
});

after(async () => {
  await checkContext?.dispose();
  await checkModel?.dispose();
  await service?.close();
  await fewService?.close();
  models?.cleanup();
});

/** The full next-token distribution after `tokens`, evaluated from scratch on the check context. */
async function fullDistribution(tokens: readonly Token[]): Promise<Map<Token, number>> {
  const seq = checkContext.getSequence();
  try {
    const last = tokens[tokens.length - 1] as Token;
    const results = await seq.controlledEvaluate([...tokens.slice(0, -1), [last, { generateNext: { probabilities: true } }]]);
    const p = results[results.length - 1]?.next.probabilities;
    assert.ok(p, "a distribution");
    return p;
  } finally {
    await seq.dispose();
  }
}

/** Label probabilities of a rendered single-token question, computed independently of the engine. */
async function independentLabelProbabilities(q: RenderedQuestion): Promise<number[]> {
  const dist = await fullDistribution(q.tokens);
  let vocabulary = 0;
  for (const _ of checkModel.iterateAllTokens()) vocabulary++;
  assert.equal(dist.size, vocabulary, "the distribution covers the whole vocabulary (no top-k)");
  let total = 0;
  for (const v of dist.values()) total += v;
  assert.ok(Math.abs(total - 1) < 1e-4, `full distribution sums to ${total}`);
  const raw = q.labelTokens.map(([t]) => dist.get(t as Token) ?? 0);
  const sum = raw.reduce((a, b) => a + b, 0);
  return raw.map((v) => v / sum);
}

function sum(values: Iterable<number>): number {
  let s = 0;
  for (const v of values) s += v;
  return s;
}

describe("embedded engine on the generated tiny model", () => {
  test("is ready and lists the model with its context limits", async () => {
    assert.deepEqual(service.status(), { state: "ready" });
    const listed = await service.listModels(OPTS);
    assert.equal(listed.length, 1);
    assert.equal(listed[0]?.name, "tiny");
    const ctx = listed[0]?.context;
    assert.ok(ctx && ctx.max_state !== undefined && ctx.max_branch !== undefined);
    assert.equal(ctx.strict, true);
    assert.deepEqual(ctx, { max_state: 4096 - 8 - 64, max_branch: 4096 - 8, strict: true });
  });

  test("renders with the model's chat template and one-token labels checked in its vocabulary", async () => {
    const r = await service.render(call());
    const [topic, urgency, refund] = r.questions as [RenderedQuestion, RenderedQuestion, RenderedQuestion];
    assert.deepEqual(topic.labels, ["A", "B", "C"]);
    assert.deepEqual(urgency.labels, ["0", "1", "2", "3"]);
    assert.deepEqual(refund.labels, ["Yes", "No"]);
    for (const q of r.questions) {
      assert.equal(q.singleToken, true);
      assert.ok(q.labelTokens.every((t) => t.length === 1));
      assert.equal(new Set(q.labelTokens.map((t) => t[0])).size, q.labels.length, "distinct label tokens");
      // Every prompt starts with the shared state part.
      assert.deepEqual(q.tokens.slice(0, r.stateTokens.length), r.stateTokens);
      const text = checkModel.detokenize(q.tokens, true);
      assert.match(text, /^<s><\|im_start\|> ?system\n/, "ChatML system turn from the model's template");
      assert.ok(text.includes("I was charged twice"), "the state is in the prompt");
      assert.match(text, /<\|im_end\|> ?\n<\|im_start\|> ?assistant\n$/, "answer position at the assistant turn");
      // Each label token is exactly the token that follows the prompt when the label is appended.
      q.labels.forEach((label, i) => {
        assert.equal(checkModel.detokenize(q.labelTokens[i] as Token[], false).trim(), label);
      });
    }
    assert.equal(checkModel.tokens.bos, r.stateTokens[0], "BOS prepended (the model asks for it)");
    assert.match(topic.text, /A: billing — Payments and invoices\nB: bug — Something broken\nC: other\n/);
  });

  test("answers choice, score and noul in one request from the real next-token distribution", async () => {
    const result = await service.decide(call(), OPTS);
    const checked = checkAnswers(questions, result.answers);
    assert.ok(checked.ok, checked.ok ? "" : checked.problem);

    const answers = result.answers as Record<string, unknown>;
    const topic = answers.topic as ChoiceAnswer;
    const urgency = answers.urgency as ScoreAnswer;
    const refund = answers.refund as NoulAnswer;
    assert.deepEqual(Object.keys(topic.probabilities), ["billing", "bug", "other"]);
    assert.deepEqual(Object.keys(urgency.probabilities), ["0", "1", "2", "3"]);
    assert.deepEqual({ ...urgency.legend }, { 0: "not urgent", 1: "soon", 2: "today", 3: "now" });

    const rendered = await service.render(call());
    const [qTopic, qUrgency, qRefund] = rendered.questions as [RenderedQuestion, RenderedQuestion, RenderedQuestion];

    // choice: probabilities are the renormalised label entries of the full distribution.
    const pTopic = await independentLabelProbabilities(qTopic);
    ["billing", "bug", "other"].forEach((name, i) => {
      assert.ok(
        Math.abs((topic.probabilities[name] as number) - (pTopic[i] as number)) <= 1e-6,
        `${name}: ${topic.probabilities[name]} vs ${pTopic[i]}`,
      );
    });
    assert.ok(Math.abs(sum(Object.values(topic.probabilities)) - 1) <= 1e-12);
    const maxTopic = Math.max(...pTopic);
    assert.equal(topic.choice, ["billing", "bug", "other"][pTopic.indexOf(maxTopic)]);
    assert.ok(Math.abs(topic.confidence - (maxTopic - 1 / 3) / (1 - 1 / 3)) <= 1e-6);

    // score: expected level and the same confidence formula over the levels.
    const pUrgency = await independentLabelProbabilities(qUrgency);
    for (const [i, p] of pUrgency.entries()) assert.ok(Math.abs((urgency.probabilities[String(i)] as number) - p) <= 1e-6);
    const expected = pUrgency.reduce((acc, p, i) => acc + i * p, 0);
    assert.ok(Math.abs(urgency.score - expected) <= 1e-5, `${urgency.score} vs ${expected}`);
    assert.ok(Math.abs(urgency.confidence - (Math.max(...pUrgency) - 1 / 4) / (1 - 1 / 4)) <= 1e-6);

    // noul: P(true label) over {true label, false label}.
    const pRefund = await independentLabelProbabilities(qRefund);
    assert.ok(Math.abs(refund.noul - (pRefund[0] as number)) <= 1e-6, `${refund.noul} vs ${pRefund[0]}`);
    assert.deepEqual(Object.keys(refund), ["type", "noul"]);

    // usage: the state part once, then each question's own tokens (what follows the tokens it shares
    // with the previous question), and one answer position per question.
    const [t1, t2, t3] = [qTopic.tokens, qUrgency.tokens, qRefund.tokens];
    const lcp = (a: readonly Token[], b: readonly Token[]) => {
      let i = 0;
      while (i < a.length && i < b.length && a[i] === b[i]) i++;
      return i;
    };
    const expectedInput = t1.length + (t2.length - lcp(t1, t2)) + (t3.length - lcp(t2, t3));
    assert.equal(result.usage.input_tokens, expectedInput);
    assert.ok(result.usage.input_tokens < t1.length + t2.length + t3.length, "the state is evaluated once");
    assert.equal(result.usage.output_tokens, 3);
    // The token bound a paid reservation is made of: never below what is reported, close above it.
    const bound = (await service.tokenBound!(call()))!;
    assert.ok(bound.input >= result.usage.input_tokens && bound.input <= t1.length + t2.length + t3.length, JSON.stringify(bound));
    assert.equal(bound.output, 3);
    assert.ok(result.latencyMs > 0);
  });

  test("repeats exactly at a fixed batch size", async () => {
    const a = await service.decide(call(), OPTS);
    const b = await service.decide(call(), OPTS);
    assert.deepEqual(JSON.parse(JSON.stringify(a.answers)), JSON.parse(JSON.stringify(b.answers)));
    assert.deepEqual(a.usage, b.usage);
  });

  test("a single option has confidence 1 and probability 1", async () => {
    const qs: Record<string, Question> = {
      only: { type: "choice", criteria: { sole: "the only option" } },
      one: { type: "score", criteria: ["x"] },
    };
    const result = await service.decide(call(qs), OPTS);
    assert.ok(checkAnswers(qs, result.answers).ok);
    const only = (result.answers as Record<string, ChoiceAnswer>).only as ChoiceAnswer;
    const one = (result.answers as Record<string, ScoreAnswer>).one as ScoreAnswer;
    assert.equal(only.choice, "sole");
    assert.equal(only.probabilities.sole, 1);
    assert.equal(only.confidence, 1);
    assert.equal(one.score, 0);
    assert.equal(one.confidence, 1);
  });

  test("255 options and 255 levels get single-token labels (AA … ) when the vocabulary has them", async () => {
    const qs: Record<string, Question> = {
      many: { type: "choice", instructions: "Pick one", criteria: manyOptions(255, false) },
      levels: { type: "score", criteria: Array.from({ length: 255 }, (_, i) => String(i)) },
    };
    const r = await service.render(call(qs));
    for (const q of r.questions) {
      assert.equal(q.singleToken, true);
      assert.equal(q.labels.length, 255);
      assert.equal(q.labels[0], "AA");
    }
    const result = await service.decide(call(qs), OPTS);
    const checked = checkAnswers(qs, result.answers);
    assert.ok(checked.ok, checked.ok ? "" : checked.problem);
    const many = (result.answers as Record<string, ChoiceAnswer>).many as ChoiceAnswer;
    const p = await independentLabelProbabilities(r.questions[0] as RenderedQuestion);
    for (const [i, name] of Object.keys(manyOptions(255, false)).entries())
      assert.ok(Math.abs((many.probabilities[name] as number) - (p[i] as number)) <= 1e-6);
  });

  test("falls back to multi-token labels scored by sequence probability when one-token labels run out", async () => {
    const qs: Record<string, Question> = {
      many: { type: "choice", criteria: manyOptions(40) },
      small: { type: "choice", criteria: { a: null, b: null } },
    };
    const r = await fewService.render(call(qs));
    const [many, small] = r.questions as [RenderedQuestion, RenderedQuestion];
    assert.equal(small.singleToken, true, "26 letters are still single tokens");
    assert.equal(many.singleToken, false);
    assert.deepEqual(many.labels.slice(0, 3), ["AA", "AB", "AC"]);
    assert.ok(
      many.labelTokens.every((t) => t.length === 2),
      "two tokens per label in this vocabulary",
    );

    const result = await fewService.decide(call(qs), OPTS);
    const checked = checkAnswers(qs, result.answers);
    assert.ok(checked.ok, checked.ok ? "" : checked.problem);

    // Independent check: P(label) = P(t1 | prompt) · P(t2 | prompt, t1), renormalised over the options.
    const llama = await getBackend();
    const fewModel = await llama.loadModel({ modelPath: models.model("few-labels", { labels: "few" }), gpuLayers: 0 });
    const ctx = await fewModel.createContext({ contextSize: 4096, batchSize: 64, threads: 1, sequences: 1, flashAttention: false });
    try {
      // The same evaluation schedule as the engine's (the prompt, then one label token on top of it):
      // llama.cpp's results depend slightly on how tokens are batched, not on the engine's code.
      const seq = ctx.getSequence();
      const weights: number[] = [];
      try {
        const prompt = many.tokens;
        const head = await seq.controlledEvaluate([
          ...prompt.slice(0, -1),
          [prompt[prompt.length - 1] as Token, { generateNext: { probabilities: true } }],
        ]);
        const first = head[head.length - 1]?.next.probabilities as Map<Token, number>;
        for (const [t1, t2] of many.labelTokens as Array<[Token, Token]>) {
          await seq.eraseContextTokenRanges([{ start: prompt.length, end: seq.nextTokenIndex }]);
          const next = await seq.controlledEvaluate([[t1, { generateNext: { probabilities: true } }]]);
          const second = next[0]?.next.probabilities as Map<Token, number>;
          weights.push((first.get(t1) ?? 0) * (second.get(t2) ?? 0));
        }
      } finally {
        await seq.dispose();
      }
      const total = weights.reduce((a, b) => a + b, 0);
      const answer = (result.answers as Record<string, ChoiceAnswer>).many as ChoiceAnswer;
      Object.keys(manyOptions(40)).forEach((name, i) => {
        const expected = (weights[i] as number) / total;
        assert.ok(
          Math.abs((answer.probabilities[name] as number) - expected) <= 1e-6,
          `${name}: ${answer.probabilities[name]} vs ${expected}`,
        );
      });
      assert.ok(Math.abs(sum(Object.values(answer.probabilities)) - 1) <= 1e-12);
      // One answer position plus one per distinct first label token; one more for the small question.
      const firstTokens = new Set(many.labelTokens.map((t) => t[0]));
      assert.equal(result.usage.output_tokens, 1 + firstTokens.size + 1);
      const bound = (await fewService.tokenBound!(call(qs)))!;
      assert.ok(
        bound.input >= result.usage.input_tokens && bound.output >= result.usage.output_tokens,
        JSON.stringify({ bound, usage: result.usage }),
      );
    } finally {
      await ctx.dispose();
      await fewModel.dispose();
    }
  });

  test("a state over max_state is rejected before any evaluation, naming the limit", async () => {
    const [listed] = await service.listModels(OPTS);
    const maxState = listed?.context?.max_state as number;
    const big = { notes: "lorem ipsum dolor sit amet ".repeat(400) };
    const r = await expectKind(
      service.decide(call(questions, big), OPTS),
      "context_rejected",
      /^state is \d+ tokens; the model's max_state is \d+$/,
    );
    const tokens = Number(/state is (\d+)/.exec(r.message)?.[1]);
    assert.ok(tokens > maxState);
    assert.ok(r.message.endsWith(`max_state is ${maxState}`));
  });

  test("a state under max_state plus a long question over max_branch is rejected, naming the question and limit", async () => {
    const [listed] = await service.listModels(OPTS);
    const maxBranch = listed?.context?.max_branch as number;
    const qs: Record<string, Question> = {
      short: { type: "noul" },
      long: { type: "choice", instructions: "x ".repeat(5000), criteria: { a: null, b: null } },
    };
    const rendered = await service.render(call({ short: { type: "noul" } }));
    assert.ok(rendered.stateTokens.length <= rendered.maxState);
    await expectKind(
      service.decide(call(qs), OPTS),
      "context_rejected",
      new RegExp(`^question "long": the state plus the question is \\d+ tokens; the model's max_branch is ${maxBranch}$`),
    );
  });

  test("limits can only be lowered by maxState / maxBranch, and are enforced with the real tokenizer", async () => {
    const small = tinyService(modelPath, { maxState: 150, maxBranch: 400 });
    try {
      await small.ready();
      const [listed] = await small.listModels(OPTS);
      assert.deepEqual(listed?.context, { max_state: 150, max_branch: 400, strict: true });
      const r = await small.render(call({ q: { type: "noul" } }, "short"));
      assert.ok(r.stateTokens.length < 150);
      // Grow the state one word at a time until it is just over 150 tokens by the model's own count.
      let words = 1;
      let count = r.stateTokens.length;
      while (count <= 150) {
        words++;
        count = (await service.render(call({ q: { type: "noul" } }, "word ".repeat(words)))).stateTokens.length;
      }
      await expectKind(
        small.decide(call({ q: { type: "noul" } }, "word ".repeat(words)), OPTS),
        "context_rejected",
        new RegExp(`^state is ${count} tokens; the model's max_state is 150$`),
      );
      const ok = await small.decide(call({ q: { type: "noul" } }, "word ".repeat(words - 1)), OPTS);
      assert.ok(checkAnswers({ q: { type: "noul" } }, ok.answers).ok);
    } finally {
      await small.close();
    }
  });

  test("models with a plain-text template, or none, are rendered and their labels checked at each prompt's end", async () => {
    const plain =
      "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}";
    // Shaped like Qwen2.5's template (whitespace control, a default system prompt, role conditions).
    const qwenLike =
      "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}" +
      "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}" +
      "{%- for message in messages %}{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or (message.role == 'assistant') %}" +
      "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endif %}{%- endfor %}" +
      "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
    for (const [name, chatTemplate] of [
      ["plain-template", plain],
      ["no-template", null],
      ["qwen-like-template", qwenLike],
    ] as const) {
      const other = tinyService(models.model(name, { chatTemplate }), { name });
      try {
        await other.ready();
        const r = await other.render(call());
        for (const q of r.questions) {
          assert.deepEqual(q.tokens.slice(0, r.stateTokens.length), r.stateTokens);
          for (const [i, label] of q.labels.entries())
            assert.equal(checkModel.detokenize(q.labelTokens[i] as Token[], false).trim(), label);
        }
        if (name === "qwen-like-template") {
          const text = checkModel.detokenize((r.questions[0] as RenderedQuestion).tokens, true);
          assert.match(text, /^<s><\|im_start\|> ?system\nYou answer typed questions/);
          assert.ok(!text.includes("You are Qwen"));
          assert.match(text, /<\|im_start\|> ?assistant\n$/);
        }
        if (name === "plain-template")
          assert.match(
            checkModel.detokenize((r.questions[0] as RenderedQuestion).tokens, false),
            /^ ?system: You answer typed questions[\s\S]*\nassistant: ?$/,
          );
        const result = await other.decide(call(), OPTS);
        const checked = checkAnswers(questions, result.answers);
        assert.ok(checked.ok, checked.ok ? "" : checked.problem);
      } finally {
        await other.close();
      }
    }
  });

  test("evaluation does not block the event loop", async () => {
    // Four long questions: a blocking evaluation would stall the loop for a whole question at a time.
    const qs: Record<string, Question> = Object.fromEntries(
      Array.from({ length: 4 }, (_, i) => [
        `q${i}`,
        { type: "choice", instructions: `question ${i}`, criteria: manyOptions(180) } as Question,
      ]),
    );
    // An order, not a duration: a chain of event-loop turns started with the decision must reach its end before the
    // decision does. While the engine works on other threads the loop turns freely (each turn takes microseconds, a
    // question's evaluation milliseconds); a blocking evaluation would let it turn only between questions.
    const TURNS = 100;
    let turns = 0;
    const chain = new Promise<void>((resolve) => {
      const turn = () => (++turns >= TURNS ? resolve() : setImmediate(turn));
      setImmediate(turn);
    });
    let chainDone = false;
    void chain.then(() => {
      chainDone = true;
    });
    const result = await service.decide(call(qs), OPTS);
    assert.ok(checkAnswers(qs, result.answers).ok);
    assert.ok(chainDone, `the event loop turned only ${turns} times during the whole decision`);
  });
});
