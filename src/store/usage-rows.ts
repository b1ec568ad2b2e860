import type { UsageOutcome, UsageRecord } from "./store.ts";

/** A usage_records row, the same in every dialect but for the flag: SQLite stores 0/1, PostgreSQL a boolean. */
export interface UsageRow {
  request_id: string;
  org_id: string;
  key_id: string;
  created_at_ms: number;
  source: UsageRecord["source"];
  model: string;
  mode: UsageRecord["mode"];
  outcome: UsageOutcome;
  http_status: number | null;
  input_tokens: number;
  output_tokens: number;
  cost_microusd: number;
  latency_ms: number | null;
  gateway_latency_ms: number;
  error_detail: string | null;
  over_reservation: boolean | number;
  completed_at_ms: number | null;
  deployment: string | null;
  attempts: number;
}

export const USAGE_COLUMNS =
  "request_id, org_id, key_id, created_at_ms, source, model, mode, outcome, http_status, input_tokens, output_tokens, " +
  "cost_microusd, latency_ms, gateway_latency_ms, error_detail, over_reservation, completed_at_ms, deployment, attempts";

export function toUsage(row: UsageRow): UsageRecord {
  return {
    requestId: row.request_id,
    orgId: row.org_id,
    keyId: row.key_id,
    createdAtMs: row.created_at_ms,
    completedAtMs: row.completed_at_ms,
    source: row.source,
    model: row.model,
    mode: row.mode,
    outcome: row.outcome,
    httpStatus: row.http_status,
    inputTokens: row.input_tokens,
    outputTokens: row.output_tokens,
    costMicrousd: row.cost_microusd,
    latencyMs: row.latency_ms,
    gatewayLatencyMs: row.gateway_latency_ms,
    errorDetail: row.error_detail,
    overReservation: row.over_reservation === true || row.over_reservation === 1,
    deployment: row.deployment,
    attempts: row.attempts,
  };
}
