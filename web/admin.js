// The Admin page (#admin): its own sign-in with the admin token (sessionStorage, apart from the API key), the
// organizations with paging and a create form, one organization's panel (its keys: create, shown once, revoke;
// credits; pause / resume), and the audit log newest first with paging. Everything goes through the admin API
// (/admin/v1) with `x-tds-client: console`, so the audit log names the console.

import { createAdminApi, randomUuid } from "./api.js";
import { $, announce, appendChildren, clear, copyText, h } from "./dom.js";
import { integer, localTime, microusdToUsd, parseAmount, utcSeconds } from "./format.js";
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
  "credits.granted": "Credits granted",
};

const FIELD_LABELS = { name: "The name", amount_usd: "The amount", note: "The note" };

/** "must not be empty" → "The name must not be empty."; whole sentences stay as they are. */
function fieldMessage(field, message) {
  const text = /^[a-z]/.test(message) ? `${FIELD_LABELS[field] ?? `The field ${field}`} ${message}` : message;
  return /[.!?]$/.test(text) ? text : `${text}.`;
}

/** Shows `message` under a field (or clears it), marking the field invalid and pointing aria-describedby at it. */
function setFieldError(input, errorEl, message) {
  errorEl.hidden = !message;
  errorEl.textContent = message ?? "";
  const ids = (input.getAttribute("aria-describedby") ?? "").split(" ").filter((id) => id && id !== errorEl.id);
  if (message) {
    input.setAttribute("aria-invalid", "true");
    ids.push(errorEl.id);
  } else {
    input.removeAttribute("aria-invalid");
  }
  if (ids.length) input.setAttribute("aria-describedby", ids.join(" "));
  else input.removeAttribute("aria-describedby");
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
    hideKeyOnce();
    current = null;
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
      const target = fields[e.field];
      if (target) {
        setFieldError(target[0], target[1], err.status === 409 ? err.detail : fieldMessage(e.field, e.message));
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
    hideKeyOnce();
    current = org;
    grantKey = null;
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

  async function loadKeys() {
    if (!current) return;
    const id = current.id;
    const table = $("#keys-table");
    table.setAttribute("aria-busy", "true");
    try {
      const { data } = await api.keys(id);
      if (current?.id !== id) return;
      renderKeys(data);
    } catch (err) {
      if (!sessionLost(err)) showError($("#org-error"), errorText(err));
    } finally {
      table.removeAttribute("aria-busy");
    }
  }

  function renderKeys(keys) {
    const body = clear($("#keys-table tbody"));
    $("#keys-empty").hidden = keys.length > 0;
    for (const key of keys) {
      const created = new Date(key.created_at);
      const revoked = key.revoked_at ? new Date(key.revoked_at) : null;
      body.append(
        h(
          "tr",
          { dataset: { keyId: key.id }, class: revoked ? "is-revoked" : null },
          h("th", { scope: "row" }, h("code", { text: key.id })),
          h("td", key.name === null ? { class: "muted", text: "–" } : { text: key.name }),
          h("td", {}, h("time", { datetime: key.created_at, title: utcSeconds(created), text: localTime(created) })),
          h(
            "td",
            {},
            revoked
              ? [
                  h("span", { class: "badge status-revoked", text: "Revoked" }),
                  " ",
                  h("time", { class: "cell-sub-inline", datetime: key.revoked_at, title: utcSeconds(revoked), text: localTime(revoked) }),
                ]
              : h("span", { class: "badge status-active", text: "Active" }),
          ),
          h(
            "td",
            { class: "row-actions" },
            revoked
              ? null
              : h("button", {
                  type: "button",
                  class: "btn btn-small btn-danger-quiet",
                  text: "Revoke",
                  "aria-label": `Revoke key ${key.id}${key.name ? ` (${key.name})` : ""}`,
                  onclick: (event) => void revokeKey(key, event.currentTarget),
                }),
          ),
        ),
      );
    }
  }

  async function revokeKey(key, button) {
    if (!current) return;
    hideKeyOnce();
    const ok = await confirmAction({
      title: `Revoke key ${key.id}?`,
      text: `Requests with this key${key.name ? ` (${key.name})` : ""} of ${current.name} get 401 from now on, on every instance of the gateway. This cannot be undone.`,
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

  function showKeyOnce(created) {
    $("#key-once-value").textContent = created.key;
    $("#key-once-status").textContent = "";
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
    if (hadFocus && current) $("#keys-title").focus();
  }

  $("#key-once-copy").addEventListener("click", async () => {
    const value = $("#key-once-value");
    const ok = await copyText(value.textContent, value);
    $("#key-once-status").textContent = ok ? "Copied" : "Selected: press Ctrl+C";
    announce(ok ? "The API key was copied to the clipboard." : "Copy failed; the key is selected: press Ctrl+C.");
  });

  $("#key-name-input").addEventListener("input", () => setFieldError($("#key-name-input"), $("#key-name-error"), null));

  $("#key-create-form").addEventListener("submit", (event) => {
    event.preventDefault();
    if (!current) return;
    const input = $("#key-name-input");
    const errorEl = $("#key-name-error");
    void once("create-key", $("#key-create-button"), async () => {
      hideKeyOnce();
      $("#org-error").hidden = true;
      setFieldError(input, errorEl, null);
      const org = current;
      let created;
      try {
        created = await api.createKey(org.id, input.value.trim() || undefined);
      } catch (err) {
        showFailure(err, $("#org-error"), { name: [input, errorEl] });
        return;
      }
      input.value = "";
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

  function detailsText(entry) {
    const parts = [];
    for (const [name, value] of Object.entries(entry.details ?? {})) {
      if (value === null || value === "") continue;
      if (name === "amount_microusd" && typeof value === "number") parts.push(`${microusdToUsd(value)} USD`);
      else if (name === "note") parts.push(`note “${value}”`);
      else if (name === "name") parts.push(`name “${value}”`);
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
      hideKeyOnce();
      $("#admin-account").hidden = true;
    },
  };
}
