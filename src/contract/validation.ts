import { Ajv, type ErrorObject, type ValidateFunction } from "ajv";
import type { TSchema } from "@sinclair/typebox";
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
          message: `id must be ${path[0] === "questions" ? "1 to 100" : "a valid number of"} characters long (it has ${[...name].length})`,
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
      return { field: field(String(p.tag)), message: `must be one of "choice", "score", "noul" (got ${JSON.stringify(p.tagValue)})` };
    }
    case "propertyNames":
    case "anyOf":
    case "oneOf":
      return null;
    default:
      return { field: field(), message: error.message ?? "is invalid" };
  }
}

/**
 * Turns Ajv's errors into the contract's field errors. For a failed `anyOf` (a nullable field),
 * the branches' type mismatches collapse into one "must be X or Y" message, while a branch's
 * deeper problem (too long, unknown key) is reported as itself.
 */
export function toFieldErrors(errors: readonly ErrorObject[]): FieldError[] {
  const anyOfPaths = new Map<string, ErrorObject>();
  for (const e of errors) if (e.keyword === "anyOf") anyOfPaths.set(e.instancePath, e);

  const out: FieldError[] = [];
  const seen = new Set<string>();
  const push = (fe: FieldError | null) => {
    if (!fe) return;
    const id = `${fe.field}\u0000${fe.message}`;
    if (!seen.has(id)) {
      seen.add(id);
      out.push(fe);
    }
  };

  for (const e of errors) {
    const owner = anyOfPaths.get(e.instancePath);
    if (owner && e !== owner && e.keyword === "type" && e.schemaPath.startsWith(owner.schemaPath)) {
      const siblings = errors.filter(
        (x) => x.instancePath === e.instancePath && x.schemaPath.startsWith(owner.schemaPath) && x !== owner,
      );
      if (siblings.every((x) => x.keyword === "type")) {
        const types = siblings.flatMap((x) => (Array.isArray(x.params.type) ? x.params.type : [x.params.type]));
        const path = pathSegments(e.instancePath).join(".") || "(body)";
        push({ field: path, message: `must be ${describeType([...new Set(types)])}` });
      }
      continue;
    }
    push(describe(e));
  }
  return out;
}
