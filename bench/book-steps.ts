import { randomBytes, randomUUID } from "node:crypto";
import { randomId } from "../src/domain/api-keys.ts";
import type { AdmitCommand, CompleteCommand } from "../src/domain/bookkeeping.ts";
import { utcDay } from "../src/domain/utc-day.ts";
import type { Store } from "../src/store/store.ts";

/**
 * The two durable steps of one realistic request, as the gateway submits them to its books: for the benchmarks
 * that drive the store (or its group commit) without HTTP.
 */

/** What the gateway reserves for the realistic request (32768 tokens × 0.5 USD per million) and what it charges (690 tokens). */
export const RESERVATION_MICROUSD = 16_384;
export const COST_MICROUSD = 345;

/** A request id drawn at random, as the gateway's were before they began with their time (bench/request-id-order.ts). */
export const randomRequestId = (): string => `req_${randomId(24)}`;

/** An admission in `mode`, with an Idempotency-Key of its own when `withKey`; `newId`: how its request id is made. */
export function benchAdmission(
  mode: "preview" | "paid",
  orgId: string,
  keyId: string,
  nowMs: number,
  withKey = false,
  newId: () => string = randomRequestId,
): AdmitCommand {
  const requestId = newId();
  return {
    requestId,
    orgId,
    keyId,
    source: "api",
    model: "bench-precomputed",
    mode,
    nowMs,
    idempotency: withKey
      ? { key: `idem_${requestId}`, requestHash: "h".repeat(64), lockUntilMs: nowMs + 60_000, expiresAtMs: nowMs + 86_400_000 }
      : null,
    quota: mode === "preview" ? { day: utcDay(nowMs), orgLimit: 1_000_000_000, globalLimit: 1_000_000_000 } : null,
    reservation: mode === "paid" ? { amountMicrousd: RESERVATION_MICROUSD, expiresAtMs: nowMs + 120_000 } : null,
  };
}

/** Its successful completion (the response kept for replays when it has an Idempotency-Key). */
export function benchCompletion(a: AdmitCommand, nowMs: number): CompleteCommand {
  const paid = a.mode === "paid";
  return {
    requestId: a.requestId,
    orgId: a.orgId,
    nowMs,
    outcome: "succeeded",
    httpStatus: 200,
    inputTokens: 681,
    outputTokens: 9,
    costMicrousd: paid ? COST_MICROUSD : 0,
    latencyMs: 1.5,
    gatewayLatencyMs: 0.8,
    errorDetail: null,
    overReservation: false,
    deployment: "bench",
    attempts: 1,
    reserved: paid,
    idempotency: a.idempotency && { key: a.idempotency.key, response: { status: 200, body: '{"answers":{}}', requestId: a.requestId } },
  };
}

/** An organization with a key, granted `creditsMicrousd` when above 0 (for paid mode). */
export async function provisionBenchOrg(store: Store, creditsMicrousd = 0): Promise<{ orgId: string; keyId: string }> {
  const nowMs = Date.now();
  const org = await store.createOrganization({ id: `org_${randomUUID().replace(/-/g, "")}`, name: `bench-${randomUUID()}`, nowMs });
  const keyId = `key_${randomUUID().replace(/-/g, "")}`;
  await store.createApiKey({ id: keyId, orgId: org.id, name: "bench", hash: randomBytes(32).toString("hex"), nowMs });
  if (creditsMicrousd > 0) await store.grantCredits({ orgId: org.id, amountMicrousd: creditsMicrousd, nowMs });
  return { orgId: org.id, keyId };
}

/** A PostgreSQL WAL position as pg_lsn text ("16/B374D848"), in bytes. */
export function lsnBytes(lsn: string): bigint {
  const [hi, lo] = lsn.split("/");
  return (BigInt(`0x${hi}`) << 32n) + BigInt(`0x${lo}`);
}
