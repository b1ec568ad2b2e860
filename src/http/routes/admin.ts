import type { FastifyInstance, FastifyRequest } from "fastify";
import { type KeyRules, registryModelCheck } from "../../admin/key-settings.ts";
import { StoreAdministration } from "../../admin/store-administration.ts";
import type { Config } from "../../config.ts";
import { listingServices } from "../../config-models.ts";
import type { Clock } from "../../domain/clock.ts";
import type { Store } from "../../store/store.ts";
import { authenticateAdmin } from "../admin-auth.ts";
import type { AdminContext } from "./admin/admin-context.ts";
import { adminAuditRoutes } from "./admin/audit.ts";
import { adminCreditRoutes } from "./admin/credits.ts";
import { adminKeyRoutes } from "./admin/keys.ts";
import { adminOrganizationRoutes } from "./admin/organizations.ts";
import { adminUsageRoutes } from "./admin/usage.ts";

const ADMIN_BODY_LIMIT = 16 * 1024;

export interface AdminRouteDeps {
  config: Pick<Config, "adminToken" | "limits" | "models" | "modelServices">;
  store: Store;
  clock: Clock;
}

/**
 * The admin API under /admin/v1, for `Authorization: Bearer <admin token>` only; registered only when an admin token
 * is configured (otherwise every path here is an unknown route: 404). Every change is recorded in the audit log with
 * the caller's address and `x-tds-client`. One module per resource (./admin/), in this order in the API document.
 */
export function adminRoutes(app: FastifyInstance, deps: AdminRouteDeps): void {
  const token = deps.config.adminToken;
  if (token === null) return;
  const nowMs = () => deps.clock.nowMs();
  // Models named in the configuration are known without asking a model service; models a service lists are not.
  const keyRules: KeyRules = {
    requestsPerMinute: deps.config.limits.requestsPerMinute,
    checkModel: listingServices(deps.config).length === 0 ? registryModelCheck((name) => app.modelRegistry.resolve(name)) : null,
  };
  const context: AdminContext = {
    route: { onRequest: authenticateAdmin(token), bodyLimit: ADMIN_BODY_LIMIT },
    admin: (request: FastifyRequest) => {
      const client = request.headers["x-tds-client"];
      return new StoreAdministration({
        store: deps.store,
        previewRequestLimit: deps.config.limits.previewRequestLimit,
        nowMs,
        actor: { source: "http", client: typeof client === "string" && client !== "" ? client : null, remoteAddress: request.ip ?? null },
        keyRules,
      });
    },
    store: deps.store,
    nowMs,
  };
  adminOrganizationRoutes(app, context);
  adminKeyRoutes(app, context);
  adminCreditRoutes(app, context);
  adminUsageRoutes(app, context);
  adminAuditRoutes(app, context);
}
