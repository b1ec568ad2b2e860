// The Playground's editable request: state, questions (choice, score, noul) and model, and how it
// becomes a DecisionRequest body (key order kept exactly as edited).

import { Obj, parseOrdered } from "./json.js";

export const TYPE_LABELS = { choice: "Choice", score: "Score", noul: "Noul" };

let next = 0;
const newUid = (prefix) => `${prefix}${++next}`;

export function option(name = "", description = "") {
  return { uid: newUid("o"), name, description };
}

export function level(description = "") {
  return { uid: newUid("l"), description };
}

export function question(type, id, fields = {}) {
  return {
    uid: newUid("q"),
    id,
    type,
    instructions: fields.instructions ?? "",
    options: (fields.options ?? []).map(([name, description]) => option(name, description)),
    levels: (fields.levels ?? []).map((d) => level(d)),
    noulTrue: fields.noulTrue ?? "",
    noulFalse: fields.noulFalse ?? "",
  };
}

/** What "Add … question" inserts. */
export const TEMPLATES = {
  choice: {
    instructions: "Which option fits best?",
    options: [
      ["yes", "It fits"],
      ["no", "It does not fit"],
      ["unsure", ""],
    ],
  },
  score: { instructions: "How strongly does it apply?", levels: ["not at all", "a little", "clearly", "strongly"] },
  noul: { instructions: "Is the statement true?" },
};

/** A first id of the form choice_1 that no question has. */
export function freshId(type, questions) {
  const taken = new Set(questions.map((q) => q.id));
  for (let n = 1; ; n++) if (!taken.has(`${type}_${n}`)) return `${type}_${n}`;
}

/** The example the Playground opens with. */
export function sampleDraft() {
  return {
    stateMode: "text",
    stateText: "I was charged twice for my subscription this month. Please refund the second payment.",
    model: "",
    questions: [
      question("choice", "topic", {
        instructions: "What is the ticket about?",
        options: [
          ["billing", "Payments and invoices"],
          ["bug", "Something is broken"],
          ["other", ""],
        ],
      }),
      question("score", "urgency", { instructions: "How urgent is it?", levels: ["not urgent", "soon", "today", "right now"] }),
      question("noul", "refund", { instructions: "Does the customer ask for a refund?" }),
    ],
  };
}

const orNull = (text) => (text.trim() === "" ? null : text);

/** One question as the contract's JSON (ordered). */
function questionJson(q) {
  const entries = [["type", q.type]];
  if (q.instructions.trim() !== "") entries.push(["instructions", q.instructions]);
  if (q.type === "choice") entries.push(["criteria", new Obj(q.options.map((o) => [o.name, orNull(o.description)]))]);
  if (q.type === "score") entries.push(["criteria", q.levels.map((l) => orNull(l.description))]);
  if (q.type === "noul") {
    const c = [];
    if (q.noulTrue.trim() !== "") c.push(["true", q.noulTrue]);
    if (q.noulFalse.trim() !== "") c.push(["false", q.noulFalse]);
    if (c.length > 0) entries.push(["criteria", new Obj(c)]);
  }
  return new Obj(entries);
}

/**
 * The request body, or the problems that keep it from being built: state that is not valid JSON
 * (JSON mode), two questions with the same id, two options with the same name (a JSON object
 * cannot hold them). Everything else is left to the server's validation, whose field errors are
 * shown next to the fields. Problems are {where: {part, uid?}, message}.
 */
export function buildRequest(draft) {
  const problems = [];
  let state = draft.stateText;
  if (draft.stateMode === "json") {
    try {
      state = parseOrdered(draft.stateText);
    } catch (err) {
      problems.push({ where: { part: "state" }, message: `is not valid JSON: ${err.message}` });
    }
  }
  const counts = new Map();
  for (const q of draft.questions) counts.set(q.id, (counts.get(q.id) ?? 0) + 1);
  for (const q of draft.questions) {
    if (counts.get(q.id) > 1)
      problems.push({
        where: { part: "id", uid: q.uid },
        message: `another question has the id ${JSON.stringify(q.id)}; ids must be unique`,
      });
    if (q.type === "choice") {
      const names = q.options.map((o) => o.name);
      const dup = names.find((n, i) => names.indexOf(n) !== i);
      if (dup !== undefined)
        problems.push({
          where: { part: "criteria", uid: q.uid },
          message: `two options are named ${JSON.stringify(dup)}; option names must be unique`,
        });
    }
  }
  const entries = [];
  if (draft.model) entries.push(["model", draft.model]);
  entries.push(["state", state]);
  entries.push(["questions", new Obj(draft.questions.map((q) => [q.id, questionJson(q)]))]);
  return { body: new Obj(entries), problems };
}

/**
 * Where a server error's `field` belongs: {part: "state" | "model" | "questions" | "general"} or
 * {part: "id" | "instructions" | "criteria" | "question", uid, sub} for a question. The path holds
 * the question id as sent, which may itself contain dots, so the longest matching id wins.
 */
export function locateField(field, questions) {
  if (field === "state" || field.startsWith("state.")) return { part: "state" };
  if (field === "model") return { part: "model" };
  if (field === "questions") return { part: "questions" };
  if (!field.startsWith("questions.")) return { part: "general" };
  const rest = field.slice("questions.".length);
  let best = null;
  for (const q of questions) {
    if ((rest === q.id || rest.startsWith(`${q.id}.`)) && (best === null || q.id.length > best.id.length)) best = q;
  }
  if (!best) return { part: "questions" };
  const sub = rest === best.id ? "" : rest.slice(best.id.length + 1);
  if (sub === "") return { part: "id", uid: best.uid, sub };
  if (sub === "instructions" || sub.startsWith("instructions.")) return { part: "instructions", uid: best.uid, sub: sub.slice(13) };
  if (sub === "criteria" || sub.startsWith("criteria.")) return { part: "criteria", uid: best.uid, sub: sub.slice(9) };
  return { part: "question", uid: best.uid, sub };
}
