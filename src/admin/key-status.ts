import type { ApiKeyRecord } from "../domain/organizations.ts";

/**
 * A key's status at `nowMs`, as the CLI lists it and the organization's key counts count it (the console's keyState
 * says the same): revoked; retired (rotated, its grace ended); expired; rotated (working until its grace ends); active.
 */
export type KeyStatus = "active" | "rotated" | "retired" | "expired" | "revoked";

export function keyStatus(key: Pick<ApiKeyRecord, "revokedAtMs" | "retiresAtMs" | "expiresAtMs" | "replacedBy">, nowMs: number): KeyStatus {
  if (key.revokedAtMs !== null) return "revoked";
  if (key.retiresAtMs !== null && key.retiresAtMs <= nowMs) return "retired";
  if (key.expiresAtMs !== null && key.expiresAtMs <= nowMs) return "expired";
  if (key.replacedBy !== null) return "rotated";
  return "active";
}

/** Requests with the key are accepted now: an active key, or a rotated one within its grace. */
export const keyWorks = (status: KeyStatus): boolean => status === "active" || status === "rotated";
