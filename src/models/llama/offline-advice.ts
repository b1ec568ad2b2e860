import type { EngineSettings } from "./engine-settings.ts";
import { DEFAULT_MODEL_APPROX_MB, DEFAULT_MODEL_SOURCE, modelSourceKind } from "./model-source.ts";
import type { NetworkProblem } from "./network-probe.ts";

/** Where the fake model server listens in the advice (the README's quick start uses the same port). */
const FAKE_MODEL_PORT = 9090;

/**
 * What the operator reads, once, when a model's download server cannot be reached at all: what was tried, that it
 * cannot succeed without network access, and the three ways to go on. Lines after the first are indented, so that a
 * terminal shows them as one block under the warning.
 */
export function offlineAdvice(settings: EngineSettings, network: NetworkProblem): string {
  const what =
    settings.source.trim() === DEFAULT_MODEL_SOURCE
      ? `${settings.shownSource} (the built-in default model, about ${DEFAULT_MODEL_APPROX_MB} MB)`
      : settings.shownSource;
  const fakeUrl = `http://127.0.0.1:${FAKE_MODEL_PORT}`;
  const file = settings.sourceSetting === "TDS_MODEL_PATH" ? "TDS_MODEL_PATH=/path/to/model.gguf" : settings.sourceSetting;
  const ways: Array<[string, string]> = [
    [`TDS_MODEL_SERVICE_URL=${fakeUrl}`, "a System One model server there (Ollama, llama.cpp server, vLLM, …, or the fake one below)"],
    [file, "the in-process engine with a GGUF file on this machine"],
    [`npm run fake-model -- --port ${FAKE_MODEL_PORT}`, "starts a fake model server there, for a first try (in a source checkout)"],
  ];
  const width = Math.max(...ways.map(([way]) => way.length));
  const server = modelSourceKind(settings.source) === "hub" ? "The model hub" : "The download server";
  return [
    `  ${server} at ${network.address} cannot be reached: ${network.words}. The download of ${what} cannot succeed ` +
      "while this machine is offline. The server keeps running and retries in the background (quietly, until the reason " +
      `changes); requests for "${settings.name}" get 503 until the model loads.`,
    "  To go on without the download, restart with one of:",
    ...ways.map(([way, does]) => `    ${way.padEnd(width)}  ${does}`),
  ].join("\n");
}
