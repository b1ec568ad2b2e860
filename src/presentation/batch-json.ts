import type { Batch, BatchStatus } from "../contract/batches.ts";
import { formatUsd } from "../domain/money.ts";
import type { BatchRecord, BatchResult } from "../store/batches.ts";

const isoOrNull = (ms: number | null): string | null => (ms === null ? null : new Date(ms).toISOString());

/** The status the API shows; a `validating` batch (an upload being read) is never shown. */
function shownStatus(record: BatchRecord): BatchStatus {
  if (record.status === "validating") throw new Error(`batch ${record.id} is still being uploaded and cannot be shown`);
  return record.status;
}

/** A batch as the public API (/v1/batches…) shows it: snake_case keys, ISO-8601 UTC times, the cost in microUSD and USD. */
export function batchJson(record: BatchRecord): Batch {
  return {
    id: record.id,
    object: "batch",
    status: shownStatus(record),
    model: record.model,
    created_at: new Date(record.createdAtMs).toISOString(),
    started_at: isoOrNull(record.startedAtMs),
    ended_at: isoOrNull(record.endedAtMs),
    expires_at: new Date(record.expiresAtMs).toISOString(),
    request_counts: { total: record.total, succeeded: record.succeeded, failed: record.failed },
    cost_microusd: record.costMicrousd,
    cost_usd: formatUsd(record.costMicrousd),
  };
}

/** Line breaks outside JSON strings are whitespace (inside they are escaped): without them the body stays one NDJSON line. */
const LINE_BREAKS = /[\r\n]/g;

/**
 * One line of GET /v1/batches/{id}/results (a BatchResultLine), newline included. The stored body is JSON text
 * written into the line as it is, never parsed again.
 */
export function batchResultLine(result: BatchResult): string {
  const body = result.body.includes("\n") || result.body.includes("\r") ? result.body.replace(LINE_BREAKS, " ") : result.body;
  return `{"custom_id":${JSON.stringify(result.customId)},"request_id":${JSON.stringify(result.requestId)},"status":${result.status},"body":${body}}\n`;
}
