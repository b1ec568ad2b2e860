import type { TSchema } from "@sinclair/typebox";
import { Ajv, type ErrorObject, type ValidateFunction } from "ajv";
import type { FieldError } from "./errors.ts";

/** Bound on errors[] in a response; the detail says when more were found. */
export const MAX_FIELD_ERRORS = 50;

/**
 * One Ajv for every contract schema: all errors, no coercion, no stripping of unknown fields,
 * no defaults filled in, `oneOf` + `discriminator` for the tagged unions.
 */
export function createAjv(): Ajv {
  return new Ajv({
    allErrors: true,
    coerceTypes: false,
    removeAdditional: false,
    useDefaults: false,
    discriminator: true,
    strict: false,
    validateFormats: false,
  });
}

const sharedAjv = createAjv();

export function compileSchema<T>(schema: TSchema): ValidateFunction<T> {
  return sharedAjv.compile<T>(schema);
}

/** Problems a bounded validation counted but did not hand to the schema, by the errors array it returned. */
const omittedProblems = new WeakMap<readonly ErrorObject[], number>();

/** A validator like Ajv's: true, or false with its errors in `errors`. */
export interface BoundedValidateFunction {
  (data: unknown): boolean;
  errors: ErrorObject[] | null;
}

/**
 * A validator that first cuts the data down with `bound` (which counts the problems it cuts away) and lets the schema
 * check only the rest: the schema's work and its number of errors stay bounded whatever the data's shape. The count
 * of what was cut away is added to the total by `summarizeFieldErrors`.
 */
export function compileBoundedSchema(
  schema: TSchema,
  bound: (data: unknown) => { body: unknown; omitted: number },
): BoundedValidateFunction {
  const validate = sharedAjv.compile(schema);
  const bounded: BoundedValidateFunction = Object.assign(
    (data: unknown): boolean => {
      const cut = bound(data);
      // What is cut away is only ever a problem, never what makes data valid: a valid cut means valid data.
      if (validate(cut.body)) {
        bounded.errors = null;
        return true;
      }
      const errors = validate.errors ?? [];
      if (cut.omitted > 0) omittedProblems.set(errors, cut.omitted);
      bounded.errors = errors;
      return false;
    },
    { errors: null },
  );
  return bounded;
}

function pathSegments(instancePath: string): string[] {
  if (instancePath === "") return [];
  return instancePath
    .slice(1)
    .split("/")
    .map((segment) => segment.replace(/~1/g, "/").replace(/~0/g, "~"));
}

const TYPE_NAMES: Record<string, string> = {
  object: "an object",
  array: "an array",
  string: "a string",
  number: "a number",
  integer: "an integer",
  boolean: "a boolean",
  null: "null",
};

function describeType(type: unknown): string {
  const types = Array.isArray(type) ? type : [type];
  return types.map((t) => TYPE_NAMES[String(t)] ?? String(t)).join(" or ");
}

function itemWord(path: string[]): string {
  if (path.length === 1 && path[0] === "questions") return "questions";
  if (path.length === 3 && path[0] === "questions" && path[2] === "criteria") return "options";
  return "entries";
}

/** Length in Unicode code points (as Ajv counts it), without building an array of them. */
function codePoints(text: string): number {
  let n = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff && i + 1 < text.length) {
      const d = text.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) i++;
    }
    n++;
  }
  return n;
}

/** A client's value quoted in a message: at most 100 characters of it (a 1 MiB tag is not echoed back whole). */
function shortened(value: string): string {
  return value.length > 100 ? `${value.slice(0, 100)}…` : value;
}

