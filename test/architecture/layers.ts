import type { Layer } from "../support/import-graph.ts";

/** Lowest first. */
export const LAYERS: Layer[] = [
  { name: "domain: plain values and rules (money, clock, UTC day, ids, error codes, version)", paths: ["src/domain", "src/version.ts"] },
  { name: "contract: the API's schemas", paths: ["src/contract"] },
  {
    name: "configuration",
    paths: [
      "src/config.ts",
      "src/config-models.ts",
      "src/config-defaults.ts",
      "src/config-secret-files.ts",
      "src/database-url.ts",
      "src/private-files.ts",
      "src/settings",
    ],
  },
  { name: "ports and adapters: storage, rate limits, model services", paths: ["src/store", "src/limits", "src/models"] },
  { name: "gateway: the decision pipeline, admission, model registry, batches", paths: ["src/gateway", "src/batches"] },
  { name: "administration and presentation", paths: ["src/admin", "src/presentation"] },
  { name: "interfaces: HTTP, CLI, observability", paths: ["src/http", "src/cli", "src/observability"] },
  { name: "composition: wiring and start-up", paths: ["src/app.ts", "src/server.ts", "src/bootstrap.ts", "src/startup"] },
];

export const SIBLING_ADAPTERS = [
  ["src/store/sqlite/", "src/store/postgres/"],
  ["src/models/llama/", "src/models/systemone-http/"],
  ["src/limits/memory-", "src/limits/redis-"],
];
