import type { HealthChange, HealthState } from "../models/routing/types.ts";
import { logSafe, MAX_LOGGED_REASON_CHARS } from "./model-failure-report.ts";

export interface HealthLogLine {
  level: "warn" | "info";
  fields: {
    model: string;
    deployment: string;
    /** The ModelErrorKind behind the cooldown ("unknown" when none was kept). */
    failure?: string;
    upstream_status?: number;
    /** The adapter's description and the model service's own words: bounded, control characters escaped. */
    reason?: string;
  };
  message: string;
}

/**
 * The server log's line for a deployment's health change, or null. A healthy deployment that stops taking calls gets
 * one "deployment failing" (warn) with the failure's kind and words — for operators only: they may name hosts or
 * credentials, which is why no client sees them; one that takes calls again (a health check or a call succeeded) gets
 * one "deployment healthy again" (info). The moves between a cooldown and a probe while it stays down say nothing new
 * and are not logged.
 *
 * An in-process engine that is not ready (`not_ready`: loading, retrying, not installed) logs what it is doing itself,
 * at the level it deserves; its deployment's line is then info, with the kind only: every start with an engine has it.
 */
export function deploymentHealthLine(model: string, deployment: string, state: HealthState, change: HealthChange): HealthLogLine | null {
  if (state === "healthy") return { level: "info", fields: { model, deployment }, message: "deployment healthy again" };
  if (change.from !== "healthy") return null;
  const f = change.failure;
  if (f?.kind === "not_ready") return { level: "info", fields: { model, deployment, failure: f.kind }, message: "deployment failing" };
  const reason = f === null ? "no failure was recorded" : f.upstreamText !== undefined ? `${f.message}: ${f.upstreamText}` : f.message;
  return {
    level: "warn",
    fields: {
      model,
      deployment,
      failure: f?.kind ?? "unknown",
      ...(f?.upstreamStatus !== undefined ? { upstream_status: f.upstreamStatus } : {}),
      reason: logSafe(reason, MAX_LOGGED_REASON_CHARS),
    },
    message: "deployment failing",
  };
}
