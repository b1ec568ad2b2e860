import type { Token } from "node-llama-cpp";
import {
  type CallOptions,
  type EngineStatus,
  type ModelAnswerSet,
  type ModelCall,
  type ModelService,
  ModelServiceError,
  type PoolStats,
  type TokenBound,
  type UpstreamModel,
} from "../model-service.ts";
import { callPrompts } from "./chat-prompt.ts";
import { EngineLoader } from "./engine-loader.ts";
import { engineSettings, type LlamaServiceOptions } from "./engine-settings.ts";
import { type EvaluationPlan, type PlannedQuestion, planCall, planTokenBound } from "./evaluation-plan.ts";
import type { Engine } from "./load-engine.ts";
import { Deadline } from "./pool.ts";
import { type PlanResult, runPlan } from "./run-plan.ts";

/**
 * The embedded engine as a ModelService: wires the loader (engine-loader.ts), the planner (evaluation-plan.ts)
 * and the evaluation (run-plan.ts) together, with the pool's queue and the calls' deadlines.
 */

export { SEE_THE_LOG } from "./engine-loader.ts";
export {
  DEFAULT_BATCH_SIZE,
  DEFAULT_CONTEXT_SIZE,
  DEFAULT_QUEUE_LIMIT,
  type LlamaLogger,
  type LlamaServiceOptions,
  sourceHint,
} from "./engine-settings.ts";
export { ANSWER_RESERVE_TOKENS, QUESTION_RESERVE_TOKENS } from "./evaluation-plan.ts";

/** The exact tokens the engine evaluates for a call (for tests and debugging). */
export interface RenderedDecision extends EvaluationPlan<Token> {
  maxState: number;
  maxBranch: number;
}

/** One question as the engine evaluates it: its prompt's tokens (state part first) and its labels' tokens. */
export type RenderedQuestion = PlannedQuestion<Token>;

export interface LlamaService extends ModelService {
  status(): EngineStatus;
  /** Contexts in use, contexts in all, and requests waiting for one (zeros until the model is ready). */
  poolStats(): PoolStats;
  /** Resolves when the model is ready (after any retries); rejects with a `not_ready` ModelServiceError when loading failed for good or the service was closed. */
  ready(): Promise<void>;
  /** The prompt and label tokens of a call, as `decide` would evaluate them (limits are checked too). */
  render(call: ModelCall): Promise<RenderedDecision>;
}

/** Starts loading the model in the background (see {@link EngineLoader}) and answers calls once it is ready. Throws a TypeError on bad options. */
export function openLlamaService(options: LlamaServiceOptions): LlamaService {
  const settings = engineSettings(options);
  const loader = new EngineLoader(settings);
  const inflight = new Set<Promise<unknown>>();

  /** Renders and tokenizes every question; rejects over-long states and branches before any evaluation. */
  const plan = (e: Engine, call: ModelCall): EvaluationPlan<Token> => planCall(call, e, callPrompts(e.prompt, e.model));

  function track<T>(p: Promise<T>): Promise<T> {
    inflight.add(p);
    const done = () => inflight.delete(p);
    p.then(done, done);
    return p;
  }

  return {
    status: () => loader.status(),
    poolStats: () => {
      const pool = loader.engine?.pool;
      return pool ? { busy: pool.busy, size: pool.size, waiting: pool.waiting } : { busy: 0, size: 0, waiting: 0 };
    },
    ready: () => loader.ready(),

    async listModels(): Promise<UpstreamModel[]> {
      const e = loader.readyEngine();
      return [{ name: settings.name, context: { max_state: e.maxState, max_branch: e.maxBranch, strict: true } }];
    },

    async render(call: ModelCall): Promise<RenderedDecision> {
      const e = loader.readyEngine();
      const p = plan(e, call);
      return { stateTokens: p.stateTokens, questions: p.questions, maxState: e.maxState, maxBranch: e.maxBranch };
    },

    /** Exact for the input (the tokens it will evaluate); for multi-token labels, every label token counted. */
    async tokenBound(call: ModelCall): Promise<TokenBound | null> {
      const e = loader.engine;
      if (!e) return null;
      try {
        return planTokenBound(plan(e, call));
      } catch {
        return null; // decide will fail the same way, with nothing charged
      }
    },

    async decide(call: ModelCall, callOptions: CallOptions): Promise<ModelAnswerSet> {
      const started = performance.now();
      const deadline = new Deadline(callOptions.timeoutMs, callOptions.signal);
      try {
        deadline.throwIfStopped();
        const e = loader.readyEngine();
        let p: EvaluationPlan<Token>;
        try {
          p = plan(e, call);
        } catch (err) {
          throw asServiceError(err);
        }
        const lease = await e.pool.acquire(deadline);
        const hooks = { closed: () => loader.closed, logger: settings.logger };
        const work = track(
          runPlan(lease.slot.sequence, p, deadline, hooks).finally(() => {
            lease.release();
          }),
        );
        work.catch(() => {}); // a late failure after our deadline is nobody's to handle
        let result: PlanResult;
        try {
          result = await deadline.race(work);
        } catch (err) {
          throw asServiceError(err);
        }
        return {
          answers: result.answers,
          usage: { input_tokens: result.input, output_tokens: result.output },
          latencyMs: performance.now() - started,
        };
      } finally {
        deadline.dispose();
      }
    },

    close: () => loader.close(() => Promise.allSettled([...inflight])),
  };
}

function asServiceError(err: unknown): ModelServiceError {
  if (err instanceof ModelServiceError) return err;
  const message = err instanceof Error ? err.message : String(err);
  return new ModelServiceError("unavailable", `the embedded model failed: ${message}`);
}
