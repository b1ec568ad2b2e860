import { type ConfiguredModel, type EmbeddedModelSettings, engineKey } from "../config-models.ts";
import type { ModelService } from "./model-service.ts";

/** Which in-process engine: the model it serves and its place among that model's deployments. */
export interface EngineId {
  readonly model: string;
  readonly index: number;
  /** Its key in the map of engines (`engineKey(model, index)`): built from the two, never read back. */
  readonly label: string;
}

export function engineId(model: string, index: number): EngineId {
  return { model, index, label: engineKey(model, index) };
}

/** An in-process deployment the configuration names: its engine's identity, its model and its settings. */
export interface EngineDeployment {
  id: EngineId;
  model: ConfiguredModel;
  settings: EmbeddedModelSettings;
}

/** Every in-process deployment of the configured models, in the configuration's order. */
export function engineDeployments(models: readonly ConfiguredModel[]): EngineDeployment[] {
  return models.flatMap((model) =>
    model.deployments.flatMap((d, index) => (d.llama ? [{ id: engineId(model.name, index), model, settings: d.llama }] : [])),
  );
}

/** The engines opened for the configured models (a map by label, as openEngines makes it), each with its identity. */
export function engineEntries(
  models: readonly ConfiguredModel[],
  engines: ReadonlyMap<string, ModelService>,
): Array<{ id: EngineId; service: ModelService }> {
  return engineDeployments(models).flatMap(({ id }) => {
    const service = engines.get(id.label);
    return service ? [{ id, service }] : [];
  });
}
