// Answer cards: a choice or a score level with probability bars, the score on its scale, the
// noul probability as a gauge, and the confidence.

import { h } from "./dom.js";
import { percent } from "./format.js";
import { TYPE_LABELS } from "./questions.js";

function describe(value) {
  if (value === null || value === undefined) return "";
  return typeof value === "string" ? value : JSON.stringify(value);
}

function bar(p, top) {
  return h(
    "span",
    { class: "bar", "aria-hidden": "true" },
    h("span", { class: ["bar-fill", top && "bar-fill-top"], style: { width: `${Math.max(0, Math.min(1, p)) * 100}%` } }),
  );
}

/** One row per option or level: name, description, bar, value. */
function probabilityList(rows, topKey) {
  return h(
    "ul",
    { class: "probs" },
    rows.map(({ key, name, description, p }) =>
      h(
        "li",
        { class: ["prob", key === topKey && "prob-top"] },
        h(
          "span",
          { class: "prob-name" },
          h("span", { class: "prob-key", text: name }),
          description ? h("span", { class: "prob-desc", text: ` ${description}` }) : null,
        ),
        bar(p, key === topKey),
        h("span", { class: "prob-value", text: percent(p) }),
      ),
    ),
  );
}

function confidence(c) {
  return h(
    "p",
    { class: "confidence" },
    h("span", { class: "confidence-label", text: "Confidence" }),
    bar(c, false),
    h("span", { class: "prob-value", text: percent(c) }),
  );
}

function choiceBody(q, a) {
  const names = q.options.map((o) => o.name).filter((n) => n in a.probabilities);
  for (const n of Object.keys(a.probabilities)) if (!names.includes(n)) names.push(n);
  const descriptions = new Map(q.options.map((o) => [o.name, o.description]));
  return [
    h(
      "p",
      { class: "answer-main" },
      h("span", { class: "answer-label", text: "Choice" }),
      h("strong", { class: "answer-value", text: a.choice }),
    ),
    probabilityList(
      names.map((n) => ({ key: n, name: n, description: descriptions.get(n) ?? "", p: a.probabilities[n] })),
      a.choice,
    ),
    confidence(a.confidence),
  ];
}

function scoreBody(a) {
  const keys = Object.keys(a.probabilities).sort((x, y) => Number(x) - Number(y));
  const n = keys.length;
  const max = Math.max(1, n - 1);
  const nearest = String(Math.min(n - 1, Math.max(0, Math.round(a.score))));
  const legend = a.legend ?? {};
  const position = n === 1 ? 50 : (a.score / max) * 100;
  const showEvery = n <= 6 ? 1 : Math.ceil(n / 6);
  return [
    h(
      "p",
      { class: "answer-main" },
      h("span", { class: "answer-label", text: "Score" }),
      h("strong", { class: "answer-value", text: a.score.toFixed(2) }),
      h("span", { class: "answer-scale-text", text: `on 0 – ${n - 1}` }),
    ),
    h("p", {
      class: "answer-note answer-note-score",
      text: `Nearest level ${nearest}${legend[nearest] !== undefined && legend[nearest] !== null ? `: ${describe(legend[nearest])}` : ""}`,
    }),
    h(
      "div",
      { class: "scale", role: "img", "aria-label": `Score ${a.score.toFixed(2)} on a scale from 0 to ${n - 1}` },
      h("span", { class: "scale-track" }),
      keys.map((k, i) =>
        h(
          "span",
          { class: "scale-tick", style: { left: `${n === 1 ? 50 : (i / max) * 100}%` } },
          i % showEvery === 0 || i === n - 1 ? h("span", { class: "scale-tick-label", text: k }) : null,
        ),
      ),
      h("span", { class: "scale-marker", style: { left: `${Math.max(0, Math.min(100, position))}%` } }),
    ),
    probabilityList(
      keys.map((k) => ({ key: k, name: k, description: describe(legend[k]), p: a.probabilities[k] })),
      nearest,
    ),
    confidence(a.confidence),
  ];
}

/** A half-circle gauge from 0 (false) to 1 (true). */
function gauge(p) {
  const r = 50;
  const cx = 60;
  const cy = 60;
  const angle = Math.PI * (1 - Math.max(0, Math.min(1, p)));
  const x = cx + r * Math.cos(angle);
  const y = cy - r * Math.sin(angle);
  const arc = (toX, toY) => `M ${cx - r} ${cy} A ${r} ${r} 0 0 1 ${toX.toFixed(2)} ${toY.toFixed(2)}`;
  return h(
    "svg:svg",
    { class: "gauge", viewBox: "0 0 120 74", role: "img", "aria-label": `Probability of true: ${percent(p)}` },
    h("svg:path", { class: "gauge-track", d: arc(cx + r, cy) }),
    p > 0.001 ? h("svg:path", { class: "gauge-fill", d: arc(x, y) }) : null,
    h("svg:line", {
      class: "gauge-needle",
      x1: cx,
      y1: cy,
      x2: (cx + (r - 14) * Math.cos(angle)).toFixed(2),
      y2: (cy - (r - 14) * Math.sin(angle)).toFixed(2),
    }),
    h("svg:circle", { class: "gauge-hub", cx, cy, r: 3.5 }),
    h("svg:text", { class: "gauge-end", x: cx - r, y: 73, "text-anchor": "middle", text: "false" }),
    h("svg:text", { class: "gauge-end", x: cx + r, y: 73, "text-anchor": "middle", text: "true" }),
  );
}

function noulBody(q, a) {
  const leaning = a.noul >= 0.5 ? "true" : "false";
  const describeEnd = leaning === "true" ? q.noulTrue : q.noulFalse;
  return [
    h(
      "div",
      { class: "noul" },
      gauge(a.noul),
      h(
        "div",
        { class: "noul-text" },
        h(
          "p",
          { class: "answer-main" },
          h("span", { class: "answer-label", text: "P(true)" }),
          h("strong", { class: "answer-value", text: a.noul.toFixed(3) }),
        ),
        h("p", {
          class: "answer-note",
          text: `Leans ${leaning}${describeEnd ? ` (${describeEnd})` : ""}; ${percent(Math.max(a.noul, 1 - a.noul))} for that side.`,
        }),
      ),
    ),
  ];
}

/** The card of one question's answer; `q` is the question as it was sent. */
export function answerCard(q, a) {
  const body = !a
    ? [h("p", { class: "answer-note", text: "No answer for this question." })]
    : a.type === "choice"
      ? choiceBody(q, a)
      : a.type === "score"
        ? scoreBody(a)
        : noulBody(q, a);
  return h(
    "article",
    { class: ["acard", `acard-${q.type}`], dataset: { question: q.id } },
    h(
      "header",
      { class: "acard-head" },
      h("h3", { class: "acard-title", text: q.id === "" ? "(empty id)" : q.id }),
      h("span", { class: ["badge", `badge-${q.type}`], text: TYPE_LABELS[q.type] }),
    ),
    q.instructions ? h("p", { class: "acard-instructions", text: q.instructions }) : null,
    body,
  );
}

/** One sentence per answer for the live region. */
export function spokenSummary(questions, answers) {
  return questions
    .map((q) => {
      const a = answers[q.id];
      if (!a) return `${q.id}: no answer`;
      if (a.type === "choice") return `${q.id}: ${a.choice} (${percent(a.probabilities[a.choice])})`;
      if (a.type === "score") return `${q.id}: score ${a.score.toFixed(2)}`;
      return `${q.id}: ${percent(a.noul)} true`;
    })
    .join("; ");
}
