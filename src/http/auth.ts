import type { FastifyRequest } from "fastify";
import { apiKeyMatches, keyIdOf } from "../domain/api-keys.ts";
import { type Clock, systemClock } from "../domain/clock.ts";
import { ServiceError } from "../domain/errors.ts";
import type { ApiKeyRecord, Organization } from "../domain/organizations.ts";
import { keyRefusal } from "../gateway/key-controls.ts";
import type { Store } from "../store/store.ts";

export interface AuthContext {
  org: Organization;
  keyId: string;
  /** The key as read for this request: its own limits (models, per-minute limit, budget) apply to the request. */
  key: ApiKeyRecord;
}

declare module "fastify" {
  interface FastifyRequest {
    auth: AuthContext | null;
  }
  interface FastifyInstance {
    /** The app's clock, that keys' expiry and rotation grace are checked against (absent: the system clock). */
    clock?: Clock;
  }
}

/** `Authorization: Bearer <key>`: the key is the first group. */
export const BEARER = /^Bearer[ \t]+(\S+)[ \t]*$/i;

/**
 * onRequest hook: Bearer key → organization, before the body is read. The key id embedded in the
 * key finds the record; the hash is compared in constant time. Unknown ids and wrong secrets get
 * the same answer; a revoked, expired or retired (rotated, grace ended) key is refused with its own answer.
 */
export function authenticate(store: Store, options: { rejectPaused: boolean }) {
  return async function authHook(request: FastifyRequest): Promise<void> {
    const header = request.headers.authorization;
    if (!header) throw new ServiceError("missing_api_key");
    const raw = BEARER.exec(header)?.[1];
    if (!raw) throw new ServiceError("missing_api_key", "Authorization header must be of the form: Bearer <API_KEY>.");
    const keyId = keyIdOf(raw);
    const found = keyId ? await store.findApiKeyForRequest(keyId) : null;
    if (!found || !apiKeyMatches(raw, found.key.hash)) throw new ServiceError("invalid_api_key");
    const refusal = keyRefusal(found.key, (request.server.clock ?? systemClock).nowMs());
    if (refusal) throw refusal;
    if (options.rejectPaused && found.org.paused) throw new ServiceError("org_paused");
    request.auth = { org: found.org, keyId: found.key.id, key: found.key };
  };
}

/** The authenticated context of a route that ran the auth hook. */
export function authOf(request: FastifyRequest): AuthContext {
  if (!request.auth) throw new Error("route is missing the auth hook");
  return request.auth;
}
