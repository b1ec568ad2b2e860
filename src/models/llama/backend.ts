import { getLlama, type Llama, LlamaLogLevel } from "node-llama-cpp";

/**
 * The llama.cpp backend, loaded lazily and once per process and GPU setting, never downloaded or built from
 * source (`build: "never"`): if no prebuilt binary loads, this fails at once instead of trying to fetch and
 * compile llama.cpp, which cannot work offline.
 * - `false`: the platform's prebuilt CPU binary (`@node-llama-cpp/linux-x64`, `linux-arm64`, `mac-x64`, …).
 * - `"auto"`: the best GPU binary installed and usable here (CUDA, Vulkan, Metal), else the CPU one. On
 *   Apple Silicon the only prebuilt binary is the Metal one, so the engine runs there only with "auto".
 *
 * llama.cpp's own log lines (warnings and errors) go to the listeners registered with
 * `onBackendLog` (the services' loggers); the last few are kept so a failed model load can say why.
 */
export type GpuSetting = "auto" | false;

export type BackendLogListener = (level: "warn" | "error", message: string) => void;

const listeners = new Set<BackendLogListener>();
const recent: string[] = [];
const RECENT_LINES = 20;
const backends = new Map<GpuSetting, Promise<Llama>>();

export function getBackend(gpu: GpuSetting = false): Promise<Llama> {
  let backend = backends.get(gpu);
  if (!backend) {
    backend = getLlama({ gpu, build: "never", progressLogs: false, logLevel: LlamaLogLevel.warn, logger: onLog });
    backends.set(gpu, backend);
  }
  return backend;
}

/** Registers a listener for llama.cpp's warnings and errors; returns the function that removes it. */
export function onBackendLog(listener: BackendLogListener): () => void {
  listeners.add(listener);
  return () => listeners.delete(listener);
}

/** llama.cpp's error lines logged since `mark` (a value of `backendLogMark()`), oldest first. */
export function backendErrorsSince(mark: number): string[] {
  return recent.slice(Math.max(0, recent.length - (logCount - mark)));
}

/** The count of llama.cpp error lines seen so far, for `backendErrorsSince`. */
export function backendLogMark(): number {
  return logCount;
}

let logCount = 0;

function onLog(level: LlamaLogLevel, message: string): void {
  const text = message.trim();
  if (text === "") return;
  const severe = level === LlamaLogLevel.error || level === LlamaLogLevel.fatal;
  if (!severe && level !== LlamaLogLevel.warn) return;
  if (severe) {
    recent.push(text);
    if (recent.length > RECENT_LINES) recent.shift();
    logCount++;
  }
  for (const l of listeners) l(severe ? "error" : "warn", text);
}