/** One readable {field, message} for one Ajv error; null for errors that only wrap others. */
function describe(error: ErrorObject): FieldError | null {
  const path = pathSegments(error.instancePath);
  const field = (extra?: string) => [...path, ...(extra === undefined ? [] : [extra])].join(".") || "(body)";
  const p = error.params as Record<string, unknown>;
  switch (error.keyword) {
    case "required":
      return { field: field(String(p.missingProperty)), message: "is required" };
    case "additionalProperties":
      return { field: field(String(p.additionalProperty)), message: "is not a field of the contract (unknown fields are rejected)" };
    case "type":
      return { field: field(), message: `must be ${describeType(p.type)}` };
    case "const":
      return { field: field(), message: `must be ${JSON.stringify(p.allowedValue)}` };
    case "minProperties":
      return { field: field(), message: `must have at least ${p.limit} ${itemWord(path)}` };
    case "maxProperties":
      return { field: field(), message: `must have at most ${p.limit} ${itemWord(path)}` };
    case "minItems":
      return { field: field(), message: `must have at least ${p.limit} ${path.at(-1) === "criteria" ? "levels" : "items"}` };
    case "maxItems":
      return { field: field(), message: `must have at most ${p.limit} ${path.at(-1) === "criteria" ? "levels" : "items"}` };
    case "minLength":
    case "maxLength": {
      if (typeof p.propertyName === "string" || error.propertyName !== undefined) {
        const name = String(error.propertyName ?? p.propertyName);
        return {
          field: field(name),
          message: `id must be ${path[0] === "questions" ? "1 to 100" : "a valid number of"} characters long (it has ${codePoints(name)})`,
        };
      }
      const word = error.keyword === "minLength" ? "at least" : "at most";
      return { field: field(), message: `must be ${word} ${p.limit} characters long` };
    }
    case "minimum":
    case "maximum":
      return { field: field(), message: `must be ${error.keyword === "minimum" ? ">=" : "<="} ${p.limit}` };
    case "pattern":
      return { field: field(), message: "has an invalid format" };
    case "discriminator": {
      if (p.error === "tag") return { field: field(String(p.tag)), message: 'is required and must be one of "choice", "score", "noul"' };
      return {
        field: field(String(p.tag)),
        message: `must be one of "choice", "score", "noul" (got ${JSON.stringify(shortened(String(p.tagValue)))})`,
      };
    }
    case "propertyNames":
    case "anyOf":
    case "oneOf":
      return null;
    default:
      return { field: field(), message: error.message ?? "is invalid" };
  }
}

/** The field errors of one failed validation: at most `limit` of them, and how many distinct problems there were. */
export interface FieldErrorSummary {
  errors: FieldError[];
  /** Every distinct problem found, listed or not (exact). */
  total: number;
}

/** A failed `anyOf` at one instance path and the errors of its branches there. */
interface AnyOfGroup {
  owner: ErrorObject;
  /** The types the branches' type mismatches name, without repeats, in order of appearance. */
  types: Set<unknown>;
  /** Every branch error is a type mismatch: they collapse into one "must be X or Y". */
  onlyTypes: boolean;
}

/**
 * What, besides its instance path and keyword, tells one error's problem from another's: the parameters its message
 * is made of (equal instance path, keyword and detail give equal messages). A primitive, usually a string Ajv already
 * holds (a property name, a schema constant), so that telling problems apart allocates nothing per error.
 */
function problemDetail(e: ErrorObject): unknown {
  const p = e.params as Record<string, unknown>;
  switch (e.keyword) {
    case "required":
      return p.missingProperty;
    case "additionalProperties":
      return p.additionalProperty;
    case "discriminator":
      return p.error === "tag"
        ? `tag\u0000${String(p.tag)}`
        : `mapping\u0000${String(p.tag)}\u0000${typeof p.tagValue === "string" ? p.tagValue : ""}`;
    case "minLength":
    case "maxLength":
      return e.propertyName !== undefined || typeof p.propertyName === "string"
        ? `name\u0000${String(e.propertyName ?? p.propertyName)}`
        : p.limit;
    case "type":
      return Array.isArray(p.type) ? p.type.join(",") : p.type;
    case "const":
      return JSON.stringify(p.allowedValue);
    default:
      return "limit" in p ? p.limit : (e.message ?? "");
  }
}

/**
 * The errors of one keyword at one instance path. One schema location reports each problem once (an object's keys
 * are unique, so are a `required` list's names): repeats can only come from a second schema location at the same
 * path (a union's branches), and only then are the details compared.
 */
interface Slot {
  schemaPath: string;
  /** Errors from more than one schema location: compare details. */
  mixed: boolean;
  details?: Set<unknown>;
}

/**
 * The slots by instance path and keyword; the last one is kept at hand, since Ajv reports an object's problems one
 * after the other. Nothing is allocated per error and no key string is built: a body can carry 100,000 errors.
 */
class Slots {
  private readonly byPath = new Map<string, Map<string, Slot>>();
  private lastPath: string | null = null;
  private lastKeyword: string | null = null;
  private lastSlot: Slot | null = null;

