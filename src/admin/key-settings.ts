import type { Config } from "../config.ts";
import { listingServices } from "../config-models.ts";
import { type FieldProblem, ServiceError } from "../domain/errors.ts";
import { parseUsd } from "../domain/money.ts";
import type { BudgetPeriod, KeySettings } from "../domain/organizations.ts";
import { MAX_KEY_MODELS } from "../store/input-checks.ts";
import { AdminError } from "./admin-error.ts";

/** A key's settings as a request gives them (the admin API's body): each may be absent; null clears (none of its own). */
export interface KeySettingsRequest {
  expires_at?: string | null;
  models?: string[] | null;
  requests_per_minute?: number | null;
  budget?: { usd: string; period: BudgetPeriod } | null;
}

/** Why a model name cannot be a key's model (unknown), or null when it can (a model's name or an alias). */
export type ModelCheck = (name: string) => Promise<string | null>;

/** What a key's settings are checked against, beyond their shape. */
export interface KeyRules {
  /** The organization's per-minute request limit (limits.requests_per_minute): a key's own cannot be more. */
  requestsPerMinute: number;
  /** Null when the models are not known here (a model service lists them): any name is taken. */
  checkModel: ModelCheck | null;
}

const RFC3339 = /^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d{1,9})?(?:[Zz]|([+-])(\d{2}):(\d{2}))$/;

/**
 * An RFC 3339 time as epoch milliseconds (fractions below a millisecond dropped), or null. Strict where Date.parse is
 * not: a date that does not exist (2030-02-30), 24:00 and offsets beyond 23:59 are refused.
 */
export function parseRfc3339(text: string): number | null {
  const m = RFC3339.exec(text);
  if (!m) return null;
  const [year, month, day, hour, minute, second] = m.slice(1, 7).map(Number) as [number, number, number, number, number, number];
  const [offsetHours, offsetMinutes] = [Number(m[9] ?? 0), Number(m[10] ?? 0)];
  if (hour > 23 || minute > 59 || second > 59 || offsetHours > 23 || offsetMinutes > 59) return null;
  const date = new Date(0);
  date.setUTCFullYear(year, month - 1, day);
  if (date.getUTCFullYear() !== year || date.getUTCMonth() !== month - 1 || date.getUTCDate() !== day) return null;
  const offsetMs = (m[8] === "-" ? -1 : 1) * (offsetHours * 60 + offsetMinutes) * 60_000;
  const fractionMs = m[7] === undefined ? 0 : Math.floor(Number(`0${m[7]}`) * 1000);
  const ms = date.getTime() + ((hour * 60 + minute) * 60 + second) * 1000 + fractionMs - offsetMs;
  return Number.isSafeInteger(ms) && Math.abs(ms) <= 8.64e15 ? ms : null;
}

/**
 * The settings of a request as stored (absent stays absent, null stays null), checked beyond the schema: an exact
 * decimal budget, an expiry in the future, models the configuration serves, a per-minute limit within the
 * organization's. Every problem found is an `invalid` AdminError's field error.
 */
export async function keySettingsOf(
  request: KeySettingsRequest,
  rules: KeyRules | undefined,
  nowMs: number,
): Promise<Partial<KeySettings>> {
  const problems: FieldProblem[] = [];
  const settings: Partial<KeySettings> = {};
  const { expires_at: expiresAt, models, requests_per_minute: rpm, budget } = request;

  if (expiresAt === null) settings.expiresAtMs = null;
  else if (expiresAt !== undefined) {
    const ms = typeof expiresAt === "string" ? parseRfc3339(expiresAt) : null;
    if (ms === null) problems.push({ field: "expires_at", message: "must be an RFC 3339 time such as 2027-01-31T00:00:00Z" });
    else if (ms <= nowMs)
      problems.push({ field: "expires_at", message: `must be in the future (it is ${new Date(nowMs).toISOString()} now)` });
    else settings.expiresAtMs = ms;
  }

  if (models === null) settings.models = null;
  else if (models !== undefined) {
    const found = await modelProblems(models, rules?.checkModel ?? null);
    problems.push(...found);
    if (found.length === 0) settings.models = [...models];
  }

  if (rpm === null) settings.requestsPerMinute = null;
  else if (rpm !== undefined) {
    if (typeof rpm !== "number" || !Number.isSafeInteger(rpm) || rpm < 1)
      problems.push({ field: "requests_per_minute", message: "must be a whole number above 0" });
    else if (rules && rpm > rules.requestsPerMinute)
      problems.push({
        field: "requests_per_minute",
        message: `must be at most ${rules.requestsPerMinute}, the organization's requests_per_minute (a key's limit is within its organization's)`,
      });
    else settings.requestsPerMinute = rpm;
  }

  if (budget === null) settings.budget = null;
  else if (budget !== undefined) {
    const usd = typeof budget.usd === "string" && budget.usd === budget.usd.trim() ? parseUsd(budget.usd) : null;
    if (usd === null)
      problems.push({ field: "budget.usd", message: "must be a decimal USD amount such as 25 or 12.50 (at most 6 decimals)" });
    if (budget.period !== "day" && budget.period !== "month")
      problems.push({ field: "budget.period", message: 'must be "day" or "month"' });
    else if (usd !== null) settings.budget = { limitMicrousd: Number(usd), period: budget.period };
  }

  if (problems.length > 0) throw AdminError.fields(problems);
  return settings;
}

async function modelProblems(models: unknown, check: ModelCheck | null): Promise<FieldProblem[]> {
  if (!Array.isArray(models) || models.length === 0 || models.length > MAX_KEY_MODELS)
    return [{ field: "models", message: `must list 1 to ${MAX_KEY_MODELS} model names (null: every model)` }];
  const problems: FieldProblem[] = [];
  const seen = new Set<string>();
  for (const [i, name] of models.entries()) {
    const field = `models[${i}]`;
    if (typeof name !== "string" || name.trim() === "" || name !== name.trim())
      problems.push({ field, message: "must be a model name (not empty, no spaces around it)" });
    else if (seen.has(name)) problems.push({ field, message: `names ${JSON.stringify(name)} twice` });
    else {
      seen.add(name);
      const problem = check === null ? null : await check(name);
      if (problem !== null) problems.push({ field, message: problem });
    }
  }
  return problems;
}

/**
 * The rules of a configuration where no model registry runs (the CLI on the database): its organizations' per-minute
 * limit, and the models it names (any name when a model service lists them, or when it names none).
 */
export function configKeyRules(config: Pick<Config, "limits" | "models" | "modelServices" | "aliases">): KeyRules {
  const named = listingServices(config).length === 0 && config.models.length > 0;
  const known = new Set([...config.models.flatMap((m) => [m.name, ...m.aliases]), ...Object.keys(config.aliases)]);
  return {
    requestsPerMinute: config.limits.requestsPerMinute,
    checkModel: named ? async (name) => (known.has(name) ? null : unknownModel(name)) : null,
  };
}

const unknownModel = (name: string) => `unknown model ${JSON.stringify(name)}; see GET /v1/models for the names offered`;

/**
 * The check of the serving gateway's model registry (as POST /v1/batches checks ?model=): the name (or alias) must
 * resolve. When the models cannot be had now (none offered, a service not answering), any name is taken.
 */
export function registryModelCheck(resolve: (name: string) => Promise<unknown>): ModelCheck {
  return async (name) => {
    try {
      await resolve(name);
      return null;
    } catch (err) {
      return err instanceof ServiceError && err.code === "unknown_model" ? unknownModel(name) : null;
    }
  };
}
