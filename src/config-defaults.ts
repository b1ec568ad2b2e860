/** Defaults of settings that the configuration fills in and the components they configure fall back to. */

/**
 * The embedded engine's default model: Qwen2.5-0.5B-Instruct, Q8_0 (about 531 MB on disk, about
 * 600 MB of memory with a 4096-token context; about 1.5–1.65 s for a ~200-token request and
 * 0.22–0.28 s per extra question on 2 CPU cores). Downloaded once into the cache folder.
 */
export const DEFAULT_EMBEDDED_MODEL = {
  name: "qwen2.5-0.5b-instruct",
  source: "hf:bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q8_0",
} as const;

/** The model routers' own defaults; the settings table takes those of routing.* in the config file from here. */
export const ROUTER_DEFAULTS = {
  maxAttempts: 3,
  failureThreshold: 3,
  cooldownInitialMs: 1_000,
  cooldownMaxMs: 30_000,
  healthCheckIntervalMs: 10_000,
  checkTimeoutMs: 2_000,
  listCacheMs: 5_000,
} as const;
