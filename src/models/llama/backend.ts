import { getLlama, LlamaLogLevel, type Llama } from "node-llama-cpp";

/**
 * The llama.cpp backend, loaded lazily and once per process: the prebuilt CPU binary of
 * `@node-llama-cpp/linux-x64` (or the platform's), never a GPU build, never a download or a build from
 * source (`build: "never"`): if the prebuilt binary cannot load, this fails at once instead of trying
 * to fetch and compile llama.cpp, which cannot work offline.
 *
 * llama.cpp's own log lines (warnings and errors) go to the listeners registered with
 * `onBackendLog` (the services' loggers); the last few are kept so a failed model load can say why.
 */
export type BackendLogListener = (level: "warn" | "error", message: string) => void;

const listeners = new Set<BackendLogListener>();
const recent: string[] = [];
const RECENT_LINES = 20;
let backend: Promise<Llama> | null = null;

export function getBackend(): Promise<Llama> {
  backend ??= getLlama({
    gpu: false,
    build: "never",
    progressLogs: false,
    logLevel: LlamaLogLevel.warn,
    logger: onLog,
  });
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
