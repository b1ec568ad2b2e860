import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { stat } from "node:fs/promises";
import { pipeline } from "node:stream/promises";
import { setTimeout as sleep } from "node:timers/promises";
import type { Batch } from "../contract/batches.ts";
import { MAX_PAGE_LIMIT } from "../domain/paging.ts";
import { BatchApiClient, BatchApiError, batchApiTarget, TransientApiError } from "./batch-api-client.ts";
import { progressText, progressView } from "./batch-progress.ts";
import {
  CliError,
  type CommandContext,
  type CommandGroup,
  type CommandInput,
  type OptionSpec,
  stringOption,
  UsageError,
} from "./command.ts";
import { quoted, safeText } from "./output.ts";
import { MAX_USAGE_LIMIT, parseLimit } from "./usage-commands.ts";

/** The exit code of `tds batch submit --wait` when the batch ended without completing (cancelled or expired). */
export const EXIT_BATCH_NOT_COMPLETED = 3;

const END_STATUSES: ReadonlySet<Batch["status"]> = new Set(["completed", "cancelled", "expired"]);
/** Polling while waiting: every FIRST_POLL_MS while the batch changes, backing off to LAST_POLL_MS while it does not. */
const FIRST_POLL_MS = 1000;
const LAST_POLL_MS = 5000;
/** How long waiting goes on while the gateway cannot be reached or answers 5xx/429, before giving up. */
const UNREACHABLE_GIVE_UP_MS = 10 * 60 * 1000;
const IDEMPOTENCY_KEY = /^[\x21-\x7E]{1,255}$/;

const API_NOTE = "with the API key in TDS_API_KEY";

function clientOf(ctx: CommandContext, input: CommandInput): BatchApiClient {
  const target = batchApiTarget(stringOption(input, "url"), ctx.env);
  if (target.droppedPath !== undefined)
    ctx.out.note(`Using the gateway at ${target.url}: ${target.via} takes the gateway's URL, without ${target.droppedPath}.`);
  return new BatchApiClient(target);
}

function batchIdArgument(input: CommandInput): string {
  const id = input.positionals[0]!;
  if (id.trim() === "") throw new UsageError("ID must be a batch id (batch_…)");
  return id;
}

/**
 * The Idempotency-Key a submission gets unless --idempotency-key is given: from the SHA-256 of the file's bytes and
 * the --model, so the same command run again (after a lost answer, say) returns the batch it submitted instead of a
 * second one; the gateway keeps a key for 24 hours.
 */
export async function derivedIdempotencyKey(file: string, model: string | undefined): Promise<string> {
  const fileHash = createHash("sha256");
  await pipeline(createReadStream(file), fileHash);
  const key = createHash("sha256")
    .update(fileHash.digest())
    .update(`\0model=${model ?? ""}`);
  return `tds-batch-${key.digest("hex")}`;
}

async function fileSize(file: string): Promise<number> {
  try {
    const info = await stat(file);
    if (!info.isFile()) throw new CliError(`${quoted(file)} is not a file`);
    return info.size;
  } catch (err) {
    if (err instanceof CliError) throw err;
    const code = (err as NodeJS.ErrnoException).code;
    throw new CliError(
      code === "ENOENT" ? `No such file: ${quoted(file)}` : `Cannot read ${quoted(file)}: ${safeText((err as Error).message)}`,
    );
  }
}

const describeModel = (batch: Batch) => (batch.model === null ? "the configured model" : `model ${quoted(batch.model)}`);
const requestCount = (batch: Batch) => `${batch.request_counts.total} request${batch.request_counts.total === 1 ? "" : "s"}`;

/** A submission the gateway refused, with each line's errors ("line 17: questions.q.type: …"). */
function submissionRefused(err: BatchApiError, file: string): CliError {
  const lines = err.fieldErrors.map((e) => `  ${e.field}: ${e.message}`);
  return new CliError([`the gateway refused ${quoted(file)}: ${err.detail}`, ...lines].join("\n"));
}

/**
 * Polls the batch until it ends, showing progress on stderr; a gateway that cannot be reached (or answers 5xx or
 * 429) is asked again for up to UNREACHABLE_GIVE_UP_MS.
 */
async function waitForEnd(ctx: CommandContext, client: BatchApiClient, first: Batch): Promise<Batch> {
  const view = progressView(ctx.stderr, ctx.nowMs);
  let batch = first;
  let pollMs = FIRST_POLL_MS;
  let failingSinceMs: number | null = null;
  view.update(batch);
  while (!END_STATUSES.has(batch.status)) {
    await sleep(pollMs);
    let next: Batch;
    try {
      next = await client.getBatch(batch.id);
    } catch (err) {
      if (!(err instanceof TransientApiError)) throw err;
      if (failingSinceMs === null) {
        failingSinceMs = ctx.nowMs();
        ctx.out.note(`${err.message}; asking again (the batch goes on meanwhile)`);
      } else if (ctx.nowMs() - failingSinceMs > UNREACHABLE_GIVE_UP_MS) {
        throw new CliError(`${err.message}; stopped waiting. The batch goes on: tds batch show ${batch.id}`);
      }
      pollMs = LAST_POLL_MS;
      continue;
    }
    failingSinceMs = null;
    const changed = progressText(next) !== progressText(batch) || next.status !== batch.status;
    pollMs = changed ? FIRST_POLL_MS : Math.min(LAST_POLL_MS, Math.round(pollMs * 1.5));
    batch = next;
    view.update(batch);
  }
  view.finish(batch);
  return batch;
}

