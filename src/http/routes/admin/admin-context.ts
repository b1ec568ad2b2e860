import { Type } from "@sinclair/typebox";
import type { FastifyRequest, onRequestHookHandler } from "fastify";
import type { StoreAdministration } from "../../../admin/store-administration.ts";
import type { Store } from "../../../store/store.ts";
import { errorResponses } from "../../error-responses.ts";

/** What every admin route shares: the admin token check, the body limit and the operations of the caller. */
export interface AdminContext {
  /** The route options of every admin route: the admin authentication and the body limit. */
  route: { onRequest: onRequestHookHandler; bodyLimit: number };
  /** The operations, acting as the caller (address and `x-tds-client` go to the audit log). */
  admin(request: FastifyRequest): StoreAdministration;
  store: Store;
  nowMs(): number;
}

export const security = [{ admin: [] }];

/** The answers every admin route may give besides its own. */
export const errors = errorResponses(
  "missing_admin_token",
  "invalid_admin_token",
  "admin_auth_throttled",
  "not_found",
  "invalid_body",
  "invalid_query",
);

/** The headers of a change: the client is recorded in the audit log. */
export const AdminHeaders = Type.Object({
  "x-tds-client": Type.Optional(
    Type.String({ maxLength: 50, description: "Recorded in the audit log as the client, such as console or cli" }),
  ),
});
