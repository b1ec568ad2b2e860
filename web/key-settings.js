// A key's own limits on the Admin page: the fields of the create form and of the edit dialog (expiry, models,
// requests per minute, budget), what they send, and how the key list shows them.

import { h, setFieldError, uid } from "./dom.js";
import { integer, isoToLocalInput, localInputToIso, localTime, parseAmount, utcSeconds } from "./format.js";

const PERIOD_WORDS = { day: "UTC day", month: "UTC month" };

/** Decimal USD → integer microUSD ("12.5" → 12500000), for comparing amounts written differently. */
function usdToMicro(text) {
  const [whole, fraction = ""] = String(text).split(".");
  return Number(whole) * 1_000_000 + Number(fraction.padEnd(6, "0").slice(0, 6));
}

/** A budget as typed → the exact string the API takes; 0 is a budget too (the key may spend nothing). */
function parseBudget(raw) {
  if (/^\s*\$?\s*0*(\.0*)?\s*(USD)?\s*$/i.test(raw) && /\d/.test(raw)) return { amount: "0" };
  const parsed = parseAmount(raw);
  if ("problem" in parsed) return { problem: parsed.problem.replace(/^The amount/, "The budget").replace(/\bthe amount\b/, "the budget") };
  return parsed;
}

/** Model names typed in a text field: separated by commas or spaces, each once. */
function splitNames(text) {
  return [...new Set(text.split(/[\s,]+/).filter(Boolean))];
}

function sameList(a, b) {
  const x = [...a].sort();
  const y = [...b].sort();
  return x.length === y.length && x.every((name, i) => name === y[i]);
}

/**
 * The limit fields of a key form. `values()` reads them for a create (only what is set) or, given the key, for an
 * update (only what changed; a cleared field is null). `fields` maps each API field to [input, error element].
 *
 * @param {{ prefix: string, rpmHint: () => string }} options
 */
