import { checkEpochMs, checkText } from "../input-checks.ts";

/** The lease of one gateway instance (a serving process), as store.renewLease takes it. */
export interface LeaseInput {
  instanceId: string;
  startedAtMs: number;
  leaseUntilMs: number;
  nowMs: number;
}

/** Leases that ended this long ago, with no request in flight, are deleted when a lease is renewed. */
export const ENDED_LEASES_KEPT_MS = 86_400_000;

/** The checks of a lease renewal, the same for every adapter. */
export function checkLease(input: LeaseInput): void {
  checkText(input.instanceId, "instanceId");
  checkEpochMs(input.startedAtMs, "startedAtMs");
  checkEpochMs(input.leaseUntilMs, "leaseUntilMs");
  checkEpochMs(input.nowMs, "nowMs");
}
