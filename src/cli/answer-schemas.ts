import type { TSchema } from "@sinclair/typebox";
import { Ajv, type ValidateFunction } from "ajv";

// Answers are checked against the contract's schemas; fields a newer gateway adds are dropped rather than refused.
const ajv = new Ajv({
  allErrors: false,
  coerceTypes: false,
  removeAdditional: "all",
  useDefaults: false,
  strict: false,
  validateFormats: false,
});
const validators = new WeakMap<TSchema, ValidateFunction>();

/** The check of a gateway answer against its contract schema (compiled once per schema). */
export function answerValidator(schema: TSchema): ValidateFunction {
  let validate = validators.get(schema);
  if (!validate) {
    validate = ajv.compile(schema);
    validators.set(schema, validate);
  }
  return validate;
}

/** The first problem the last check found, in words ("body/field must be …"). */
export function answerProblem(validate: ValidateFunction): string {
  return ajv.errorsText(validate.errors, { dataVar: "body" });
}
