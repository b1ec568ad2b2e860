import { ServiceError } from "../domain/errors.ts";
import type { ApiKeyRecord, KeySettings } from "../domain/organizations.ts";

/**
 * Why a key that exists cannot be used at `nowMs`: revoked, expired (from expiresAtMs on) or retired (rotated, from
 * the end of its grace on); null when it can. The API and the batch runner refuse with the same errors.
 */
export function keyRefusal(
  key: Pick<ApiKeyRecord, "revokedAtMs" | "expiresAtMs" | "retiresAtMs" | "replacedBy">,
  nowMs: number,
): ServiceError | null {
  if (key.revokedAtMs !== null) return new ServiceError("revoked_api_key");
  if (key.expiresAtMs !== null && key.expiresAtMs <= nowMs) {
    return new ServiceError("expired_api_key", `This API key expired at ${new Date(key.expiresAtMs).toISOString()}.`);
  }
  if (key.retiresAtMs !== null && key.retiresAtMs <= nowMs) {
    const by = key.replacedBy === null ? "" : ` (${key.replacedBy})`;
    return new ServiceError(
      "retired_api_key",
      `This API key was rotated and its grace period ended at ${new Date(key.retiresAtMs).toISOString()}; use the key that replaced it${by}.`,
    );
  }
  return null;
}

/**
 * 403 model_not_allowed unless the key may use the model: its list names the model the request resolved to, or the
 * name the request gave (an alias the operator allowed as such). A key without a list may use every model.
 */
export function checkModelAllowed(models: KeySettings["models"], resolved: string, requested?: string | null): void {
  if (models === null || models.includes(resolved) || (requested != null && models.includes(requested))) return;
  const named =
    requested != null && requested !== resolved ? `${JSON.stringify(requested)} (${JSON.stringify(resolved)})` : JSON.stringify(resolved);
  throw new ServiceError(
    "model_not_allowed",
    `This API key may not use the model ${named}; ${models.length === 0 ? "it may use none" : `it may use: ${models.map((m) => JSON.stringify(m)).join(", ")}`}.`,
  );
}
