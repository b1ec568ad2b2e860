import type { UsageRecordJson } from "../contract/usage.ts";
import { formatUsd } from "../domain/money.ts";
import type { UsageRecord } from "../domain/usage-records.ts";

export type { UsageRecordJson };

/**
 * A usage record as the public API (GET /v1/usage…) and `tds usage --json` show it: snake_case keys in this
 * order, times as ISO-8601 UTC, the cost in both integer microUSD and a decimal USD string. The organization
 * id is not included (every lookup is already scoped to one organization).
 */
export function usageRecordJson(record: UsageRecord): UsageRecordJson {
  return {
    request_id: record.requestId,
    created_at: new Date(record.createdAtMs).toISOString(),
    completed_at: record.completedAtMs === null ? null : new Date(record.completedAtMs).toISOString(),
    key_id: record.keyId,
    source: record.source,
    model: record.model,
    service_mode: record.mode,
    outcome: record.outcome,
    http_status: record.httpStatus,
    input_tokens: record.inputTokens,
    output_tokens: record.outputTokens,
    cost_microusd: record.costMicrousd,
    cost_usd: formatUsd(record.costMicrousd),
    latency_ms: record.latencyMs,
    gateway_latency_ms: record.gatewayLatencyMs,
    over_reservation: record.overReservation,
    error: record.errorDetail,
    deployment: record.deployment,
    attempts: record.attempts,
  };
}
