import { BatchRequestLine, boundBatchRequestLine, CUSTOM_ID_MAX_LENGTH } from "../contract/batches.ts";
import type { FieldError } from "../contract/errors.ts";
import { parseJsonText } from "../contract/json-text.ts";
import { compileBoundedSchema, MAX_FIELD_ERRORS, summarizeFieldErrors } from "../contract/validation.ts";
import { ServiceError } from "../domain/errors.ts";
import type { NdjsonLines } from "./ndjson-lines.ts";

/** A valid line, handed to `accept` while no line has been found invalid. */
export interface AcceptedLine {
  /** Position among the batch's requests, from 0: the order of its results. */
  position: number;
  /** Line number in the input, from 1 (blank lines counted). */
  line: number;
  customId: string;
  /** The line's JSON text, as checked. */
  text: string;
  request: BatchRequestLine;
}

export interface SubmissionCheckOptions {
  /** max_batch_requests: the lines past it are counted, one error names the first, and none is checked further. */
  maxRequests: number;
  /**
   * The max_questions check of POST /v1/systemone (DecisionPipeline.checkQuestionCount): throws an invalid_body
   * ServiceError with its field errors. As in the route, a line it refuses is not checked against the schema.
   */
  checkQuestionCount: (body: unknown) => void;
  /** Called in input order for each valid line until the first error; awaited before the next line is read. */
  accept: (line: AcceptedLine) => void | Promise<void>;
}

export interface SubmissionCheck {
  /** Lines handed to `accept`: every request when `errors` is empty; to be dropped otherwise. */
  accepted: number;
  /** The first MAX_FIELD_ERRORS problems, each field naming its line: "line 17: questions.q.type". */
  errors: FieldError[];
  /** Problems found past the listed ones. */
  moreErrors: number;
  bytes: number;
  /** SHA-256 (hex) of the whole input. */
  sha256: string;
}

const validateLine = compileBoundedSchema(BatchRequestLine, boundBatchRequestLine);

/** The field errors of a submission: the first MAX_FIELD_ERRORS listed, the others counted. */
class SubmissionErrors {
  readonly listed: FieldError[] = [];
  more = 0;

  get none(): boolean {
    return this.listed.length === 0 && this.more === 0;
  }

  get room(): number {
    return MAX_FIELD_ERRORS - this.listed.length;
  }

  add(line: number, field: string, message: string): void {
    if (this.room > 0) this.listed.push({ field: fieldOfLine(line, field), message });
    else this.more++;
  }
}

/** "line 17: questions.q.type"; "line 17" for the line as a whole. */
function fieldOfLine(line: number, field: string): string {
  return field === "(body)" || field === "" ? `line ${line}` : `line ${line}: ${field}`;
}

/** A custom_id the schema accepts (1 to 64 code points), or null. */
function customIdOf(body: unknown): string | null {
  if (body === null || typeof body !== "object" || Array.isArray(body) || !Object.hasOwn(body, "custom_id")) return null;
  const id = (body as { custom_id: unknown }).custom_id;
  // A code point takes at most two UTF-16 units: a longer string is too long without counting.
  if (typeof id !== "string" || id.length === 0 || id.length > 2 * CUSTOM_ID_MAX_LENGTH) return null;
  return [...id].length <= CUSTOM_ID_MAX_LENGTH ? id : null;
}

/**
 * A lone surrogate (not well-formed Unicode: PostgreSQL would store U+FFFD, making distinct ids equal) or a control
 * character, \p{Cc}: U+0000–U+001F and U+007F–U+009F (U+0000 cannot be stored at all). With the `u` flag a
 * surrogate pair is one code point, never \p{Cs}.
 */
const UNSTORABLE_IN_CUSTOM_ID = /[\p{Cs}\p{Cc}]/u;

/**
 * Reads a batch submission to its end and checks every line as POST /v1/systemone checks a body (the same JSON
 * parsing, max_questions, the same schema and field errors), plus custom_id (unique within the batch, storable) and the number
 * of requests. Reading goes on after an error, so that up to MAX_FIELD_ERRORS problems are reported, but from the first
 * error on no line is accepted. In memory: one line, and the custom_ids of the first maxRequests lines.
 *
 * Throws what the lines throw (413 errors of ndjson-lines.ts) and what `accept` throws.
 */
export async function checkSubmission(lines: NdjsonLines, options: SubmissionCheckOptions): Promise<SubmissionCheck> {
  const errors = new SubmissionErrors();
  /** Line of each custom_id seen so far. */
  const lineOfCustomId = new Map<string, number>();
  let requests = 0;
  let accepted = 0;
  for await (const { line, text } of lines) {
    requests++;
    if (requests > options.maxRequests) {
      if (requests === options.maxRequests + 1) {
        errors.add(line, "", `is past max_batch_requests: a batch holds at most ${options.maxRequests} requests`);
      }
      continue;
    }
    if (text === null) {
      errors.add(line, "", "is not valid UTF-8");
      continue;
    }
    const parsed = parseJsonText(text);
    if ("problem" in parsed) {
      errors.add(line, "", parsed.problem.replace(/\.$/, ""));
      continue;
    }
    const body = parsed.body;
    let valid = true;
    try {
      options.checkQuestionCount(body);
    } catch (err) {
      if (!(err instanceof ServiceError) || err.code !== "invalid_body") throw err;
      valid = false;
      for (const problem of err.extra.errors ?? []) errors.add(line, problem.field, problem.message);
    }
    if (valid && !validateLine(body)) {
      valid = false;
      const summary = summarizeFieldErrors(validateLine.errors ?? [], Math.max(0, errors.room));
      for (const problem of summary.errors) errors.add(line, problem.field, problem.message);
      errors.more += summary.total - summary.errors.length;
    }
    let customId = customIdOf(body);
    if (customId !== null && UNSTORABLE_IN_CUSTOM_ID.test(customId)) {
      customId = null;
      valid = false;
      errors.add(line, "custom_id", "must be well-formed Unicode without control characters (U+0000–U+001F, U+007F–U+009F)");
    }
    if (customId !== null) {
      const first = lineOfCustomId.get(customId);
      if (first === undefined) lineOfCustomId.set(customId, line);
      else {
        valid = false;
        errors.add(line, "custom_id", `repeats the custom_id of line ${first}: custom_ids must be unique within a batch`);
      }
    }
    if (valid && errors.none) {
      await options.accept({ position: accepted, line, customId: customId!, text, request: body as BatchRequestLine });
      accepted++;
    }
  }
  if (requests === 0) errors.listed.push({ field: "(body)", message: "has no requests: send one JSON object a line" });
  return { accepted, errors: errors.listed, moreErrors: errors.more, bytes: lines.bytes, sha256: lines.sha256 };
}
