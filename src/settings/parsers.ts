import { databaseUrlProblem } from "../database-url.ts";
import { addressRangeProblem } from "../domain/address-ranges.ts";
import { keyIdOf } from "../domain/api-keys.ts";
import { formatUsd, parseUsd } from "../domain/money.ts";
import { weakSecretProblem } from "../domain/secret-strength.ts";
import { withoutPassword } from "./url-passwords.ts";

/**
 * A value, or what is wrong with it: each problem is the rest of a sentence that starts with the setting's label
 * (`PORT` or the config file's `limits.max_questions`); one that starts with ":" follows the label directly.
 */
export type Parsed<T> = { value: T } | { problems: string[] };

/** One setting's parser, for both of its sources: an environment variable's text and the config file's JSON value. */
export interface Parser<T> {
  /** The variable's text, trimmed and not empty. */
  fromText(text: string): Parsed<T>;
  /** The file's value; the config file's schema has checked its JSON type only. */
  fromFile(value: unknown): Parsed<T>;
}

const ok = <T>(value: T): Parsed<T> => ({ value });
const problem = <T>(text: string): Parsed<T> => ({ problems: [text] });
const got = (value: unknown) => `(got ${JSON.stringify(value)})`;

/** A whole number from min to max; in the file a JSON integer. */
export function integer(min: number, max: number): Parser<number> {
  const check = (value: number, shown: unknown): Parsed<number> =>
    Number.isSafeInteger(value) && value >= min && value <= max
      ? ok(value)
      : problem(`must be a whole number from ${min} to ${max} ${got(shown)}`);
  return {
    fromText: (text) =>
      /^[0-9]+$/.test(text) ? check(Number(text), text) : problem(`must be a whole number from ${min} to ${max} ${got(text)}`),
    fromFile: (value) => check(value as number, value),
  };
}

/** An integer from min to max, or JSON null (file only). */
export function integerOrNull(min: number, max: number): Parser<number | null> {
  const whole = integer(min, max);
  return { fromText: whole.fromText, fromFile: (value) => (value === null ? ok(null) : whole.fromFile(value)) };
}

/** Any text that is not blank. */
export function text(): Parser<string> {
  return { fromText: ok, fromFile: (value) => ok(value as string) };
}

/** One of the choices: two are named as `"a" or "b"`, more as `one of a, b, c`. */
export function choice<T extends string>(choices: readonly T[], options: { anyCase?: boolean } = {}): Parser<T> {
  const expected = choices.length === 2 ? `"${choices[0]}" or "${choices[1]}"` : `one of ${choices.join(", ")}`;
  const check = (given: string): Parsed<T> => {
    const value = options.anyCase ? given.toLowerCase() : given;
    return (choices as readonly string[]).includes(value) ? ok(value as T) : problem(`must be ${expected} ${got(value)}`);
  };
  return { fromText: check, fromFile: (value) => check(value as string) };
}

/** true or false; the variable also takes 1 and 0. */
export function boolean(): Parser<boolean> {
  return {
    fromText: (given) =>
      ["true", "1"].includes(given)
        ? ok(true)
        : ["false", "0"].includes(given)
          ? ok(false)
          : problem(`must be true or false ${got(given)}`),
    fromFile: (value) => ok(value as boolean),
  };
}

/** A decimal USD amount with at most 6 decimals, normalised ("0.50" → "0.5"). */
export function usd(): Parser<string> {
  const check = (given: string): Parsed<string> => {
    const micro = parseUsd(given);
    return micro === null
      ? problem(`must be a decimal USD amount with at most 6 decimal places, such as "0.50" ${got(given)}`)
      : ok(formatUsd(micro));
  };
  return { fromText: check, fromFile: (value) => check(value as string) };
}

/** A decimal with at most 6 decimal places in millionths ("0.25" → 250000n), read as USD amounts are; null for any other text. */
export function millionthsOf(given: string): bigint | null {
  return given.trim() === given ? parseUsd(given) : null;
}

/** A decimal factor from 0 to max with at most 6 decimal places, normalised ("0.50" → "0.5"); in the file a JSON string. */
export function decimalFactor(max: number): Parser<string> {
  const check = (given: string): Parsed<string> => {
    const millionths = millionthsOf(given);
    return millionths === null || millionths > BigInt(max) * 1_000_000n
      ? problem(`must be a decimal number from 0 to ${max} with at most 6 decimal places, such as "0.5" ${got(given)}`)
      : ok(formatUsd(millionths));
  };
  return { fromText: check, fromFile: (value) => check(value as string) };
}

/** Addresses, CIDR ranges and loopback / linklocal / uniquelocal: comma-separated, or a JSON array in the file. */
export function addressRangeList(): Parser<string[]> {
  const check = (entries: string[]): Parsed<string[]> => {
    const list = entries.map((s) => s.trim()).filter(Boolean);
    const problems = list.flatMap((entry) => {
      const wrong = addressRangeProblem(entry);
      return wrong === null ? [] : [`: ${JSON.stringify(entry)} ${wrong}`];
    });
    return problems.length > 0 ? { problems } : ok(list);
  };
  return { fromText: (given) => check(given.split(",")), fromFile: (value) => check(value as string[]) };
}

/** `alias=model,alias2=model2`; in the file a JSON object of alias → model. */
export function aliasMap(): Parser<Record<string, string>> {
  return {
    fromText: (given) => {
      const out: Record<string, string> = {};
      const problems: string[] = [];
      for (const pair of given
        .split(",")
        .map((s) => s.trim())
        .filter(Boolean)) {
        const [alias, target, ...rest] = pair.split("=").map((s) => s.trim());
        if (!alias || !target || rest.length > 0) problems.push(`: "${pair}" is not of the form alias=model`);
        else out[alias] = target;
      }
      return problems.length > 0 ? { problems } : ok(out);
    },
    fromFile: (value) => ok({ ...(value as Record<string, string>) }),
  };
}

/**
 * A bearer token: at least 32 characters and not trivially weak (secret-strength.ts); `notAnApiKey` also refuses one
 * shaped like an API key, so neither is taken for the other.
 */
export function token(options: { generate: string; notAnApiKey?: boolean }): Parser<string> {
  const advice = `generate one with: ${options.generate}`;
  const check = (given: string): Parsed<string> => {
    const weak = weakSecretProblem(given);
    if (weak !== null) return problem(`${weak}; ${advice}`);
    if (options.notAnApiKey && keyIdOf(given) !== null) return problem(`must not be an API key (tds_…); ${advice}`);
    return ok(given);
  };
  return { fromText: check, fromFile: (value) => check(value as string) };
}

/** A SQLite or PostgreSQL database URL (its form only); a password never appears in the message. */
export function databaseUrl(): Parser<string> {
  const check = (given: string): Parsed<string> => {
    const wrong = databaseUrlProblem(given);
    return wrong === null ? ok(given) : problem(`${JSON.stringify(withoutPassword(given))} ${wrong}`);
  };
  return { fromText: check, fromFile: (value) => check(value as string) };
}

/** A redis:// or rediss:// URL; a password never appears in the message. */
export function redisUrl(): Parser<string> {
  const check = (given: string): Parsed<string> =>
    /^rediss?:\/\//.test(given) ? ok(given) : problem(`must be a redis:// or rediss:// URL ${got(withoutPassword(given))}`);
  return { fromText: check, fromFile: (value) => check(value as string) };
}
