// The Admin page (#admin): its own sign-in with the admin token (sessionStorage, apart from the API key), the
// organizations with paging and a create form, one organization's panel (its keys with their own limits: create,
// shown once, edit, rotate, revoke; credits; pause / resume), and the audit log newest first with paging. Everything goes through the admin API
// (/admin/v1) with `x-tds-client: console`, so the audit log names the console.

import { createAdminApi, randomUuid } from "./api.js";
import { $, announce, appendChildren, clear, copyText, h, setFieldError, uid } from "./dom.js";
import { integer, localTime, microusdToUsd, parseAmount, timeAgo, utcSeconds, utcTime } from "./format.js";
import { keySettingsFields, keyState, limitsList } from "./key-settings.js";
import { forgetAdminToken, loadAdminToken, saveAdminToken } from "./session.js";

const ORG_PAGE_SIZE = 20;
const AUDIT_PAGE_SIZE = 25;
export const ADMIN_DISABLED = "This gateway has no admin API enabled (set TDS_ADMIN_TOKEN on the server).";
/** The detail of the 404 for a path the gateway does not serve: every /admin path while the admin API is off. */
const NO_SUCH_ENDPOINT = "No such endpoint.";

const ACTION_LABELS = {
  "organization.created": "Organization created",
  "organization.paused": "Organization paused",
  "organization.resumed": "Organization resumed",
  "key.created": "Key created",
  "key.revoked": "Key revoked",
  "key.updated": "Key settings changed",
  "key.rotated": "Key rotated",
  "credits.granted": "Credits granted",
};

const FIELD_LABELS = {
  name: "The name",
  amount_usd: "The amount",
  note: "The note",
  expires_at: "The expiry time",
  models: "The model list",
  requests_per_minute: "The per-minute limit",
  budget: "The budget",
  "budget.usd": "The budget",
  "budget.period": "The budget period",
  grace_seconds: "The grace period",
};

/** The default grace of a rotation, in hours (the API's default, 86,400 s), and the most it may be (30 days). */
const DEFAULT_GRACE_HOURS = 24;
const MAX_GRACE_HOURS = 720;

/** "must not be empty" → "The name must not be empty."; whole sentences stay as they are. */
function fieldMessage(field, message) {
  const plain = message.replace(/^must be >= /, "must be at least ").replace(/^must be <= /, "must be at most ");
  const text = /^(must|is|has|names|cannot)\b/.test(plain)
    ? `${FIELD_LABELS[field] ?? `The field ${field}`} ${plain}`
    : plain.charAt(0).toUpperCase() + plain.slice(1);
  return /[.!?]$/.test(text) ? text : `${text}.`;
}

