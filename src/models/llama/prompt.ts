import type { Question } from "../../contract/decision.ts";

/**
 * The texts the embedded engine puts into the model's chat template: a system message with the task
 * and the state (shared by every question of a request, so it is evaluated once), and one user
 * message per question listing its answers, each behind a label. The model's reply starts at the
 * assistant's answer position, where the engine reads the next-token distribution over the labels.
 */
export const SYSTEM_INSTRUCTIONS =
  "You answer typed questions about the state below. Each question lists its possible answers, each behind a label. " +
  "Reply with the label of the best answer and nothing else.";

/** The system message: the instructions, then the state (as the client wrote it, when its JSON text is known). */
export function renderSystemText(state: unknown, stateText?: string): string {
  return `${SYSTEM_INSTRUCTIONS}\n\nState:\n${typeof state !== "string" && stateText !== undefined ? stateText : jsonText(state)}`;
}

/**
 * The user message of one question. `labels` has one label per option (choice, in criteria order),
 * per level (score, level 0 first) or [true label, false label] (noul).
 */
export function renderQuestionText(question: Question, labels: readonly string[]): string {
  const lines: string[] = [];
  const instructions = question.instructions;
  switch (question.type) {
    case "choice": {
      lines.push("Type: choice");
      if (hasValue(instructions)) lines.push(`Instructions: ${jsonText(instructions)}`);
      lines.push("Options:");
      Object.entries(question.criteria).forEach(([name, description], i) => {
        lines.push(`${labels[i]}: ${name}${hasValue(description) ? ` — ${jsonText(description)}` : ""}`);
      });
      lines.push("Reply with the label of one option.");
      break;
    }
    case "score": {
      const n = question.criteria.length;
      lines.push("Type: score");
      if (hasValue(instructions)) lines.push(`Instructions: ${jsonText(instructions)}`);
      lines.push(`Levels, from the lowest (0) to the highest (${n - 1}):`);
      question.criteria.forEach((description, i) => {
        const label = labels[i] as string;
        const level = label === String(i) ? "" : `level ${i}`;
        const text = hasValue(description) ? jsonText(description) : "";
        lines.push(`${label}: ${[level, text].filter((s) => s !== "").join(" — ")}`);
      });
      lines.push("Reply with the label of one level.");
      break;
    }
    case "noul": {
      const [yes, no] = labels as [string, string];
      lines.push("Type: yes or no");
      if (hasValue(instructions)) lines.push(`Instructions: ${jsonText(instructions)}`);
      const criteria = question.criteria;
      if (criteria && hasValue(criteria.true)) lines.push(`${yes} means: ${jsonText(criteria.true)}`);
      if (criteria && hasValue(criteria.false)) lines.push(`${no} means: ${jsonText(criteria.false)}`);
      lines.push(`Reply ${yes} or ${no}.`);
      break;
    }
  }
  return lines.join("\n");
}

/** Strings as they are; other JSON values as compact JSON. */
export function jsonText(value: unknown): string {
  if (typeof value === "string") return value;
  if (value === undefined) return "";
  return JSON.stringify(value) ?? "";
}

function hasValue(value: unknown): boolean {
  return value !== undefined && value !== null && value !== "";
}
