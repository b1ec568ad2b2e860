import { type Static, type TSchema, Type } from "@sinclair/typebox";
import type { ServiceMode as DomainServiceMode } from "../domain/usage-records.ts";

/** Fixed by the v1 request contract (the configurable max_questions may only lower the count). */
export const CONTRACT_LIMITS = {
  maxQuestions: 32,
  questionIdMaxLength: 100,
  modelNameMaxLength: 100,
  maxChoiceOptions: 255,
  maxScoreLevels: 255,
} as const;

const AnyJson = Type.Unknown({ description: "Any JSON value" });

/** A JSON object whose keys are free-form names (question ids, option names). */
function NamedMap<T extends TSchema>(value: T, options: Record<string, unknown>) {
  return Type.Unsafe<Record<string, Static<T>>>({ type: "object", additionalProperties: value, ...options });
}

/** `oneOf` selected by the `type` tag, so validation reports errors of the chosen variant only. */
function TaggedUnion<T extends TSchema[]>(variants: [...T], description: string) {
  return Type.Unsafe<Static<T[number]>>({
    // Ajv's discriminator checks only objects: without this, an array would pass unchecked.
    type: "object",
    oneOf: variants,
    discriminator: { propertyName: "type" },
    description,
  });
}

export const ChoiceQuestion = Type.Object(
  {
    type: Type.Literal("choice"),
    instructions: Type.Optional(AnyJson),
    criteria: NamedMap(AnyJson, {
      minProperties: 1,
      maxProperties: CONTRACT_LIMITS.maxChoiceOptions,
      description: "Option name to description, 1 to 255 options",
    }),
  },
  { additionalProperties: false, title: "ChoiceQuestion" },
);

export const ScoreQuestion = Type.Object(
  {
    type: Type.Literal("score"),
    instructions: Type.Optional(AnyJson),
    criteria: Type.Array(AnyJson, {
      minItems: 1,
      maxItems: CONTRACT_LIMITS.maxScoreLevels,
      description: "One description per level, level 0 first; 1 to 255 levels",
    }),
  },
  { additionalProperties: false, title: "ScoreQuestion" },
);

export const NoulCriteria = Type.Object({ true: Type.Optional(AnyJson), false: Type.Optional(AnyJson) }, { additionalProperties: false });

export const NoulQuestion = Type.Object(
  {
    type: Type.Literal("noul"),
    instructions: Type.Optional(AnyJson),
    criteria: Type.Optional(Type.Union([Type.Null(), NoulCriteria])),
  },
  { additionalProperties: false, title: "NoulQuestion" },
);

export const Question = TaggedUnion([ChoiceQuestion, ScoreQuestion, NoulQuestion], "A typed question; `type` selects the variant");

export const DecisionRequest = Type.Object(
  {
    state: AnyJson,
    questions: NamedMap(Question, {
      minProperties: 1,
      maxProperties: CONTRACT_LIMITS.maxQuestions,
      propertyNames: { minLength: 1, maxLength: CONTRACT_LIMITS.questionIdMaxLength },
      description: "Question id (1 to 100 characters) to question; 1 to 32 entries",
    }),
    model: Type.Optional(
      Type.Union([Type.String({ maxLength: CONTRACT_LIMITS.modelNameMaxLength }), Type.Null()], {
        description: "A name from GET /v1/models; null or omitted selects the configured model",
      }),
    ),
  },
  { additionalProperties: false, title: "DecisionRequest" },
);

const Probability = Type.Number({ minimum: 0, maximum: 1 });

export const ChoiceAnswer = Type.Object(
  {
    type: Type.Literal("choice"),
    choice: Type.String(),
    probabilities: NamedMap(Probability, { description: "One entry per supplied option" }),
    confidence: Probability,
  },
  { additionalProperties: false, title: "ChoiceAnswer" },
);

export const ScoreAnswer = Type.Object(
  {
    type: Type.Literal("score"),
    score: Type.Number({ minimum: 0, description: "Expected zero-based level" }),
    probabilities: NamedMap(Probability, { description: 'One entry per level, keyed "0" … "n-1"' }),
    confidence: Probability,
    legend: NamedMap(AnyJson, { description: "Level key to the level description supplied in criteria" }),
  },
  { additionalProperties: false, title: "ScoreAnswer" },
);

export const NoulAnswer = Type.Object(
  { type: Type.Literal("noul"), noul: Probability },
  { additionalProperties: false, title: "NoulAnswer" },
);

export const Answer = TaggedUnion([ChoiceAnswer, ScoreAnswer, NoulAnswer], "An answer; `type` matches the question");

export const ServiceMode = Type.Union([Type.Literal("preview"), Type.Literal("paid")]);

export const Usage = Type.Object(
  {
    input_tokens: Type.Integer({ minimum: 1 }),
    output_tokens: Type.Integer({ minimum: 0 }),
    cost_microusd: Type.Integer({ minimum: 0, description: "1 USD = 1,000,000 microUSD" }),
    cost_usd: Type.String({ description: "Exact decimal USD string of cost_microusd" }),
    price_per_million_input_usd: Type.Union([Type.String(), Type.Null()], {
      description: "Effective input price for this request; null in preview",
    }),
  },
  { additionalProperties: false, title: "Usage" },
);

export const DecisionResponse = Type.Object(
  {
    model: Type.String(),
    request_id: Type.String(),
    service_mode: ServiceMode,
    answers: NamedMap(Answer, { minProperties: 1 }),
    usage: Usage,
    latency_ms: Type.Optional(Type.Number({ minimum: 0, description: "Model timing" })),
    gateway_latency_ms: Type.Number({ minimum: 0, description: "Time spent in the gateway itself" }),
  },
  { additionalProperties: false, title: "DecisionResponse" },
);

export type ChoiceQuestion = Static<typeof ChoiceQuestion>;
export type ScoreQuestion = Static<typeof ScoreQuestion>;
export type NoulQuestion = Static<typeof NoulQuestion>;
export type Question = ChoiceQuestion | ScoreQuestion | NoulQuestion;
export type DecisionRequest = Static<typeof DecisionRequest>;
export type ChoiceAnswer = Static<typeof ChoiceAnswer>;
export type ScoreAnswer = Static<typeof ScoreAnswer>;
export type NoulAnswer = Static<typeof NoulAnswer>;
export type Answer = ChoiceAnswer | ScoreAnswer | NoulAnswer;
export type ServiceMode = Static<typeof ServiceMode>;
/** The schema's modes are the domain's, checked by the compiler. */
export const SERVICE_MODES_MATCH_DOMAIN: [ServiceMode] extends [DomainServiceMode]
  ? [DomainServiceMode] extends [ServiceMode]
    ? true
    : never
  : never = true;
export type Usage = Static<typeof Usage>;
export type DecisionResponse = Static<typeof DecisionResponse>;
