import { type EngineStatus, type ModelService, ModelServiceError } from "../model-service.ts";

/** The version package.json pins (optionalDependencies). */
export const ENGINE_PACKAGE = "node-llama-cpp@3.21.1";

export const ENGINE_NOT_INSTALLED =
  "The embedded engine is not installed (node-llama-cpp is an optional dependency omitted by this install): " +
  `run \`npm install ${ENGINE_PACKAGE}\` in the gateway's folder, or point TDS_MODEL_SERVICE_URL at a System One server.`;

/** Whether `err` is the import failure of node-llama-cpp itself (not of another missing module, nor one of its dependencies). */
export function isEnginePackageMissing(err: unknown): boolean {
  if (!(err instanceof Error) || (err as NodeJS.ErrnoException).code !== "ERR_MODULE_NOT_FOUND") return false;
  return err.message.startsWith("Cannot find package 'node-llama-cpp' ");
}

/** The engine of a model when node-llama-cpp is not installed: every call is "not_ready" (503) with {@link ENGINE_NOT_INSTALLED}. */
export function absentEngine(): ModelService & { status(): EngineStatus } {
  const fail = async (): Promise<never> => {
    throw new ModelServiceError("not_ready", ENGINE_NOT_INSTALLED, undefined, { note: ENGINE_NOT_INSTALLED });
  };
  return {
    status: () => ({ state: "not_installed", detail: ENGINE_NOT_INSTALLED }),
    listModels: fail,
    decide: fail,
    close: async () => {},
  };
}