function endedLine(batch: Batch): string {
  return `Batch ${batch.id} ${batch.status}: ${progressText(batch)}.`;
}

function batchLines(batch: Batch): string[] {
  const { total, succeeded, failed } = batch.request_counts;
  const rows: [string, string][] = [
    ["id", batch.id],
    ["status", batch.status],
    ["model", batch.model ?? "- (the configured model)"],
    ["created_at", batch.created_at],
    ["started_at", batch.started_at ?? "-"],
    ["ended_at", batch.ended_at ?? "-"],
    ["expires_at", batch.expires_at],
    ["requests", `${total} (${succeeded + failed} done: ${succeeded} succeeded, ${failed} failed)`],
    ["cost_usd", batch.cost_usd],
  ];
  const width = Math.max(...rows.map(([k]) => k.length));
  return rows.map(([k, v]) => `${`${k}:`.padEnd(width + 1)} ${safeText(v)}`);
}

const OUT_OPTION: OptionSpec = {
  type: "string",
  valueName: "FILE",
  description: "Write the results (NDJSON, one line per request in input order) to FILE instead of stdout",
};

export const batchCommands: CommandGroup = {
  name: "batch",
  summary: `Batch decisions through the gateway's API (--url URL or TDS_URL, ${API_NOTE}): submit, list, show, results, cancel`,
  commands: [
    {
      name: "submit",
      positionals: ["FILE"],
      usesApiKey: true,
      options: {
        model: { type: "string", valueName: "M", description: "The model of the lines that name none (default: the configured model)" },
        wait: {
          type: "boolean",
          description:
            "Wait until the batch ends, showing progress on stderr (Ctrl-C stops waiting, not the batch); exit 3 if it was cancelled or expired",
        },
        out: { ...OUT_OPTION, description: "With --wait: write the results (NDJSON, in input order) to FILE once the batch ends" },
        "idempotency-key": {
          type: "string",
          valueName: "K",
          description:
            "Default: derived from the SHA-256 of FILE and --model, so the same command run again within 24 h returns the batch already submitted; pass another key to submit the same file again",
        },
      },
      synopsis: "FILE [--model M] [--wait] [--out FILE] [--idempotency-key K]",
      summary: `Submit a batch: FILE holds one request a line ({"custom_id", "model"?, "state", "questions"}), sent as it is read`,
      async run(ctx, input) {
        const file = input.positionals[0]!;
        const model = stringOption(input, "model");
        const wait = input.options.wait === true;
        const out = stringOption(input, "out");
        const keyOption = stringOption(input, "idempotency-key");
        if (model !== undefined && model.trim() === "") throw new UsageError("--model needs a model name");
        if (out !== undefined && !wait)
          throw new UsageError("--out needs --wait (results exist once the batch has run; later: tds batch results ID --out FILE)");
        if (out !== undefined && out.trim() === "") throw new UsageError("--out needs a file name");
        if (keyOption !== undefined && !IDEMPOTENCY_KEY.test(keyOption))
          throw new UsageError("--idempotency-key must be 1 to 255 visible ASCII characters, without spaces");
        const client = clientOf(ctx, input);
        const bytes = await fileSize(file);
        const idempotencyKey = keyOption ?? (await derivedIdempotencyKey(file, model));
        let submitted: { batch: Batch; replayed: boolean };
        try {
          submitted = await client.submit({ file, bytes, idempotencyKey, ...(model === undefined ? {} : { model }) });
        } catch (err) {
          if (err instanceof BatchApiError && (err.status === 422 || err.status === 413)) throw submissionRefused(err, file);
          // A gateway refuses a body over its limit before reading it, which can cut the upload off (EPIPE) before its answer is read.
          const max = err instanceof TransientApiError ? await client.maxBatchBytes() : null;
          if (max !== null && bytes > max)
            throw new CliError(
              `${quoted(file)} is ${bytes} bytes, more than the gateway's max_batch_bytes (${max}): split it into several batches`,
            );
          throw err;
        }
        const { batch, replayed } = submitted;
        if (replayed) {
          ctx.out.note(
            `Batch ${batch.id} was submitted at ${batch.created_at} with the same Idempotency-Key (${keyOption === undefined ? "the same file and --model" : "--idempotency-key"}): nothing was submitted again. To submit the file as a new batch, pass another --idempotency-key.`,
          );
        }
        if (!ctx.out.jsonMode) {
          ctx.out.line(
            replayed
              ? `Batch ${batch.id} (${requestCount(batch)}, ${describeModel(batch)}) is ${batch.status}.`
              : `Submitted batch ${batch.id}: ${requestCount(batch)}, ${describeModel(batch)}, ${batch.status}.`,
          );
        }
        if (!wait) {
          if (ctx.out.jsonMode) return ctx.out.json(batch);
          return ctx.out.line(`Follow it with: tds batch show ${batch.id}; results: tds batch results ${batch.id} --out FILE`);
        }
        const ended = await waitForEnd(ctx, client, batch);
        if (out !== undefined) await client.resultsToFile(ended.id, out);
        if (ctx.out.jsonMode) ctx.out.json(ended);
        else
          ctx.out.line(
            endedLine(ended),
            out === undefined ? `Results: tds batch results ${ended.id} --out FILE` : `Results written to ${quoted(out)}.`,
          );
        return ended.status === "completed" ? 0 : EXIT_BATCH_NOT_COMPLETED;
      },
    },
    {
      name: "list",
      positionals: [],
      usesApiKey: true,
      options: {
        limit: { type: "string", valueName: "N", description: `At most N batches, newest first (1 to ${MAX_USAGE_LIMIT}, default 20)` },
      },
      synopsis: "[--limit N]",
      summary: "The organization's batches, newest first",
      async run(ctx, input) {
        const limit = parseLimit(stringOption(input, "limit"));
        const client = clientOf(ctx, input);
        const batches: Batch[] = [];
        let cursor: string | null = null;
        do {
          const page = await client.listBatches({
            limit: Math.min(MAX_PAGE_LIMIT, limit - batches.length),
            ...(cursor === null ? {} : { cursor }),
          });
          batches.push(...page.data);
          cursor = page.next_cursor;
        } while (cursor !== null && batches.length < limit);
        if (ctx.out.jsonMode) return ctx.out.json(batches);
        if (batches.length === 0) return ctx.out.line("The organization has no batches. Submit one with: tds batch submit FILE");
        ctx.out.table(
          ["ID", "STATUS", "CREATED", "DONE/TOTAL", "COST USD"],
          batches.map((b) => {
            const { total, succeeded, failed } = b.request_counts;
            return [b.id, b.status, b.created_at, `${succeeded + failed}/${total}`, b.cost_usd];
          }),
        );
        if (cursor !== null) ctx.out.note(`Showing the newest ${batches.length}; more with --limit N (up to ${MAX_USAGE_LIMIT}).`);
      },
    },
    {
      name: "show",
      positionals: ["ID"],
      usesApiKey: true,
      summary: "A batch's status, request counts and cost",
      async run(ctx, input) {
        const batch = await clientOf(ctx, input).getBatch(batchIdArgument(input));
        if (ctx.out.jsonMode) return ctx.out.json(batch);
        ctx.out.line(...batchLines(batch));
      },
    },
    {
      name: "results",
      positionals: ["ID"],
      usesApiKey: true,
      options: { out: OUT_OPTION },
      synopsis: "ID [--out FILE]",
      summary: "A batch's results as NDJSON ({custom_id, request_id, status, body} a line, in input order), streamed",
      async run(ctx, input) {
        const id = batchIdArgument(input);
        const out = stringOption(input, "out");
        if (out !== undefined && out.trim() === "") throw new UsageError("--out needs a file name");
        const client = clientOf(ctx, input);
        const batch = await client.getBatch(id);
        if (!END_STATUSES.has(batch.status)) {
          const { total, succeeded, failed } = batch.request_counts;
          ctx.out.note(`Batch ${batch.id} is ${batch.status}: the results of ${succeeded + failed} of its ${total} requests so far.`);
        }
        if (out === undefined) return client.resultsToSink(batch.id, ctx.stdout);
        await client.resultsToFile(batch.id, out);
        if (!ctx.out.jsonMode) ctx.out.line(`Results of batch ${batch.id} written to ${quoted(out)}.`);
      },
    },
    {
      name: "cancel",
      positionals: ["ID"],
      usesApiKey: true,
      summary: "Cancel a batch: requests not started end with batch_cancelled (not charged); those running finish",
      async run(ctx, input) {
        const id = batchIdArgument(input);
        const batch = await clientOf(ctx, input).cancelBatch(id);
        if (ctx.out.jsonMode) return ctx.out.json(batch);
        const running = batch.request_counts.total - batch.request_counts.succeeded - batch.request_counts.failed;
        switch (batch.status) {
          case "cancelling":
            return ctx.out.line(`Cancelling batch ${batch.id}: ${running} request${running === 1 ? "" : "s"} still running finish first.`);
          case "cancelled":
            return ctx.out.line(`Cancelled batch ${batch.id}: ${progressText(batch)}.`);
          default:
            return ctx.out.line(`Batch ${batch.id} had already ended: ${batch.status}.`);
        }
      },
    },
  ],
};