  of(e: ErrorObject): Slot {
    if (e.instancePath === this.lastPath && e.keyword === this.lastKeyword) return this.lastSlot!;
    let byKeyword = this.byPath.get(e.instancePath);
    if (!byKeyword) {
      byKeyword = new Map();
      this.byPath.set(e.instancePath, byKeyword);
    }
    let slot = byKeyword.get(e.keyword);
    if (!slot) {
      slot = { schemaPath: e.schemaPath, mixed: false };
      byKeyword.set(e.keyword, slot);
    }
    this.lastPath = e.instancePath;
    this.lastKeyword = e.keyword;
    this.lastSlot = slot;
    return slot;
  }
}

/**
 * Turns Ajv's errors into the contract's field errors, in Ajv's order, each distinct problem once. For a failed
 * `anyOf` (a nullable field), the branches' type mismatches collapse into one "must be X or Y" message, while a
 * branch's deeper problem (too long, unknown key) is reported as itself.
 *
 * Linear in the number of errors: the anyOf branches are grouped by instance path in one pass, and messages are
 * built only for the first `limit` problems; the rest are only counted (`total` stays exact).
 */
export function summarizeFieldErrors(errors: readonly ErrorObject[], limit: number = MAX_FIELD_ERRORS): FieldErrorSummary {
  const groups = new Map<string, AnyOfGroup>();
  for (const e of errors) if (e.keyword === "anyOf") groups.set(e.instancePath, { owner: e, types: new Set(), onlyTypes: true });
  // No closures are created per error below: tsx wraps each in a naming helper, which costs more than the work.
  const inGroup = (e: ErrorObject, group: AnyOfGroup | undefined): group is AnyOfGroup =>
    group !== undefined && e !== group.owner && e.schemaPath.startsWith(group.owner.schemaPath);
  if (groups.size > 0) {
    let lastPath: string | null = null;
    let group: AnyOfGroup | undefined;
    for (const e of errors) {
      if (e.instancePath !== lastPath) {
        lastPath = e.instancePath;
        group = groups.get(lastPath);
      }
      if (!inGroup(e, group)) continue;
      if (e.keyword !== "type") group.onlyTypes = false;
      else for (const t of Array.isArray(e.params.type) ? e.params.type : [e.params.type]) group.types.add(t);
    }
  }

  // Which errors are reported (not wrappers, not a type mismatch folded into its anyOf), and which of their
  // slots gather errors from more than one schema location.
  const isWrapper = (e: ErrorObject) => e.keyword === "propertyNames" || e.keyword === "anyOf" || e.keyword === "oneOf";
  const collapsedInto = (e: ErrorObject): AnyOfGroup | undefined => {
    if (groups.size === 0 || e.keyword !== "type") return undefined;
    const group = groups.get(e.instancePath);
    return inGroup(e, group) ? group : undefined;
  };
  const slots = new Slots();
  for (const e of errors) {
    if (isWrapper(e) || collapsedInto(e)) continue;
    const slot = slots.of(e);
    if (slot.schemaPath !== e.schemaPath) slot.mixed = true;
  }

  const out: FieldError[] = [];
  const collapsedPaths = new Set<string>();
  let total = 0;
  for (const e of errors) {
    if (isWrapper(e)) continue;
    const group = collapsedInto(e);
    if (group) {
      // The branches' type mismatches: one "must be X or Y" per path, unless a branch has a deeper problem of its own.
      if (!group.onlyTypes || collapsedPaths.has(e.instancePath)) continue;
      collapsedPaths.add(e.instancePath);
      total += 1;
      if (out.length < limit)
        out.push({ field: pathSegments(e.instancePath).join(".") || "(body)", message: `must be ${describeType([...group.types])}` });
      continue;
    }
    const slot = slots.of(e);
    if (slot.mixed) {
      const detail = problemDetail(e);
      slot.details ??= new Set();
      if (slot.details.has(detail)) continue;
      slot.details.add(detail);
    }
    total += 1;
    if (out.length < limit) out.push(describe(e)!);
  }
  return { errors: out, total: total + (omittedProblems.get(errors) ?? 0) };
}

/** Every field error of a failed validation (see `summarizeFieldErrors`; for small inputs such as the config file). */
export function toFieldErrors(errors: readonly ErrorObject[]): FieldError[] {
  return summarizeFieldErrors(errors, Number.POSITIVE_INFINITY).errors;
}
