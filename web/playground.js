// The Playground page: edit state and questions, pick a model, run (button or Ctrl/Cmd+Enter),
// see the answers, the request id, raw JSON and code; server validation errors next to fields.

import { answerCard, spokenSummary } from "./answers.js";
import { ApiError, apiBaseUrl } from "./api.js";
import { curlSnippet, typescriptSnippet } from "./code.js";
import { $, announce, appendChildren, clear, copyText, h, uid } from "./dom.js";
import { integer, ms, usd } from "./format.js";
import { prettyJson, stringify } from "./json.js";
import { buildRequest, freshId, level, locateField, option, question, sampleDraft, TEMPLATES, TYPE_LABELS } from "./questions.js";
import { isRecorded, referenceLine } from "./request-reference.js";
import { keepFieldsClearOfRunBar } from "./run-bar.js";
import { clearLimit, showLimitFromError } from "./status.js";

/**
 * @param {{ api: ReturnType<import("./api.js").createApi>, afterRun: () => void, unauthorized: (message: string) => void }} deps
 */
export function createPlayground(deps) {
  let draft = sampleDraft();
  let maxQuestions = 32;
  let running = false;
  /** Counts runs, so that the answer of an older run is not shown over a newer one. */
  let runs = 0;
  /** Field errors shown next to fields: key "state" | "model" | "questions" | `${uid}:${part}` → messages. */
  const errors = new Map();

  const form = $("#playground-form");
  const stateInput = $("#state-input");
  const list = $("#question-list");
  const modelSelect = $("#model-select");
  const runButton = $("#run-button");
  keepFieldsClearOfRunBar($(".run-bar"));

  // ── Field errors ────────────────────────────────────────────────────────────────────────────

  function addError(key, message) {
    const messages = errors.get(key) ?? [];
    if (!messages.includes(message)) messages.push(message);
    errors.set(key, messages);
  }

  /** Shows (or hides) the messages of `key` in `errorEl` and marks `control` invalid. */
  function paintError(key, errorEl, control) {
    const messages = errors.get(key) ?? [];
    errorEl.hidden = messages.length === 0;
    clear(errorEl);
    if (messages.length === 1) errorEl.textContent = messages[0];
    else for (const m of messages) errorEl.append(h("span", { class: "field-error-line", text: m }));
    if (control) {
      if (messages.length) control.setAttribute("aria-invalid", "true");
      else control.removeAttribute("aria-invalid");
      const ids = (control.getAttribute("aria-describedby") ?? "").split(" ").filter((x) => x && x !== errorEl.id);
      if (messages.length) ids.push(errorEl.id);
      if (ids.length) control.setAttribute("aria-describedby", ids.join(" "));
      else control.removeAttribute("aria-describedby");
    }
  }

  function dropError(key, errorEl, control) {
    if (!errors.has(key)) return;
    errors.delete(key);
    paintError(key, errorEl, control);
  }

  function paintTopErrors() {
    paintError("state", $("#state-error"), stateInput);
    checkStateJson();
    paintError("model", $("#model-error"), modelSelect);
    paintError("questions", $("#questions-error"), null);
  }

  // ── State ───────────────────────────────────────────────────────────────────────────────────

  function checkStateJson() {
    const status = $("#state-json-status");
    if (draft.stateMode !== "json") {
      status.hidden = true;
      status.textContent = "";
      stateInput.classList.remove("is-json");
      return;
    }
    stateInput.classList.add("is-json");
    status.hidden = false;
    try {
      const value = JSON.parse(draft.stateText);
      const kind = Array.isArray(value)
        ? `array, ${value.length} items`
        : value === null
          ? "null"
          : typeof value === "object"
            ? `object, ${Object.keys(value).length} keys`
            : typeof value;
      status.className = "json-status json-ok";
      status.textContent = `Valid JSON (${kind})`;
      if (!errors.has("state")) stateInput.removeAttribute("aria-invalid");
    } catch (err) {
      status.className = "json-status json-bad";
      status.textContent = `Not valid JSON: ${jsonErrorText(err, draft.stateText)}`;
      stateInput.setAttribute("aria-invalid", "true");
    }
  }

  function setStateMode(mode) {
    if (mode === draft.stateMode) return;
    if (mode === "json") {
      try {
        JSON.parse(draft.stateText);
      } catch {
        draft.stateText = JSON.stringify(draft.stateText);
      }
    } else {
      try {
        const value = JSON.parse(draft.stateText);
        if (typeof value === "string") draft.stateText = value;
      } catch {
        /* keep the text as it is */
      }
    }
    draft.stateMode = mode;
    stateInput.value = draft.stateText;
    $(`#state-mode-${mode}`).checked = true;
    dropError("state", $("#state-error"), stateInput);
    checkStateJson();
    codeChanged();
  }

  stateInput.addEventListener("input", () => {
    draft.stateText = stateInput.value;
    dropError("state", $("#state-error"), stateInput);
    checkStateJson();
    codeChanged();
  });
  for (const mode of ["text", "json"]) $(`#state-mode-${mode}`).addEventListener("change", () => setStateMode(mode));

  modelSelect.addEventListener("change", () => {
    draft.model = modelSelect.value;
    dropError("model", $("#model-error"), modelSelect);
    codeChanged();
  });

  // ── Questions ───────────────────────────────────────────────────────────────────────────────

  /** Re-renders the question list; `focus` = {uid, action} puts the focus back where it was. */
  function renderQuestions(focus) {
    const kept = focus ? null : focusInList();
    clear(list);
    for (const [i, q] of draft.questions.entries()) list.append(questionCard(q, i, draft.questions.length));
    $("#question-count").textContent = `${draft.questions.length} of ${maxQuestions}`;
    for (const b of document.querySelectorAll("[data-add]")) b.disabled = draft.questions.length >= maxQuestions;
    paintTopErrors();
    if (focus) {
      const card = list.querySelector(`[data-uid="${focus.uid}"]`);
      const target =
        card?.querySelector(`[data-action="${focus.action}"]:not([disabled])`) ??
        card?.querySelector("[data-action]:not([disabled])") ??
        card?.querySelector("input");
      target?.focus();
    } else if (kept) {
      restoreFocus(kept);
    }
    codeChanged();
  }

  /** Where the focus is inside the question list (card, control index, caret), to restore it after a re-render. */
  function focusInList() {
    const el = document.activeElement;
    if (!el || !list.contains(el)) return null;
    const card = el.closest("[data-uid]");
    if (!card) return null;
    const controls = [...card.querySelectorAll("input, textarea, button, select")];
    const caret = "selectionStart" in el && typeof el.selectionStart === "number" ? [el.selectionStart, el.selectionEnd] : null;
    return { uid: card.dataset.uid, index: controls.indexOf(el), caret };
  }

  function restoreFocus(kept) {
    const card = list.querySelector(`[data-uid="${kept.uid}"]`);
    const el = card ? [...card.querySelectorAll("input, textarea, button, select")][kept.index] : null;
    if (!el) return;
    el.focus();
    if (kept.caret && typeof el.setSelectionRange === "function") el.setSelectionRange(kept.caret[0], kept.caret[1]);
  }

  function fieldBlock(labelText, control, errorKey, { hint, className } = {}) {
    const errorEl = h("p", { class: "field-error", id: uid("err"), hidden: true });
    const label = h("label", { for: control.id, text: labelText });
    const block = h(
      "div",
      { class: ["field", className] },
      label,
      hint ? h("span", { class: "hint", text: hint }) : null,
      control,
      errorEl,
    );
    paintError(errorKey, errorEl, control);
    return { block, errorEl };
  }

  function textInput(value, onInput, attrs = {}) {
    const el = h("input", { type: "text", id: uid("in"), value, autocomplete: "off", spellcheck: "false", ...attrs });
    el.addEventListener("input", () => onInput(el.value, el));
    return el;
  }

  function iconButton(symbol, label, action, onClick, disabled = false) {
    return h(
      "button",
      { type: "button", class: "btn btn-icon", "aria-label": label, title: label, dataset: { action }, disabled, onclick: onClick },
      h("span", { "aria-hidden": "true", text: symbol }),
    );
  }

  function move(q, delta) {
    const i = draft.questions.indexOf(q);
    const j = i + delta;
    if (j < 0 || j >= draft.questions.length) return;
    [draft.questions[i], draft.questions[j]] = [draft.questions[j], draft.questions[i]];
    renderQuestions({ uid: q.uid, action: delta < 0 ? "up" : "down" });
    announce(`Question ${JSON.stringify(q.id)} moved to position ${j + 1} of ${draft.questions.length}.`);
  }

  function removeQuestion(q) {
    const i = draft.questions.indexOf(q);
    draft.questions.splice(i, 1);
    for (const key of [...errors.keys()]) if (key.startsWith(`${q.uid}:`)) errors.delete(key);
    const neighbour = draft.questions[Math.min(i, draft.questions.length - 1)];
    renderQuestions(neighbour ? { uid: neighbour.uid, action: "remove" } : undefined);
    if (!neighbour) document.querySelector('[data-add="choice"]')?.focus();
    announce(`Question ${JSON.stringify(q.id)} removed.`);
  }

  function addQuestion(type) {
    if (draft.questions.length >= maxQuestions) return;
    const q = question(type, freshId(type, draft.questions), TEMPLATES[type]);
    draft.questions.push(q);
    renderQuestions();
    list.querySelector(`[data-uid="${q.uid}"] input`)?.focus();
    announce(`${TYPE_LABELS[type]} question ${q.id} added as question ${draft.questions.length}.`);
  }
  for (const b of document.querySelectorAll("[data-add]")) b.addEventListener("click", () => addQuestion(b.dataset.add));

  function questionCard(q, index, count) {
    const n = index + 1;
    const idKey = `${q.uid}:id`;
    const idField = fieldBlock(
      "Question id",
      textInput(
        q.id,
        (value, el) => {
          q.id = value;
          dropError(idKey, idField.errorEl, el);
          codeChanged();
        },
        { class: "input-id", maxlength: "200" },
      ),
      idKey,
      { className: "field-id" },
    );
    const instrKey = `${q.uid}:instructions`;
    const instructions = h("textarea", { id: uid("in"), rows: "2", value: q.instructions });
    instructions.addEventListener("input", () => {
      q.instructions = instructions.value;
      dropError(instrKey, instrField.errorEl, instructions);
      codeChanged();
    });
    const instrField = fieldBlock("Instructions", instructions, instrKey);

    const questionKey = `${q.uid}:question`;
    const questionError = h("p", { class: "field-error", id: uid("err"), hidden: true });
    paintError(questionKey, questionError, null);

    return h(
      "li",
      { class: ["qcard", `qcard-${q.type}`], dataset: { uid: q.uid, type: q.type } },
      h(
        "div",
        { class: "qcard-head" },
        h(
          "h3",
          { class: "qcard-title" },
          h("span", { class: ["badge", `badge-${q.type}`], text: TYPE_LABELS[q.type] }),
          h("span", { class: "qcard-num", text: `Question ${n}` }),
        ),
        h(
          "div",
          { class: "qcard-actions" },
          iconButton("↑", `Move question ${n} up`, "up", () => move(q, -1), index === 0),
          iconButton("↓", `Move question ${n} down`, "down", () => move(q, 1), index === count - 1),
          iconButton("✕", `Remove question ${n}`, "remove", () => removeQuestion(q)),
        ),
      ),
      questionError,
      idField.block,
      instrField.block,
      criteriaEditor(q, n),
    );
  }

  function criteriaEditor(q, n) {
    const key = `${q.uid}:criteria`;
    const errorEl = h("p", { class: "field-error", id: uid("err"), hidden: true });
    const fieldset = h("fieldset", { class: "criteria", "aria-describedby": null });
    const clearCriteriaError = () => {
      if (!errors.has(key)) return;
      errors.delete(key);
      paintError(key, errorEl, null);
      fieldset.removeAttribute("aria-invalid");
      fieldset.classList.remove("has-error");
    };
    const rerender = (focusSelector) => {
      const fresh = criteriaEditor(q, n);
      fieldset.replaceWith(fresh);
      fresh.querySelector(focusSelector)?.focus();
      codeChanged();
    };

    if (q.type === "choice") {
      appendChildren(
        fieldset,
        h("legend", { text: "Options" }),
        q.options.length
          ? h(
              "div",
              { class: "crit-cols", "aria-hidden": "true" },
              h("span", { text: "Name" }),
              h("span", { text: "Description (optional)" }),
            )
          : null,
        h(
          "div",
          { class: "crit-rows" },
          q.options.map((o, i) => {
            const nameInput = textInput(
              o.name,
              (v) => {
                o.name = v;
                clearCriteriaError();
                codeChanged();
              },
              { class: "crit-name", placeholder: "name" },
            );
            const descInput = textInput(
              o.description,
              (v) => {
                o.description = v;
                clearCriteriaError();
                codeChanged();
              },
              { class: "crit-desc", placeholder: "description" },
            );
            return h(
              "div",
              { class: "crit-row", dataset: { row: o.uid } },
              h("label", { class: "visually-hidden", for: nameInput.id, text: `Question ${n}, option ${i + 1} name` }),
              nameInput,
              h("label", { class: "visually-hidden", for: descInput.id, text: `Question ${n}, option ${i + 1} description` }),
              descInput,
              iconButton("✕", `Remove option ${i + 1} of question ${n}`, "remove-row", () => {
                q.options.splice(i, 1);
                clearCriteriaError();
                rerender(
                  q.options.length
                    ? `[data-row="${q.options[Math.min(i, q.options.length - 1)].uid}"] [data-action="remove-row"]`
                    : "[data-action=add-row]",
                );
              }),
            );
          }),
        ),
        h("button", {
          type: "button",
          class: "btn btn-small btn-quiet",
          dataset: { action: "add-row" },
          text: "+ Add option",
          "aria-label": `Add an option to question ${n}`,
          onclick: () => {
            const o = option(`option_${q.options.length + 1}`, "");
            q.options.push(o);
            clearCriteriaError();
            rerender(`[data-row="${o.uid}"] input`);
          },
        }),
      );
    } else if (q.type === "score") {
      fieldset.append(
        h("legend", { text: "Levels (0 first)" }),
        h(
          "div",
          { class: "crit-rows" },
          q.levels.map((l, i) => {
            const input = textInput(
              l.description,
              (v) => {
                l.description = v;
                clearCriteriaError();
                codeChanged();
              },
              { class: "crit-desc", placeholder: "description" },
            );
            return h(
              "div",
              { class: "crit-row crit-row-level", dataset: { row: l.uid } },
              h("span", { class: "level-num", "aria-hidden": "true", text: String(i) }),
              h("label", { class: "visually-hidden", for: input.id, text: `Question ${n}, level ${i} description` }),
              input,
              iconButton("✕", `Remove level ${i} of question ${n}`, "remove-row", () => {
                q.levels.splice(i, 1);
                clearCriteriaError();
                rerender(
                  q.levels.length
                    ? `[data-row="${q.levels[Math.min(i, q.levels.length - 1)].uid}"] [data-action="remove-row"]`
                    : "[data-action=add-row]",
                );
              }),
            );
          }),
        ),
        h("button", {
          type: "button",
          class: "btn btn-small btn-quiet",
          dataset: { action: "add-row" },
          text: "+ Add level",
          "aria-label": `Add a level to question ${n}`,
          onclick: () => {
            const l = level("");
            q.levels.push(l);
            clearCriteriaError();
            rerender(`[data-row="${l.uid}"] input`);
          },
        }),
      );
    } else {
      const t = textInput(
        q.noulTrue,
        (v) => {
          q.noulTrue = v;
          clearCriteriaError();
          codeChanged();
        },
        { placeholder: "optional" },
      );
      const f = textInput(
        q.noulFalse,
        (v) => {
          q.noulFalse = v;
          clearCriteriaError();
          codeChanged();
        },
        { placeholder: "optional" },
      );
      fieldset.append(
        h("legend", { text: "Descriptions (optional)" }),
        h(
          "div",
          { class: "noul-crit" },
          h("div", { class: "field" }, h("label", { for: t.id, text: "When true" }), t),
          h("div", { class: "field" }, h("label", { for: f.id, text: "When false" }), f),
        ),
      );
    }
    fieldset.append(errorEl);
    paintError(key, errorEl, null);
    if (errors.has(key)) {
      fieldset.setAttribute("aria-invalid", "true");
      fieldset.setAttribute("aria-describedby", errorEl.id);
      fieldset.classList.add("has-error");
    }
    fieldset.dataset.criteria = q.uid;
    return fieldset;
  }

  // ── Code ────────────────────────────────────────────────────────────────────────────────────

  let codeTimer = null;
  function codeChanged() {
    if (!$("#code-details").open) return;
    clearTimeout(codeTimer);
    codeTimer = setTimeout(renderCode, 150);
  }

  function renderCode() {
    const { body } = buildRequest(draft);
    const base = apiBaseUrl();
    $("#code-curl").textContent = curlSnippet(base, body);
    $("#code-ts").textContent = typescriptSnippet(base, body, {
      scoreWithOneLevel: draft.questions.some((q) => q.type === "score" && q.levels.length < 2),
    });
  }
  $("#code-details").addEventListener("toggle", () => {
    if ($("#code-details").open) renderCode();
  });

  // ── Run ─────────────────────────────────────────────────────────────────────────────────────

  function placeError(where, message) {
    if (where.part === "state" || where.part === "model" || where.part === "questions") addError(where.part, message);
    else if (where.part === "general") return false;
    else addError(`${where.uid}:${where.part}`, message);
    return true;
  }

  /** `reference`: the line naming the request's id (referenceLine), or null. */
  function showGeneral(title, lines = [], reference = null) {
    const box = $("#general-error");
    appendChildren(
      clear(box),
      h("p", { class: "error-title", text: title }),
      lines.length
        ? h(
            "ul",
            {},
            lines.map((l) => h("li", { text: l })),
          )
        : null,
      reference,
    );
    box.hidden = false;
  }

  function resetResults() {
    $("#general-error").hidden = true;
    clear($("#general-error"));
    clear($("#answer-cards"));
    clear($("#result-meta")).hidden = true;
    $("#results-empty").hidden = true;
  }

  async function run() {
    if (running) return;
    errors.clear();
    const built = buildRequest(draft);
    resetResults();
    if (built.problems.length > 0) {
      for (const p of built.problems) placeError(p.where, p.message);
      renderQuestions();
      const text = `The request was not sent: ${built.problems.map((p) => p.message).join("; ")}.`;
      showGeneral(
        "Fix the marked fields, then run again.",
        built.problems.map((p) => p.message),
      );
      announce(text);
      return;
    }
    renderQuestions();
    const seq = ++runs;
    const sent = structuredClone(draft.questions);
    const bodyText = stringify(built.body);
    running = true;
    runButton.setAttribute("aria-disabled", "true");
    runButton.classList.add("is-running");
    runButton.textContent = "Running…";
    $("#results").setAttribute("aria-busy", "true");
    let response;
    try {
      response = await deps.api.decide(bodyText);
    } catch (err) {
      showGeneral(`The gateway could not be reached: ${err.message}`);
      announce("The request failed: the gateway could not be reached.");
      return;
    } finally {
      running = false;
      runButton.removeAttribute("aria-disabled");
      runButton.classList.remove("is-running");
      runButton.textContent = "Run request";
      $("#results").removeAttribute("aria-busy");
    }

    $("#raw-details").hidden = false;
    $("#raw-request").textContent = prettyJson(bodyText);
    $("#raw-status").textContent = `HTTP ${response.status}`;
    $("#raw-response").textContent = prettyJson(response.text);
    if ($("#code-details").open) renderCode();

    if (response.ok && response.json) {
      clearLimit();
      renderAnswers(sent, response);
      announce(`Answers received in ${ms(response.ms)}. ${spokenSummary(sent, response.json.answers ?? {})}.`);
    } else {
      const err = new ApiError(response);
      const requestId = response.headers.get("x-service-request-id");
      if (err.status === 401) {
        deps.unauthorized(err.detail);
        return;
      }
      const recorded = requestId ? await isRecorded(err, requestId, deps.api.usageRecord) : null;
      if (seq !== runs) return;
      const reference = requestId ? referenceLine(requestId, recorded) : null;
      if (err.status === 429 || err.status === 402) {
        // The banner says what happened and, once, how long to wait; the box only that this request was not run.
        const limit = showLimitFromError(err);
        showGeneral(`HTTP ${err.status}: The request was not run. ${limit}`, err.status === 402 ? [err.detail] : [], reference);
        announce(`The request was not run: HTTP ${err.status}. ${limit}`);
        deps.afterRun();
        return;
      }
      const unplaced = [];
      let placed = 0;
      for (const e of err.errors) {
        if (placeError(locateField(String(e.field), sent), e.message)) placed++;
        else unplaced.push(`${e.field}: ${e.message}`);
      }
      if (err.errors.length) renderQuestions();
      const title = placed > 0 ? `${err.detail}${unplaced.length ? "" : " The problems are shown next to their fields."}` : err.detail;
      showGeneral(`HTTP ${err.status}: ${title}`, unplaced, reference);
      announce(`The request failed with HTTP ${err.status}. ${err.detail}`);
    }
    deps.afterRun();
  }

  function renderAnswers(sent, response) {
    const body = response.json;
    const meta = $("#result-meta");
    const idCode = h("code", { id: "result-request-id", class: "request-id", text: body.request_id });
    const copyStatus = h("span", { class: "copy-status", role: "status" });
    const copyButton = h("button", {
      type: "button",
      class: "btn btn-small",
      id: "copy-request-id",
      text: "Copy",
      "aria-label": "Copy request id",
      onclick: async () => {
        copyStatus.textContent = (await copyText(body.request_id, idCode)) ? "Copied" : "Selected: press Ctrl+C";
        setTimeout(() => (copyStatus.textContent = ""), 2500);
      },
    });
    const u = body.usage ?? {};
    clear(meta).append(
      h(
        "dl",
        { class: "meta" },
        metaItem("Model", body.model),
        metaItem("Mode", body.service_mode),
        metaItem("Tokens", `${integer(u.input_tokens)} in · ${integer(u.output_tokens)} out`),
        metaItem("Cost", usd(u.cost_usd)),
        metaItem("Model latency", ms(body.latency_ms)),
        metaItem("Gateway latency", ms(body.gateway_latency_ms)),
        metaItem("Round trip", ms(response.ms)),
      ),
      h("div", { class: "request-id-row" }, h("span", { class: "meta-label", text: "Request id" }), idCode, copyButton, copyStatus),
    );
    meta.hidden = false;
    const cards = $("#answer-cards");
    for (const q of sent) cards.append(answerCard(q, body.answers?.[q.id]));
  }

  function metaItem(label, value) {
    return h("div", { class: "meta-item" }, h("dt", { text: label }), h("dd", { text: value ?? "–" }));
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    void run();
  });

  document.addEventListener("keydown", (event) => {
    if (event.key !== "Enter" || !(event.ctrlKey || event.metaKey)) return;
    if ($("#page-playground").hidden) return;
    event.preventDefault();
    void run();
  });

  for (const button of document.querySelectorAll("[data-copy]")) {
    button.addEventListener("click", async () => {
      const source = document.getElementById(button.dataset.copy);
      const ok = await copyText(source.textContent, source);
      announce(ok ? "Copied to the clipboard." : "Copy failed; the text is selected.");
      button.textContent = ok ? "Copied" : "Selected";
      setTimeout(() => (button.textContent = "Copy"), 2000);
    });
  }

  function load() {
    stateInput.value = draft.stateText;
    $(`#state-mode-${draft.stateMode}`).checked = true;
    checkStateJson();
    renderQuestions();
  }
  load();

  return {
    run,
    setLimits(config) {
      maxQuestions = config?.limits?.max_questions ?? 32;
      renderQuestions();
    },
    setModels(models, defaultModel) {
      clear(modelSelect).append(h("option", { value: "", text: defaultModel ? `Server default (${defaultModel})` : "Server default" }));
      for (const m of models) modelSelect.append(h("option", { value: m.name, text: m.name }));
      if (draft.model && !models.some((m) => m.name === draft.model)) draft.model = "";
      modelSelect.value = draft.model;
    },
    /** Back to the example and no results (sign-out). */
    reset() {
      draft = sampleDraft();
      errors.clear();
      resetResults();
      $("#results-empty").hidden = false;
      $("#raw-details").hidden = true;
      $("#raw-details").open = false;
      $("#code-details").open = false;
      clear($("#raw-request"));
      clear($("#raw-response"));
      load();
    },
  };
}

/** "Unexpected token } in JSON at position 12" → adds line and column. */
function jsonErrorText(err, text) {
  const message = String(err.message ?? err);
  const at = /position (\d+)/.exec(message);
  if (!at || /line \d+/.test(message)) return message;
  const before = text.slice(0, Number(at[1]));
  const line = before.split("\n").length;
  const column = before.length - before.lastIndexOf("\n");
  return `${message} (line ${line}, column ${column})`;
}
