import { type Static, Type } from "@sinclair/typebox";

export const ModelContext = Type.Object(
  {
    max_state: Type.Optional(Type.Integer({ minimum: 1, description: "State limit of the model, in tokens" })),
    max_branch: Type.Optional(Type.Integer({ minimum: 1, description: "Limit of the state plus the longest question, in tokens" })),
    strict: Type.Optional(Type.Boolean()),
  },
  { additionalProperties: false, title: "ModelContext" },
);

export const ModelEntry = Type.Object(
  { name: Type.String(), context: Type.Optional(ModelContext) },
  { additionalProperties: false, title: "Model" },
);

export const ModelsResponse = Type.Object({ models: Type.Array(ModelEntry) }, { additionalProperties: false, title: "ModelsResponse" });

export type ModelContext = Static<typeof ModelContext>;
export type ModelEntry = Static<typeof ModelEntry>;
export type ModelsResponse = Static<typeof ModelsResponse>;
