/**
 * Usage records as the service wrote them before migration 012 (source 'api' or 'playground' only): the migration
 * tests of both databases.
 */
import { T0 } from "../store/store-contract.ts";

const HOUR = 3_600_000;

/**
 * req_api a paid request settled (40 of 100) on instance inst_1 after two attempts, req_play a Playground preview
 * request that failed, req_run a paid request in flight with its reservation pending. `bool` writes a boolean in
 * the dialect.
 */
export function usageRowsBefore012(bool: (b: boolean) => string): string {
  return `
  INSERT INTO organizations (id, name, paused, created_at_ms) VALUES ('org_1', 'Acme', ${bool(false)}, 1);
  INSERT INTO usage_records (request_id, org_id, key_id, created_at_ms, source, model, mode, outcome, http_status, input_tokens,
    output_tokens, cost_microusd, latency_ms, gateway_latency_ms, error_detail, over_reservation, completed_at_ms, deployment, attempts,
    instance_id, reserved_microusd, reservation_expires_at_ms, reservation_status) VALUES
    ('req_api', 'org_1', 'k1', ${T0}, 'api', 'jev-1', 'paid', 'succeeded', 200, 120, 7, 40, 12.5, 14.25, NULL, ${bool(true)}, ${T0 + 5},
      'svc-a', 2, 'inst_1', 100, ${T0 + HOUR}, 'settled'),
    ('req_play', 'org_1', 'k1', ${T0 + 1}, 'playground', 'jev-1', 'preview', 'model_error', 502, 0, 0, 0, NULL, 3.5, 'model timed out',
      ${bool(false)}, ${T0 + 9}, 'svc-b', 1, NULL, NULL, NULL, NULL),
    ('req_run', 'org_1', 'k2', ${T0 + 2}, 'api', 'jev-1', 'paid', 'in_flight', NULL, 0, 0, 0, NULL, 0, NULL, ${bool(false)}, NULL,
      NULL, 0, 'inst_1', 300, ${T0 + HOUR}, 'pending');
  `;
}

/** A finished preview record of org_1 with the given source, for raw inserts that the schema accepts or refuses. */
export function usageRowWithSource(requestId: string, source: string, bool: (b: boolean) => string): string {
  return `INSERT INTO usage_records (request_id, org_id, key_id, created_at_ms, source, model, mode, outcome, http_status, input_tokens,
    output_tokens, cost_microusd, latency_ms, gateway_latency_ms, error_detail, over_reservation, completed_at_ms, deployment, attempts)
    VALUES ('${requestId}', 'org_1', 'k1', ${T0 + 3}, '${source}', 'jev-1', 'preview', 'succeeded', 200, 1, 1, 0, 1, 1, NULL, ${bool(false)},
      ${T0 + 4}, 'svc-a', 1)`;
}

/** Every record's [request id, source] after 012, newest first: the rows written at 011 and one with source "batch". */
export const SOURCES_AFTER_012 = [
  ["req_batch", "batch"],
  ["req_run", "api"],
  ["req_play", "playground"],
  ["req_api", "api"],
];