export function keySettingsFields({ prefix, rpmHint }) {
  const id = (name) => uid(`${prefix}-${name}`);
  const field = (label, input, hint) => {
    const errorEl = h("p", { id: id("error"), class: "field-error", hidden: true });
    const hintEl = hint ? h("p", { id: id("hint"), class: "hint", text: hint }) : null;
    if (hintEl) input.setAttribute("aria-describedby", hintEl.id);
    input.id = id("input");
    const wrap = h("div", { class: "field" }, h("label", { for: input.id, text: label }), input, hintEl, errorEl);
    return { wrap, input, errorEl, hintEl };
  };

  const expires = field(
    "Expires at",
    h("input", { type: "datetime-local", autocomplete: "off" }),
    "Your local time; from then its requests get 401. Empty: it does not expire.",
  );
  const rpm = field(
    "Requests per minute",
    h("input", { type: "text", inputmode: "numeric", autocomplete: "off", placeholder: "e.g. 60" }),
    rpmHint(),
  );
  const budget = field(
    "Budget (USD)",
    h("input", { type: "text", inputmode: "decimal", autocomplete: "off", spellcheck: "false", placeholder: "e.g. 25" }),
    "What it may spend per period in paid mode. Empty: only the organization's credits limit it.",
  );
  const period = field(
    "Budget period",
    h("select", {}, h("option", { value: "month", text: "Per UTC month" }), h("option", { value: "day", text: "Per UTC day" })),
  );
  const other = field(
    "Other models",
    h("input", { type: "text", autocomplete: "off", spellcheck: "false", placeholder: "names, separated by commas" }),
    "Public model names not listed above.",
  );
  const checks = h("div", { class: "model-checks" });
  const modelsHint = h("p", { id: id("hint"), class: "hint", text: "None ticked and none named: every model." });
  const modelsSet = h(
    "fieldset",
    { class: "key-models", "aria-describedby": modelsHint.id },
    h("legend", { text: "Models" }),
    modelsHint,
    checks,
    other.wrap,
  );

  const element = h("div", { class: "key-limits-grid" }, expires.wrap, rpm.wrap, budget.wrap, period.wrap, modelsSet);

  /** The model names offered as checkboxes: the ones known to the page, and any the form has ticked. */
  function setKnownModels(names) {
    const ticked = checkedModels();
    const all = [...new Set([...names, ...ticked])].sort();
    checks.replaceChildren(
      ...all.map((name) =>
        h(
          "label",
          { class: "check" },
          h("input", { type: "checkbox", value: name, checked: ticked.includes(name) }),
          h("span", { text: name }),
        ),
      ),
    );
  }

  function checkedModels() {
    return [...checks.querySelectorAll("input:checked")].map((box) => box.value);
  }

  function models() {
    return [...new Set([...checkedModels(), ...splitNames(other.input.value)])];
  }

  const errorTargets = [expires, rpm, budget, period, other];

  function clearErrors() {
    for (const f of errorTargets) setFieldError(f.input, f.errorEl, null);
  }

  /** Empties the fields (after a create), or fills them with `key`'s settings (an edit). */
  function fill(key = null) {
    clearErrors();
    expires.input.value = key?.expires_at ? isoToLocalInput(key.expires_at) : "";
    rpm.input.value = key?.requests_per_minute ? String(key.requests_per_minute) : "";
    budget.input.value = key?.budget?.usd ?? "";
    period.input.value = key?.budget?.period ?? "month";
    other.input.value = "";
    for (const box of checks.querySelectorAll("input")) box.checked = false;
    if (key?.models?.length) {
      const known = [...checks.querySelectorAll("input")].map((box) => box.value);
      setKnownModels([...known, ...key.models]);
      for (const box of checks.querySelectorAll("input")) box.checked = key.models.includes(box.value);
    }
  }

  /**
   * The settings as the API takes them, checked first: {body} or {problems: [[field, message]]}. Without `key` only
   * the set fields are in the body; with `key` only the changed ones, null for a cleared one.
   */
  function values(key = null) {
    const problems = [];
    const body = {};
    const change = (name, value, same) => {
      if (key ? !same : value !== null) body[name] = value;
    };

    if (expires.input.validity.badInput) problems.push([expires, "Enter a complete date and time, or leave it empty."]);
    else {
      const unchanged = key !== null && expires.input.value === (key.expires_at ? isoToLocalInput(key.expires_at) : "");
      change("expires_at", localInputToIso(expires.input.value) ?? null, unchanged);
    }

    const rpmText = rpm.input.value.trim().replace(/[\s,_]/g, "");
    if (rpmText && !/^\d+$/.test(rpmText)) problems.push([rpm, "Enter a whole number of requests, such as 60, or leave it empty."]);
    else {
      const value = rpmText ? Number(rpmText) : null;
      change("requests_per_minute", value, value === (key?.requests_per_minute ?? null));
    }

    const usdText = budget.input.value.trim();
    if (usdText) {
      const parsed = parseBudget(usdText);
      if ("problem" in parsed) problems.push([budget, parsed.problem]);
      else {
        const value = { usd: parsed.amount, period: period.input.value };
        const old = key?.budget ?? null;
        change("budget", value, old !== null && old.period === value.period && usdToMicro(old.usd) === usdToMicro(value.usd));
      }
    } else change("budget", null, (key?.budget ?? null) === null);

    const list = models();
    change("models", list.length ? list : null, sameList(list, key?.models ?? []));

    return problems.length ? { problems } : { body };
  }

  /** Shows the problems found by `values()` at their fields; focuses the first. */
  function showProblems(problems) {
    clearErrors();
    for (const [f, message] of problems) setFieldError(f.input, f.errorEl, message);
    problems[0]?.[0].input.focus();
  }

  function refreshHints() {
    rpm.hintEl.textContent = rpmHint();
  }

  for (const f of errorTargets) f.input.addEventListener("input", () => setFieldError(f.input, f.errorEl, null));
  checks.addEventListener("change", () => setFieldError(other.input, other.errorEl, null));

  return {
    element,
    /** API field → [input, error element]: where a 422's errors are shown. */
    fields: {
      expires_at: [expires.input, expires.errorEl],
      models: [other.input, other.errorEl],
      requests_per_minute: [rpm.input, rpm.errorEl],
      budget: [budget.input, budget.errorEl],
      "budget.usd": [budget.input, budget.errorEl],
      "budget.period": [period.input, period.errorEl],
    },
    setKnownModels,
    fill,
    values,
    showProblems,
    clearErrors,
    refreshHints,
  };
}

/** A key's state: revoked, retired (its rotation's grace is over), expired, rotated (within its grace) or active. */
export function keyState(key, nowMs = Date.now()) {
  const retiresMs = key.retires_at ? Date.parse(key.retires_at) : null;
  const expiresMs = key.expires_at ? Date.parse(key.expires_at) : null;
  if (key.revoked_at) return "revoked";
  if (retiresMs !== null && retiresMs <= nowMs) return "retired";
  if (expiresMs !== null && expiresMs <= nowMs) return "expired";
  if (key.replaced_by) return "rotated";
  return "active";
}

const when = (iso) => {
  const date = new Date(iso);
  return h("time", { datetime: iso, title: utcSeconds(date), text: localTime(date) });
};

/** A key's own limits as list items for the key list; "None" when it has none. */
export function limitsList(key, nowMs = Date.now()) {
  const items = [];
  if (key.expires_at) items.push([Date.parse(key.expires_at) <= nowMs ? "Expired " : "Expires ", when(key.expires_at)]);
  if (key.models?.length)
    items.push([`Model${key.models.length === 1 ? "" : "s"}: `, h("span", { class: "model-names", text: key.models.join(", ") })]);
  if (key.requests_per_minute) items.push([`${integer(key.requests_per_minute)} requests/min`]);
  if (key.budget) items.push([`Budget ${key.budget.usd} USD per ${PERIOD_WORDS[key.budget.period] ?? key.budget.period}`]);
  if (!items.length) return h("span", { class: "muted", text: "None" });
  return h(
    "ul",
    { class: "key-limit-list" },
    items.map((parts) => h("li", {}, parts)),
  );
}