/** @param {{ getConfig: () => any, onSessionChange: () => void }} deps */
export function createAdmin(deps) {
  let token = loadAdminToken();
  /** The token was checked against the gateway in this page's life. */
  let verified = false;
  let checking = null;
  let visible = false;
  const api = createAdminApi(() => token);

  let orgCursors = [null];
  let orgPage = 0;
  let orgNext = null;
  /** Organization id → name, from every organization seen (for the audit log). */
  const orgNames = new Map();

  /** The organization in the detail panel (AdminOrganization JSON), or null. */
  let current = null;
  /** Its keys (AdminApiKey JSON), as last listed. */
  let keys = [];
  /** The idempotency key of the grant form's current content: kept for retries, new after a grant or an edit. */
  let grantKey = null;
  const busy = new Set();

  let auditCursors = [null];
  let auditPage = 0;
  let auditNext = null;
  let auditOrg = "";

  // ── Session ─────────────────────────────────────────────────────────────────────────────────

  function refusal(err) {
    if (err?.status === 401) return `This token was not accepted: ${err.detail}`;
    if (err?.status === 404) return ADMIN_DISABLED;
    if (err instanceof TypeError) return `The gateway could not be reached: ${err.message}`;
    return `The gateway did not answer as expected: ${err?.detail ?? err?.message ?? err}`;
  }

  /**
   * Handles the answers that end the admin session: 401 (the token no longer works) and the 404 of a gateway whose
   * admin API is off. Returns true when it signed out.
   */
  function sessionLost(err) {
    if (err?.status === 401) {
      signOut(`Signed out of admin: ${err.detail}`);
      return true;
    }
    if (err?.status === 404 && err.detail === NO_SUCH_ENDPOINT) {
      signOut(ADMIN_DISABLED);
      return true;
    }
    return false;
  }

  function showSignIn(message) {
    $("#admin-signin").hidden = false;
    $("#admin-main").hidden = true;
    $("#admin-account").hidden = true;
    document.title = "Admin sign in · Typed Decision Service";
    const error = $("#admin-signin-error");
    error.hidden = !message;
    error.textContent = message ?? "";
    if (message) $("#admin-token").setAttribute("aria-invalid", "true");
    else $("#admin-token").removeAttribute("aria-invalid");
  }

  function showMain() {
    $("#admin-signin").hidden = true;
    $("#admin-main").hidden = false;
    $("#admin-account").hidden = false;
    document.title = "Admin · Typed Decision Service";
    const mode = deps.getConfig()?.service_mode;
    $("#admin-mode").textContent =
      mode === "paid"
        ? "This gateway runs in paid mode: decision requests spend the organization's credits."
        : mode === "preview"
          ? "This gateway runs in preview mode: each organization has a daily preview quota (credits count in paid mode)."
          : "";
  }

  /** Checks a token kept from before a reload once per page life; false (and the sign-in form) when it is refused. */
  async function verify() {
    if (verified) return true;
    checking ??= api.organizations({ limit: 1 }).then(
      () => null,
      (err) => err,
    );
    const err = await checking;
    checking = null;
    if (err) {
      // A refused token (401) or no admin API (404) is dropped; after other failures it is kept for the next try.
      if (err?.status === 401 || err?.status === 404) {
        forgetAdminToken();
        token = null;
        resetData();
        deps.onSessionChange();
      }
      if (visible) showSignIn(refusal(err));
      return false;
    }
    verified = true;
    return true;
  }

  $("#admin-signin-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const input = $("#admin-token");
    const button = $("#admin-signin-button");
    if (button.getAttribute("aria-disabled") === "true") return;
    const value = input.value.trim();
    if (!value) {
      showSignIn("Enter the admin token.");
      input.focus();
      return;
    }
    button.setAttribute("aria-disabled", "true");
    token = value;
    let err = null;
    try {
      await api.organizations({ limit: 1 });
    } catch (e) {
      err = e;
    } finally {
      button.removeAttribute("aria-disabled");
    }
    if (err) {
      token = null;
      showSignIn(refusal(err));
      announce(refusal(err));
      input.focus();
      return;
    }
    saveAdminToken(value);
    verified = true;
    input.value = "";
    deps.onSessionChange();
    if (!visible) return;
    showMain();
    announce("Signed in as administrator.");
    $("#admin-title").focus();
    await loadAll();
  });

  function signOut(message) {
    forgetAdminToken();
    token = null;
    verified = false;
    resetData();
    deps.onSessionChange();
    if (visible) {
      showSignIn(message);
      $("#admin-token").focus();
    }
    announce(message ?? "Signed out of admin. The admin token was removed from this tab.");
  }

  $("#admin-sign-out").addEventListener("click", () => signOut());

  /** Removes everything the admin session showed from the page. */
  function resetData() {
    closeConfirm();
    closeKeyDialogs();
    hideKeyOnce();
    current = null;
    keys = [];
    createSettings.fill();
    grantKey = null;
    busy.clear();
    orgNames.clear();
    orgCursors = [null];
    orgPage = 0;
    orgNext = null;
    auditCursors = [null];
    auditPage = 0;
    auditNext = null;
    auditOrg = "";
    $("#org-detail").hidden = true;
    clear($("#org-detail-title"));
    clear($("#org-facts"));
    for (const id of ["#orgs-table tbody", "#keys-table tbody", "#audit-table tbody"]) clear($(id));
    for (const id of ["#orgs-info", "#orgs-page-info", "#audit-info", "#audit-page-info"]) $(id).textContent = "";
    for (const id of [
      "#orgs-error",
      "#org-error",
      "#audit-error",
      "#grant-result",
      "#orgs-empty",
      "#audit-empty",
      "#keys-empty",
      "#orgs-pager",
    ])
      $(id).hidden = true;
    for (const id of ["#org-name-input", "#key-name-input", "#grant-amount", "#grant-note", "#audit-org"]) $(id).value = "";
    setFieldError($("#org-name-input"), $("#org-name-error"), null);
    setFieldError($("#key-name-input"), $("#key-name-error"), null);
    setFieldError($("#grant-amount"), $("#grant-amount-error"), null);
    setFieldError($("#grant-note"), $("#grant-note-error"), null);
  }

  // ── Errors and busy buttons ─────────────────────────────────────────────────────────────────

  function showError(box, text, lines = []) {
    box.hidden = false;
    clear(box).append(h("p", { class: "error-title", text }));
    if (lines.length)
      box.append(
        h(
          "ul",
          {},
          lines.map((line) => h("li", { text: line })),
        ),
      );
  }

  /** `retry`: what to say about trying again when no answer came (the change may have been made). */
  function errorText(err, retry = "Refresh to see where things stand before trying again.") {
    if (err instanceof TypeError) return `No answer from the gateway (${err.message}): the change may or may not have been made. ${retry}`;
    return err?.status ? `HTTP ${err.status}: ${err.detail}` : String(err?.message ?? err);
  }

  /**
   * Shows a failed change: field errors next to their fields (`fields`: field → [input, errorEl]), the rest in `box`.
   */
  function showFailure(err, box, fields = {}, retry = undefined) {
    if (sessionLost(err)) return;
    const unplaced = [];
    let placed = 0;
    for (const e of err?.errors ?? []) {
      // An item of a list ("models[1]", "models.1") is shown at the list's field.
      const field = fields[e.field] ? e.field : e.field.replace(/(\.\d+|\[\d+\])$/, "");
      const target = fields[field];
      if (target) {
        setFieldError(target[0], target[1], err.status === 409 ? err.detail : fieldMessage(field, e.message));
        if (placed === 0) target[0].focus();
        placed++;
      } else {
        unplaced.push(`${e.field}: ${e.message}`);
      }
    }
    if (placed === 0 || unplaced.length) showError(box, errorText(err, retry), unplaced);
    announce(placed ? `Not saved: ${err.detail}` : `Failed: ${errorText(err, retry)}`);
  }

  /** Runs `work` unless the same action is already running (a double click or a second Enter). */
  async function once(name, button, work) {
    if (busy.has(name)) return;
    busy.add(name);
    button?.setAttribute("aria-disabled", "true");
    try {
      await work();
    } finally {
      busy.delete(name);
      button?.removeAttribute("aria-disabled");
    }
  }

  // ── Confirmation ────────────────────────────────────────────────────────────────────────────

  const dialog = $("#confirm-dialog");
  let resolveConfirm = null;

  /** A modal confirmation (focus starts on Cancel; Escape cancels). Resolves to true when confirmed. */
  function confirmAction({ title, text, confirm }) {
    closeConfirm();
    $("#confirm-title").textContent = title;
    $("#confirm-text").textContent = text;
    $("#confirm-ok").textContent = confirm;
    dialog.returnValue = "";
    dialog.showModal();
    $("#confirm-cancel").focus();
    return new Promise((resolve) => {
      resolveConfirm = resolve;
    });
  }

  function closeConfirm() {
    if (dialog.open) dialog.close("");
  }

  dialog.addEventListener("close", () => {
    const resolve = resolveConfirm;
    resolveConfirm = null;
    resolve?.(dialog.returnValue === "ok");
  });
  $("#confirm-ok").addEventListener("click", () => dialog.close("ok"));
  $("#confirm-cancel").addEventListener("click", () => dialog.close("cancel"));

  // ── Organizations ───────────────────────────────────────────────────────────────────────────

  function statusBadge(paused) {
    return h("span", { class: ["badge", paused ? "status-paused" : "status-active"], text: paused ? "Paused" : "Active" });
  }

  function rowButton(id) {
    return [...document.querySelectorAll("#orgs-table tbody tr")].find((tr) => tr.dataset.orgId === id)?.querySelector("button") ?? null;
  }

  async function loadOrgs() {
    const box = $("#orgs-error");
    const table = $("#orgs-table");
    table.setAttribute("aria-busy", "true");
    try {
      const result = await api.organizations({ limit: ORG_PAGE_SIZE, cursor: orgCursors[orgPage] });
      box.hidden = true;
      orgNext = result.next_cursor;
      for (const org of result.data) orgNames.set(org.id, org.name);
      renderOrgs(result.data);
    } catch (err) {
      if (!sessionLost(err)) showError(box, errorText(err));
    } finally {
      table.removeAttribute("aria-busy");
    }
  }

  function renderOrgs(orgs) {
    const body = clear($("#orgs-table tbody"));
    $("#orgs-empty").hidden = orgs.length > 0 || orgPage > 0;
    for (const org of orgs) body.append(orgRow(org));
    const count = `${integer(orgs.length)} organization${orgs.length === 1 ? "" : "s"}`;
    const paged = orgPage > 0 || orgNext !== null;
    $("#orgs-info").textContent = paged ? `Page ${orgPage + 1} · ${count}` : count;
    $("#orgs-page-info").textContent = `Page ${orgPage + 1}`;
    $("#orgs-pager").hidden = !paged;
    $("#orgs-prev").disabled = orgPage === 0;
    $("#orgs-next").disabled = !orgNext;
  }

  function orgRow(org) {
    const selected = current?.id === org.id;
    const b = org.balance;
    return h(
      "tr",
      { dataset: { orgId: org.id }, class: selected ? "is-selected" : null },
      h("th", { scope: "row", class: "org-name", text: org.name }),
      h("td", {}, h("code", { text: org.id })),
      h("td", {}, statusBadge(org.paused)),
      h(
        "td",
        { class: "num" },
        `${b.available_usd} USD`,
        b.reserved_microusd > 0 ? h("span", { class: "cell-sub", text: `${b.reserved_usd} USD reserved` }) : null,
      ),
      h("td", { class: "num" }, `${integer(org.preview.used)} of ${integer(org.preview.limit)}`),
      h(
        "td",
        { class: "num" },
        integer(org.keys.active),
        org.keys.revoked > 0 ? h("span", { class: "cell-sub", text: `${integer(org.keys.revoked)} revoked` }) : null,
      ),
      h(
        "td",
        { class: "row-actions" },
        h("button", {
          type: "button",
          class: "btn btn-small",
          text: "Manage",
          "aria-label": `Manage ${org.name}`,
          "aria-controls": "org-detail",
          "aria-expanded": selected ? "true" : "false",
          onclick: () => openOrg(org),
        }),
      ),
    );
  }

  function markSelected() {
    for (const tr of document.querySelectorAll("#orgs-table tbody tr")) {
      const selected = current !== null && tr.dataset.orgId === current.id;
      tr.classList.toggle("is-selected", selected);
      tr.querySelector("button")?.setAttribute("aria-expanded", selected ? "true" : "false");
    }
  }

  $("#orgs-next").addEventListener("click", () => {
    if (!orgNext) return;
    hideKeyOnce();
    orgCursors[orgPage + 1] = orgNext;
    orgPage += 1;
    void loadOrgs().then(() => announce($("#orgs-info").textContent));
  });
  $("#orgs-prev").addEventListener("click", () => {
    if (orgPage === 0) return;
    hideKeyOnce();
    orgPage -= 1;
    void loadOrgs().then(() => announce($("#orgs-info").textContent));
  });

  $("#org-name-input").addEventListener("input", () => setFieldError($("#org-name-input"), $("#org-name-error"), null));

  $("#org-create-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = $("#org-name-input");
    const errorEl = $("#org-name-error");
    const box = $("#orgs-error");
    void once("create-org", $("#org-create-button"), async () => {
      hideKeyOnce();
      box.hidden = true;
      const name = input.value.trim();
      if (!name) {
        setFieldError(input, errorEl, "Enter a name for the organization.");
        input.focus();
        return;
      }
      setFieldError(input, errorEl, null);
      let org;
      try {
        org = await api.createOrganization(name);
      } catch (err) {
        showFailure(err, box, { name: [input, errorEl] });
        return;
      }
      input.value = "";
      orgNames.set(org.id, org.name);
      announce(`Organization ${org.name} created. Its panel is open: create a key or grant credits.`);
      openOrg(org);
      await Promise.all([loadOrgs(), reloadAudit()]);
    });
  });

  // ── One organization ────────────────────────────────────────────────────────────────────────

  function openOrg(org) {
    closeKeyDialogs();
    hideKeyOnce();
    current = org;
    keys = [];
    grantKey = null;
    createSettings.fill();
    createSettings.refreshHints();
    createSettings.setKnownModels(knownModels());
    $("#org-error").hidden = true;
    $("#grant-result").hidden = true;
    for (const id of ["#key-name-input", "#grant-amount", "#grant-note"]) $(id).value = "";
    setFieldError($("#key-name-input"), $("#key-name-error"), null);
    setFieldError($("#grant-amount"), $("#grant-amount-error"), null);
    setFieldError($("#grant-note"), $("#grant-note-error"), null);
    clear($("#keys-table tbody"));
    $("#keys-empty").hidden = true;
    renderDetail();
    $("#org-detail").hidden = false;
    markSelected();
    $("#org-detail-title").focus();
    void loadKeys();
  }

  function closeOrg() {
    const id = current?.id;
    closeKeyDialogs();
    hideKeyOnce();
    current = null;
    grantKey = null;
    $("#org-detail").hidden = true;
    markSelected();
    const back = id ? rowButton(id) : null;
    (back ?? $("#orgs-title")).focus();
  }

  $("#org-close").addEventListener("click", () => closeOrg());
  $("#org-detail").addEventListener("keydown", (event) => {
    if (event.key === "Escape" && !dialog.open) closeOrg();
  });

  function fact(label, ...value) {
    return h("div", { class: "meta-item" }, h("dt", { text: label }), h("dd", {}, ...value));
  }

  function renderDetail() {
    const org = current;
    const b = org.balance;
    appendChildren(
      clear($("#org-detail-title")),
      h("span", { class: "visually-hidden", text: "Organization " }),
      org.name,
      " ",
      statusBadge(org.paused),
    );
    const created = new Date(org.created_at);
    appendChildren(
      clear($("#org-facts")),
      fact("Id", h("code", { text: org.id })),
      fact("Created", h("time", { datetime: org.created_at, title: utcSeconds(created), text: localTime(created) })),
      fact("Credits available", `${b.available_usd} USD`),
      fact("Reserved", `${b.reserved_usd} USD`),
      fact("Spent", `${b.spent_usd} USD`),
      fact("Granted in total", `${b.granted_usd} USD`),
      fact(
        "Preview today",
        `${integer(org.preview.used)} of ${integer(org.preview.limit)}`,
        h("span", { class: "cell-sub", text: `UTC day ${org.preview.date}` }),
      ),
      fact("API keys", `${integer(org.keys.active)} active · ${integer(org.keys.revoked)} revoked`),
    );
    const pause = $("#org-pause");
    pause.textContent = org.paused ? "Resume" : "Pause";
    pause.setAttribute("aria-label", `${org.paused ? "Resume" : "Pause"} ${org.name}`);
    pause.classList.toggle("btn-danger-quiet", !org.paused);
  }

  /** Reads the organization in the panel again (after a change) and redraws the panel. */
  async function refreshCurrent() {
    if (!current) return;
    const id = current.id;
    try {
      const org = await api.organization(id);
      if (current?.id !== id) return;
      current = org;
      orgNames.set(org.id, org.name);
      renderDetail();
    } catch (err) {
      if (!sessionLost(err)) showError($("#org-error"), errorText(err));
    }
  }

  // The key list's columns for its last use and its own limits, after "Created".
  const createdHead = [...$("#keys-table thead tr").children].find((th) => th.textContent === "Created");
  createdHead?.after(h("th", { scope: "col", text: "Last used" }), h("th", { scope: "col", text: "Limits" }));

  async function loadKeys() {
    if (!current) return;
    const id = current.id;
    const table = $("#keys-table");
    table.setAttribute("aria-busy", "true");
    try {
      const { data } = await api.keys(id);
      if (current?.id !== id) return;
      keys = data;
      renderKeys(data);
      createSettings.setKnownModels(knownModels());
    } catch (err) {
      if (!sessionLost(err)) showError($("#org-error"), errorText(err));
    } finally {
      table.removeAttribute("aria-busy");
    }
  }

  /**
   * The model names the forms offer as checkboxes: the gateway's default model and the priced ones (GET /api/config)
   * and those named by the organization's keys. The admin API lists no models, so others are typed in.
   */
  function knownModels() {
    const config = deps.getConfig();
    const names = new Set(keys.flatMap((key) => key.models ?? []));
    if (config?.default_model) names.add(config.default_model);
    for (const m of config?.pricing?.models ?? []) names.add(m.name);
    return [...names];
  }

  const keyLabel = (key) => `key ${key.id}${key.name ? ` (${key.name})` : ""}`;

  const timeEl = (iso, className = null) => {
    const date = new Date(iso);
    return h("time", { class: className, datetime: iso, title: utcSeconds(date), text: localTime(date) });
  };

  function keyStatus(key, state, replaces) {
    const badge = (className, text) => h("span", { class: ["badge", className], text });
    const sub = (...parts) => h("span", { class: "cell-sub" }, ...parts);
    const ref = (id) => h("span", { class: "key-ref", text: id });
    switch (state) {
      case "revoked":
        return [badge("status-revoked", "Revoked"), " ", timeEl(key.revoked_at, "cell-sub-inline")];
      case "retired":
        return [
          badge("status-revoked", "Retired"),
          " ",
          timeEl(key.retires_at, "cell-sub-inline"),
          sub("Replaced by ", ref(key.replaced_by)),
        ];
      case "expired":
        return [badge("status-expired", "Expired"), key.replaced_by ? sub("Replaced by ", ref(key.replaced_by)) : null];
      case "rotated":
        return [badge("status-rotated", "Rotated"), sub("Replaced by ", ref(key.replaced_by)), sub("Works until ", timeEl(key.retires_at))];
      default:
        return [badge("status-active", "Active"), replaces ? sub("Replaces ", ref(replaces)) : null];
    }
  }

  function keyActions(key, state) {
    const button = (text, label, onclick, className = "btn btn-small") =>
      h("button", { type: "button", class: className, text, "aria-label": `${label} ${keyLabel(key)}`, onclick });
    const actions = [];
    // An expired key may be given a later expiry, not rotated; a rotated key is changed through the key replacing it.
    if ((state === "active" || state === "expired") && !key.replaced_by)
      actions.push(button("Edit", "Edit the settings of", (event) => openEdit(key, event.currentTarget)));
    if (state === "active") actions.push(button("Rotate", "Rotate", (event) => openRotate(key, event.currentTarget)));
    // A rotated key can be revoked before its grace ends; a retired one is refused already.
    if (state !== "revoked" && state !== "retired")
      actions.push(button("Revoke", "Revoke", (event) => void revokeKey(key, event.currentTarget), "btn btn-small btn-danger-quiet"));
    return actions.length ? h("div", { class: "key-actions" }, actions) : null;
  }

  function renderKeys(list) {
    const body = clear($("#keys-table tbody"));
    $("#keys-empty").hidden = list.length > 0;
    const now = Date.now();
    const replacing = new Map(list.filter((key) => key.replaced_by).map((key) => [key.replaced_by, key.id]));
    for (const key of list) {
      const state = keyState(key, now);
      const lastUsed = key.last_used_at ? new Date(key.last_used_at) : null;
      body.append(
        h(
          "tr",
          { dataset: { keyId: key.id, state }, class: state === "revoked" || state === "retired" ? "is-revoked" : null },
          h("th", { scope: "row" }, h("code", { text: key.id })),
          h("td", key.name === null ? { class: "muted", text: "–" } : { text: key.name }),
          h("td", {}, timeEl(key.created_at)),
          h(
            "td",
            { class: "key-last-used" },
            lastUsed
              ? h("time", {
                  datetime: key.last_used_at,
                  title: `${localTime(lastUsed)} (${utcSeconds(lastUsed)})`,
                  text: timeAgo(lastUsed, now),
                })
              : h("span", { class: "muted", text: "Never" }),
          ),
          h("td", { class: "key-limits-cell" }, limitsList(key, now)),
          h("td", { class: "key-status" }, keyStatus(key, state, replacing.get(key.id))),
          h("td", { class: "row-actions" }, keyActions(key, state)),
        ),
      );
    }
  }

  /** The button of a key's row after the list was drawn again (the focus goes back to it). */
  function keyButton(keyId, text) {
    const row = [...document.querySelectorAll("#keys-table tbody tr")].find((tr) => tr.dataset.keyId === keyId);
    return [...(row?.querySelectorAll("button") ?? [])].find((b) => b.textContent === text) ?? null;
  }

  // ── Key dialogs: edit settings, rotate ──────────────────────────────────────────────────────

  /** A modal form dialog (Escape or Cancel closes it; the focus goes back to the button that opened it). */
  function formDialog({ name, submit, intro }) {
    const titleEl = h("h2", { id: uid(`${name}-title`), tabindex: "-1" });
    const introEl = h("p", { id: uid(`${name}-intro`), class: "hint", text: intro });
    const errorBox = h("div", { class: "error-box", role: "alert", hidden: true });
    const body = h("div", { class: "key-dialog-body" });
    const cancel = h("button", { type: "button", class: "btn", text: "Cancel" });
    const ok = h("button", { type: "submit", class: "btn btn-primary", text: submit });
    const form = h("form", { novalidate: true }, titleEl, introEl, errorBox, body, h("div", { class: "confirm-actions" }, cancel, ok));
    const el = h("dialog", { class: "confirm-dialog key-dialog", "aria-labelledby": titleEl.id, "aria-describedby": introEl.id }, form);
    document.body.append(el);
    let opener = null;
    cancel.addEventListener("click", () => el.close());
    el.addEventListener("close", () => {
      const back = opener;
      opener = null;
      if (back?.isConnected) back.focus();
      else if (back && current) $("#keys-title").focus();
    });
    return {
      el,
      form,
      body,
      errorBox,
      ok,
      titleEl,
      open(title, button) {
        titleEl.textContent = title;
        errorBox.hidden = true;
        opener = button;
        el.showModal();
      },
      /** Closes it after a change: the caller moves the focus. */
      done() {
        opener = null;
        el.close();
      },
      close() {
        if (el.open) el.close();
      },
    };
  }

  const editDialog = formDialog({
    name: "key-edit",
    submit: "Save settings",
    intro:
      "Empty a field to remove that limit (the organization's own limits still apply). Changes apply at once (on other instances of the gateway within TDS_KEY_CACHE_MS, when the operator set it).",
  });
  const editName = h("input", { id: uid("key-edit-name"), type: "text", autocomplete: "off", spellcheck: "false", maxlength: "200" });
  const editNameError = h("p", { id: uid("key-edit-name-error"), class: "field-error", hidden: true });
  const editSettings = keySettingsFields({ prefix: "key-edit", rpmHint });
  editDialog.body.append(
    h("div", { class: "field" }, h("label", { for: editName.id, text: "Name" }), editName, editNameError),
    editSettings.element,
  );
  editName.addEventListener("input", () => setFieldError(editName, editNameError, null));
  /** The key in the edit dialog. */
  let editing = null;

  function openEdit(key, button) {
    hideKeyOnce();
    editing = key;
    editName.value = key.name ?? "";
    setFieldError(editName, editNameError, null);
    editSettings.refreshHints();
    editSettings.setKnownModels(knownModels());
    editSettings.fill(key);
    editDialog.open(`Settings of key ${key.id}`, button);
    editName.focus();
  }

  editDialog.form.addEventListener("submit", (event) => {
    event.preventDefault();
    const key = editing;
    if (!key) return;
    void once(`edit:${key.id}`, editDialog.ok, async () => {
      editDialog.errorBox.hidden = true;
      setFieldError(editName, editNameError, null);
      const read = editSettings.values(key);
      if (read.problems) {
        editSettings.showProblems(read.problems);
        return;
      }
      const changes = { ...read.body };
      const name = editName.value.trim() || null;
      if (name !== key.name) changes.name = name;
      if (Object.keys(changes).length === 0) {
        showError(editDialog.errorBox, "Nothing to save: no setting was changed.");
        announce("Nothing to save: no setting was changed.");
        return;
      }
      try {
        await api.updateKey(key.id, changes);
      } catch (err) {
        showFailure(err, editDialog.errorBox, { name: [editName, editNameError], ...editSettings.fields });
        return;
      }
      editing = null;
      editDialog.done();
      await Promise.all([loadKeys(), reloadAudit()]);
      (keyButton(key.id, "Edit") ?? $("#keys-title")).focus();
      announce(`Settings of key ${key.id} saved: ${changedText(changes)}.`);
    });
  });

  /** "expiry removed, per-minute limit set": what an update changed, for the announcement. */
  function changedText(changes) {
    const words = {
      name: "name",
      expires_at: "expiry",
      models: "models",
      requests_per_minute: "per-minute limit",
      budget: "budget",
    };
    return Object.entries(changes)
      .map(([field, value]) => `${words[field] ?? field} ${value === null ? "removed" : "set"}`)
      .join(", ");
  }

  const rotateDialog = formDialog({
    name: "key-rotate",
    submit: "Rotate key",
    intro:
      "A new key with the same name and settings is created and shown once. The old key keeps working during the grace period, then gets 401.",
  });
  const graceInput = h("input", { id: uid("key-rotate-grace"), type: "text", inputmode: "decimal", autocomplete: "off" });
  const graceHint = h("p", {
    id: uid("key-rotate-grace-hint"),
    class: "hint",
    text: `0 to ${MAX_GRACE_HOURS} (30 days); 0 refuses the old key at once.`,
  });
  const graceError = h("p", { id: uid("key-rotate-grace-error"), class: "field-error", hidden: true });
  graceInput.setAttribute("aria-describedby", graceHint.id);
  rotateDialog.body.append(
    h("div", { class: "field" }, h("label", { for: graceInput.id, text: "Grace period (hours)" }), graceInput, graceHint, graceError),
  );
  graceInput.addEventListener("input", () => setFieldError(graceInput, graceError, null));
  let rotating = null;

  function openRotate(key, button) {
    hideKeyOnce();
    rotating = key;
    graceInput.value = String(DEFAULT_GRACE_HOURS);
    setFieldError(graceInput, graceError, null);
    rotateDialog.open(`Rotate key ${key.id}?`, button);
    graceInput.focus();
    graceInput.select();
  }

  /** Hours as typed → whole seconds, or the problem. */
  function graceSeconds(text) {
    const value = text.trim().replace(/\s*h(ours?)?$/i, "");
    if (!/^\d+(\.\d+)?$/.test(value)) return { problem: "Enter the grace period in hours, such as 24 (0 refuses the old key at once)." };
    const hours = Number(value);
    if (hours > MAX_GRACE_HOURS) return { problem: `The grace period can be at most ${MAX_GRACE_HOURS} hours (30 days).` };
    return { seconds: Math.round(hours * 3600) };
  }

  rotateDialog.form.addEventListener("submit", (event) => {
    event.preventDefault();
    const key = rotating;
    if (!key || !current) return;
    void once(`rotate:${key.id}`, rotateDialog.ok, async () => {
      rotateDialog.errorBox.hidden = true;
      const grace = graceSeconds(graceInput.value);
      if ("problem" in grace) {
        setFieldError(graceInput, graceError, grace.problem);
        graceInput.focus();
        return;
      }
      setFieldError(graceInput, graceError, null);
      const org = current;
      let rotated;
      try {
        rotated = await api.rotateKey(key.id, grace.seconds);
      } catch (err) {
        showFailure(err, rotateDialog.errorBox, { grace_seconds: [graceInput, graceError] });
        return;
      }
      rotating = null;
      rotateDialog.done();
      if (current?.id !== org.id) return;
      showKeyOnce(rotated, key);
      $("#key-once-copy").focus();
      const retires = new Date(rotated.old_key_retires_at);
      announce(
        `Key ${key.id} rotated: new key ${rotated.id}. Copy it now: it is shown only this once. The old key works until ${localTime(retires)}.`,
      );
      await Promise.all([loadKeys(), refreshCurrent(), loadOrgs(), reloadAudit()]);
    });
  });

  function closeKeyDialogs() {
    editing = null;
    rotating = null;
    editDialog.close();
    rotateDialog.close();
  }

  async function revokeKey(key, button) {
    if (!current) return;
    hideKeyOnce();
    const ok = await confirmAction({
      title: `Revoke key ${key.id}?`,
      text: `Requests with this key${key.name ? ` (${key.name})` : ""} of ${current.name} get 401 from now on (on other instances of the gateway within TDS_KEY_CACHE_MS, when the operator set it). This cannot be undone.`,
      confirm: "Revoke key",
    });
    if (!ok) {
      button.focus();
      announce("Nothing was revoked.");
      return;
    }
    await once(`revoke:${key.id}`, button, async () => {
      $("#org-error").hidden = true;
      try {
        await api.revokeKey(key.id);
      } catch (err) {
        showFailure(err, $("#org-error"));
        return;
      }
      await Promise.all([loadKeys(), refreshCurrent(), loadOrgs(), reloadAudit()]);
      $("#keys-title").focus();
      announce(`Key ${key.id} revoked: its requests now get 401.`);
    });
  }

  $("#org-pause").addEventListener("click", (event) => {
    const button = event.currentTarget;
    if (!current || busy.has("pause")) return;
    void (async () => {
      hideKeyOnce();
      const org = current;
      const pausing = !org.paused;
      if (pausing) {
        const ok = await confirmAction({
          title: `Pause ${org.name}?`,
          text: "Its decision requests get 403 (paused pending billing review) until it is resumed. Its keys, credits and usage stay as they are, and usage can still be read.",
          confirm: "Pause organization",
        });
        if (!ok) {
          button.focus();
          announce("Not paused.");
          return;
        }
      }
      await once("pause", button, async () => {
        $("#org-error").hidden = true;
        let updated;
        try {
          updated = await api.setPaused(org.id, pausing);
        } catch (err) {
          showFailure(err, $("#org-error"));
          return;
        }
        if (current?.id === org.id) {
          current = updated;
          renderDetail();
        }
        button.focus();
        announce(
          pausing
            ? `${org.name} is paused: its decision requests get 403.`
            : `${org.name} is resumed: its decision requests are served again.`,
        );
        await Promise.all([loadOrgs(), reloadAudit()]);
      });
    })();
  });

  $("#org-audit").addEventListener("click", () => {
    if (!current) return;
    $("#audit-org").value = current.id;
    auditOrg = current.id;
    auditCursors = [null];
    auditPage = 0;
    void loadAudit().then(() => {
      $("#audit-title").focus();
      announce(`Audit log of ${current?.name ?? "the organization"}: ${$("#audit-info").textContent}.`);
    });
  });

  // ── The new key, shown once ─────────────────────────────────────────────────────────────────

  /** Under the note of the box, after a rotation: which key the new one replaces and until when that one works. */
  const rotatedNote = h("p", { class: "key-once-rotated", hidden: true });
  $(".key-once-note", $("#key-once")).after(rotatedNote);

  /** Shows a created or rotated key (`replaced`: the key it replaces) until the next action. */
  function showKeyOnce(created, replaced = null) {
    $("#key-once-value").textContent = created.key;
    $("#key-once-status").textContent = "";
    clear(rotatedNote).hidden = !replaced;
    if (replaced) {
      const retires = new Date(created.old_key_retires_at);
      appendChildren(
        rotatedNote,
        `It replaces ${keyLabel(replaced)}, with the same settings. The old key works until `,
        h("time", { datetime: created.old_key_retires_at, text: `${localTime(retires)} (${utcSeconds(retires)})` }),
        ", then gets 401: put the new key in its place before then.",
      );
    }
    $("#key-once").hidden = false;
  }

  /** Hides the new key and removes it from the page: after closing the panel or any other action. */
  function hideKeyOnce() {
    const box = $("#key-once");
    if (box.hidden) return;
    const hadFocus = box.contains(document.activeElement);
    box.hidden = true;
    $("#key-once-value").textContent = "";
    $("#key-once-status").textContent = "";
    clear(rotatedNote).hidden = true;
    if (hadFocus && current) $("#keys-title").focus();
  }

  $("#key-once-copy").addEventListener("click", async () => {
    const value = $("#key-once-value");
    const ok = await copyText(value.textContent, value);
    $("#key-once-status").textContent = ok ? "Copied" : "Selected: press Ctrl+C";
    announce(ok ? "The API key was copied to the clipboard." : "Copy failed; the key is selected: press Ctrl+C.");
  });

  $("#key-name-input").addEventListener("input", () => setFieldError($("#key-name-input"), $("#key-name-error"), null));

  function rpmHint() {
    const limit = deps.getConfig()?.limits?.requests_per_minute;
    return `Within the organization's limit${typeof limit === "number" ? ` of ${integer(limit)} a minute` : ""}. Empty: none of its own.`;
  }

  const createSettings = keySettingsFields({ prefix: "key-create", rpmHint });
  const limitsLegend = h("legend", { text: "Limits of its own (optional)" });
  $("#key-create-button").before(h("fieldset", { class: "key-limits" }, limitsLegend, createSettings.element));

  $("#key-create-form").addEventListener("submit", (event) => {
    event.preventDefault();
    if (!current) return;
    const input = $("#key-name-input");
    const errorEl = $("#key-name-error");
    void once("create-key", $("#key-create-button"), async () => {
      hideKeyOnce();
      $("#org-error").hidden = true;
      setFieldError(input, errorEl, null);
      const read = createSettings.values();
      if (read.problems) {
        createSettings.showProblems(read.problems);
        return;
      }
      createSettings.clearErrors();
      const org = current;
      const name = input.value.trim();
      let created;
      try {
        created = await api.createKey(org.id, { ...(name ? { name } : {}), ...read.body });
      } catch (err) {
        showFailure(err, $("#org-error"), { name: [input, errorEl], ...createSettings.fields });
        return;
      }
      input.value = "";
      createSettings.fill();
      if (current?.id !== org.id) return;
      showKeyOnce(created);
      $("#key-once-copy").focus();
      announce(`API key ${created.id} created for ${org.name}. Copy it now: it is shown only this once.`);
      await Promise.all([loadKeys(), refreshCurrent(), loadOrgs(), reloadAudit()]);
    });
  });

  // ── Credits ─────────────────────────────────────────────────────────────────────────────────

  for (const id of ["#grant-amount", "#grant-note"]) {
    $(id).addEventListener("input", () => {
      // Different content is a different grant: it gets its own idempotency key.
      grantKey = null;
      setFieldError($(id), $(`${id}-error`), null);
    });
  }

  $("#grant-form").addEventListener("submit", (event) => {
    event.preventDefault();
    if (!current) return;
    const amountInput = $("#grant-amount");
    const noteInput = $("#grant-note");
    void once("grant", $("#grant-button"), async () => {
      hideKeyOnce();
      $("#org-error").hidden = true;
      $("#grant-result").hidden = true;
      const parsed = parseAmount(amountInput.value);
      if ("problem" in parsed) {
        setFieldError(amountInput, $("#grant-amount-error"), parsed.problem);
        amountInput.focus();
        return;
      }
      setFieldError(amountInput, $("#grant-amount-error"), null);
      setFieldError(noteInput, $("#grant-note-error"), null);
      const note = noteInput.value.trim();
      const org = current;
      // One key per submitted content: a double submit or a retry after a lost answer is applied once.
      grantKey ??= randomUuid();
      let result;
      try {
        result = await api.grantCredits(org.id, { amount_usd: parsed.amount, ...(note ? { note } : {}) }, grantKey);
      } catch (err) {
        showFailure(
          err,
          $("#org-error"),
          { amount_usd: [amountInput, $("#grant-amount-error")], note: [noteInput, $("#grant-note-error")] },
          "Grant again with the same amount and note: it is applied only once.",
        );
        return;
      }
      grantKey = null;
      amountInput.value = "";
      noteInput.value = "";
      const { balance, replayed } = result;
      const text = replayed
        ? `This grant had already been applied; nothing was granted again. Available now: ${balance.available_usd} USD.`
        : `Granted ${parsed.amount} USD to ${org.name}. Available now: ${balance.available_usd} USD (${balance.reserved_usd} USD reserved, ${balance.granted_usd} USD granted in total).`;
      const out = $("#grant-result");
      out.textContent = text;
      out.hidden = false;
      if (current?.id === org.id) {
        current = { ...current, balance };
        renderDetail();
      }
      announce(text);
      await Promise.all([loadOrgs(), reloadAudit()]);
    });
  });

  // ── Audit log ───────────────────────────────────────────────────────────────────────────────

  /** A key setting's audit detail, as words: what a null (cleared) value is called. */
  const CLEARED_WORDS = {
    name: "name",
    expires_at: "expiry",
    models: "model list",
    requests_per_minute: "per-minute limit",
    budget_microusd: "budget",
  };

  function modelList(value) {
    try {
      const list = JSON.parse(String(value));
      return Array.isArray(list) ? list.join(", ") : String(value);
    } catch {
      return String(value);
    }
  }

  function detailsText(entry) {
    const details = entry.details ?? {};
    const parts = [];
    for (const [name, value] of Object.entries(details)) {
      if (name === "budget_period") continue;
      if (value === null || value === "") {
        // In a settings change, null is a setting removed.
        if (entry.action === "key.updated" && CLEARED_WORDS[name]) parts.push(`${CLEARED_WORDS[name]} removed`);
        continue;
      }
      if (name === "amount_microusd" && typeof value === "number") parts.push(`${microusdToUsd(value)} USD`);
      else if (name === "note") parts.push(`note “${value}”`);
      else if (name === "name") parts.push(`name “${value}”`);
      else if (name === "expires_at") parts.push(`expires ${utcTime(new Date(String(value)))}`);
      else if (name === "models") parts.push(`models ${modelList(value)}`);
      else if (name === "requests_per_minute" && typeof value === "number") parts.push(`${integer(value)} requests/min`);
      else if (name === "budget_microusd" && typeof value === "number")
        parts.push(`budget ${microusdToUsd(value)} USD${details.budget_period ? ` per UTC ${details.budget_period}` : ""}`);
      else if (name === "new_key_id") parts.push(`new key ${value}`);
      else if (name === "rotated_from") parts.push(`replaces key ${value}`);
      else if (name === "retires_at") parts.push(`old key works until ${utcTime(new Date(String(value)))}`);
      else parts.push(`${name.replace(/_/g, " ")}: ${value}`);
    }
    return parts.length ? parts.join(" · ") : "–";
  }

  function auditRow(e) {
    const at = new Date(e.at);
    const orgName = orgNames.get(e.org_id);
    return h(
      "tr",
      { dataset: { action: e.action } },
      h("td", {}, h("time", { datetime: e.at, text: localTime(at) }), h("span", { class: "cell-sub", text: utcSeconds(at) })),
      h("td", {}, h("span", { class: ["badge", `action-${e.action.replace(".", "-")}`], text: ACTION_LABELS[e.action] ?? e.action })),
      h("td", {}, orgName ?? h("code", { text: e.org_id }), orgName ? h("code", { class: "cell-sub", text: e.org_id }) : null),
      h("td", {}, e.target === e.org_id ? h("span", { class: "muted", text: "the organization" }) : h("code", { text: e.target })),
      h(
        "td",
        { class: "audit-source" },
        e.source,
        e.client ? [" · ", h("strong", { text: e.client })] : null,
        e.remote_address ? h("span", { class: "cell-sub", text: e.remote_address }) : null,
      ),
      h("td", { class: "audit-details", text: detailsText(e) }),
    );
  }

  async function loadAudit() {
    const box = $("#audit-error");
    const table = $("#audit-table");
    table.setAttribute("aria-busy", "true");
    try {
      const result = await api.audit({ limit: AUDIT_PAGE_SIZE, cursor: auditCursors[auditPage], org: auditOrg });
      box.hidden = true;
      auditNext = result.next_cursor;
      const body = clear($("#audit-table tbody"));
      for (const e of result.data) body.append(auditRow(e));
      $("#audit-empty").hidden = result.data.length > 0;
      const count = `${integer(result.data.length)} entr${result.data.length === 1 ? "y" : "ies"}`;
      $("#audit-info").textContent = `${auditOrg ? `${orgNames.get(auditOrg) ?? auditOrg} · ` : ""}Page ${auditPage + 1} · ${count}`;
      $("#audit-page-info").textContent = `Page ${auditPage + 1}`;
      $("#audit-newer").disabled = auditPage === 0;
      $("#audit-older").disabled = !auditNext;
    } catch (err) {
      if (sessionLost(err)) return;
      clear($("#audit-table tbody"));
      $("#audit-empty").hidden = true;
      showError(box, err?.status === 404 ? err.detail : errorText(err));
      $("#audit-info").textContent = "";
    } finally {
      table.removeAttribute("aria-busy");
    }
  }

  /** Back to the newest entries (after a change). */
  async function reloadAudit() {
    auditCursors = [null];
    auditPage = 0;
    await loadAudit();
  }

  $("#audit-filter").addEventListener("submit", (event) => {
    event.preventDefault();
    auditOrg = $("#audit-org").value.trim();
    void reloadAudit().then(() => announce(`Audit log: ${$("#audit-info").textContent || "not found"}.`));
  });
  $("#audit-filter").addEventListener("reset", () => {
    auditOrg = "";
    setTimeout(() => void reloadAudit().then(() => announce(`Audit log of all organizations: ${$("#audit-info").textContent}.`)), 0);
  });
  $("#audit-older").addEventListener("click", () => {
    if (!auditNext) return;
    auditCursors[auditPage + 1] = auditNext;
    auditPage += 1;
    void loadAudit().then(() => announce($("#audit-info").textContent));
  });
  $("#audit-newer").addEventListener("click", () => {
    if (auditPage === 0) return;
    auditPage -= 1;
    void loadAudit().then(() => announce($("#audit-info").textContent));
  });

  // ── Page ────────────────────────────────────────────────────────────────────────────────────

  async function loadAll() {
    await Promise.all([loadOrgs(), loadAudit(), current ? refreshCurrent() : null, current ? loadKeys() : null]);
  }

  $("#admin-refresh").addEventListener("click", () => {
    hideKeyOnce();
    void loadAll().then(() => announce("Admin data refreshed."));
  });

  return {
    /** The admin token is kept in this tab (checked or not yet). */
    signedIn: () => token !== null,
    /** Shows the Admin page: the sign-in form, or (after checking a kept token) the organizations and the audit log. */
    async show(focusHeading) {
      visible = true;
      if (!token) {
        showSignIn();
        if (focusHeading) $("#admin-signin-title").focus();
        return;
      }
      if (!verified) {
        $("#admin-signin").hidden = true;
        $("#admin-main").hidden = true;
        if (!(await verify())) {
          if (focusHeading && visible) $("#admin-signin-title").focus();
          return;
        }
        if (!visible) return;
      }
      showMain();
      if (focusHeading) $("#admin-title").focus();
      await loadAll();
    },
    /** Leaving the Admin page: the one-time key and any open confirmation go away. */
    hide() {
      visible = false;
      closeConfirm();
      closeKeyDialogs();
      hideKeyOnce();
      $("#admin-account").hidden = true;
    },
  };
}
