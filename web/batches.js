// The Batches page: the organization's batches newest first (GET /v1/batches, "More batches" for older ones), each with
// its progress, counts and cost, a Cancel button while it has requests to start (POST /v1/batches/{id}/cancel) and its
// results as a file (GET /v1/batches/{id}/results); a form that submits a JSON Lines file (POST /v1/batches). While a
// shown batch is still going it is fetched again every 2 s, never while the page or the browser tab is hidden.

import { $, announce, clear, h, uid } from "./dom.js";
import { integer, localTime, usd } from "./format.js";

const STATUS_LABELS = {
  queued: "Queued",
  running: "Running",
  completed: "Completed",
  cancelling: "Cancelling",
  cancelled: "Cancelled",
  expired: "Expired",
};
/** Statuses in which the counts still change. */
const ACTIVE = new Set(["queued", "running", "cancelling"]);
const CANCELLABLE = new Set(["queued", "running"]);
const POLL_MS = 2000;
const PAGE_SIZE = 20;
/** The newest batches read at each refresh (the API's largest page). */
const POLL_PAGE_SIZE = 200;
/** The most line errors listed (the API lists at most this many too). */
const MAX_LISTED_ERRORS = 50;

const done = (counts) => counts.succeeded + counts.failed;

/** @param {{ api: ReturnType<import("./api.js").createApi>, unauthorized: (message: string) => void }} deps */
export function createBatches(deps) {
  /** The shown batches in list order (newest first): id → card. */
  const cards = new Map();
  let nextCursor = null;
  let visible = false;
  let loaded = false;
  let timer = null;
  let polling = false;
  /** Bumped by reset() and by reloading the list: answers to older list and refresh calls are dropped. */
  let generation = 0;
  /** Bumped by reset() (sign-out): the answer to a submission of the previous session is dropped. */
  let session = 0;

  const list = $("#batch-list");
  const modelSelect = $("#batch-model");

  /** True when the error was a 401 (the session ends); false when the caller should show it. */
  function unauthorized(err) {
    if (err?.status !== 401) return false;
    deps.unauthorized(err.detail);
    return true;
  }

  function showListError(err) {
    if (unauthorized(err)) return;
    const box = $("#batches-error");
    box.hidden = false;
    clear(box).append(h("p", { class: "error-title", text: err?.detail ?? err?.message ?? String(err) }));
  }

  // ── One batch ───────────────────────────────────────────────────────────────────────────────

  /** A list item for the batch, with update(batch) to show newer numbers in place (the focus stays where it is). */
  function batchCard(initial) {
    const id = initial.id;
    const titleId = uid("batch-title");
    const countsId = uid("batch-counts");
    const status = h("span", { class: "badge" });
    const succeededFill = h("span", { class: "batch-fill batch-fill-succeeded" });
    const failedFill = h("span", { class: "batch-fill batch-fill-failed" });
    const progress = h(
      "div",
      {
        class: "batch-progress",
        role: "progressbar",
        "aria-label": `Progress of batch ${id}`,
        "aria-describedby": countsId,
        "aria-valuemin": "0",
      },
      succeededFill,
      failedFill,
    );
    const counts = h("p", { class: "batch-counts", id: countsId });
    const cost = h("dd");
    const model = h("dd");
    const ended = h("dd");
    const endedLabel = h("dt");
    const error = h("p", { class: "field-error", role: "alert", hidden: true });
    const cancel = h("button", {
      type: "button",
      class: "btn btn-small btn-danger-quiet",
      "aria-label": `Cancel batch ${id}`,
      text: "Cancel",
      onclick: () => void cancelBatch(card),
    });
    const download = h("button", {
      type: "button",
      class: "btn btn-small",
      "aria-label": `Download results of batch ${id}`,
      text: "Download results",
      onclick: () => void downloadResults(card),
    });
    const item = (label, value) => h("div", { class: "meta-item" }, h("dt", { text: label }), value);
    const element = h(
      "li",
      { class: "batch-card", dataset: { batchId: id }, "aria-labelledby": titleId },
      h(
        "div",
        { class: "batch-head" },
        h("h3", { id: titleId, class: "batch-title", tabindex: "-1" }, h("code", { class: "request-id", text: id })),
        status,
        h(
          "span",
          { class: "muted batch-created" },
          "Created ",
          h("time", { datetime: initial.created_at, text: localTime(new Date(initial.created_at)) }),
        ),
      ),
      progress,
      counts,
      h("dl", { class: "meta batch-meta" }, item("Cost", cost), item("Model", model), h("div", { class: "meta-item" }, endedLabel, ended)),
      h("div", { class: "batch-actions" }, cancel, download),
      error,
    );
    const card = {
      id,
      element,
      batch: initial,
      cancel,
      download,
      error,
      title: () => $(`#${titleId}`, element),
      update(batch) {
        const before = card.batch.status;
        card.batch = batch;
        const c = batch.request_counts;
        const finished = done(c);
        status.className = `badge batch-status batch-status-${batch.status}`;
        status.textContent = STATUS_LABELS[batch.status] ?? batch.status;
        progress.setAttribute("aria-valuemax", String(c.total));
        progress.setAttribute("aria-valuenow", String(finished));
        progress.setAttribute(
          "aria-valuetext",
          `${integer(finished)} of ${integer(c.total)} finished: ${integer(c.succeeded)} succeeded, ${integer(c.failed)} failed`,
        );
        // Widths only draw the bar; the numbers shown are the API's integers.
        const whole = c.total || 1;
        succeededFill.style.setProperty("width", `${(100 * c.succeeded) / whole}%`);
        failedFill.style.setProperty("width", `${(100 * c.failed) / whole}%`);
        clear(counts).append(
          h("strong", { class: "batch-done", text: `${integer(finished)} / ${integer(c.total)}` }),
          " finished · ",
          h("span", { class: "batch-legend batch-legend-succeeded", text: `${integer(c.succeeded)} succeeded` }),
          " · ",
          h("span", { class: "batch-legend batch-legend-failed", text: `${integer(c.failed)} failed` }),
        );
        cost.textContent = usd(batch.cost_usd);
        model.textContent = batch.model ?? "Server default";
        if (batch.ended_at) {
          endedLabel.textContent = "Ended";
          clear(ended).append(h("time", { datetime: batch.ended_at, text: localTime(new Date(batch.ended_at)) }));
        } else {
          endedLabel.textContent = "Expires";
          clear(ended).append(h("time", { datetime: batch.expires_at, text: localTime(new Date(batch.expires_at)) }));
        }
        const cancellable = CANCELLABLE.has(batch.status);
        if (!cancellable && cancel.contains(document.activeElement)) card.title().focus();
        cancel.hidden = !cancellable;
        download.hidden = finished === 0;
        if (ACTIVE.has(before) && !ACTIVE.has(batch.status)) {
          announce(`Batch ${id} ${(STATUS_LABELS[batch.status] ?? batch.status).toLowerCase()}.`);
        }
      },
    };
    card.update(initial);
    return card;
  }

  function showError(card, err) {
    if (unauthorized(err)) return;
    card.error.hidden = false;
    card.error.textContent = err?.detail ?? err?.message ?? String(err);
  }

  async function cancelBatch(card) {
    card.error.hidden = true;
    const ok = await confirmCancel(card.id);
    if (!ok) return;
    card.cancel.setAttribute("aria-disabled", "true");
    try {
      const batch = await deps.api.cancelBatch(card.id);
      card.update(batch);
      announce(`Batch ${card.id} ${(STATUS_LABELS[batch.status] ?? batch.status).toLowerCase()}.`);
    } catch (err) {
      showError(card, err);
      // It may have ended meanwhile: show what it is now.
      try {
        card.update(await deps.api.batch(card.id));
      } catch {
        /* the error shown is enough */
      }
    } finally {
      card.cancel.removeAttribute("aria-disabled");
      schedule();
    }
  }

  async function downloadResults(card) {
    card.error.hidden = true;
    if (card.download.getAttribute("aria-disabled") === "true") return;
    card.download.setAttribute("aria-disabled", "true");
    try {
      const blob = await deps.api.batchResults(card.id);
      const url = URL.createObjectURL(blob);
      const link = h("a", { href: url, download: `${card.id}-results.ndjson`, hidden: true });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60_000);
      announce(`Downloading the results of batch ${card.id}.`);
    } catch (err) {
      showError(card, err);
    } finally {
      card.download.removeAttribute("aria-disabled");
    }
  }

  // ── Confirmation (the console's dialog) ─────────────────────────────────────────────────────

  const dialog = $("#confirm-dialog");
  let resolveConfirm = null;

  function confirmCancel(id) {
    if (dialog.open) dialog.close("");
    $("#confirm-title").textContent = `Cancel batch ${id}?`;
    $("#confirm-text").textContent =
      "Its requests not started yet end as cancelled and are not charged. Requests already running finish and are charged.";
    $("#confirm-ok").textContent = "Cancel batch";
    $("#confirm-cancel").textContent = "Keep it";
    dialog.returnValue = "";
    dialog.showModal();
    $("#confirm-cancel").focus();
    return new Promise((resolve) => {
      resolveConfirm = resolve;
    });
  }

  dialog.addEventListener("close", () => {
    const resolve = resolveConfirm;
    if (!resolve) return;
    resolveConfirm = null;
    $("#confirm-cancel").textContent = "Cancel";
    resolve(dialog.returnValue === "ok");
  });
  $("#confirm-ok").addEventListener("click", () => {
    if (resolveConfirm) dialog.close("ok");
  });
  $("#confirm-cancel").addEventListener("click", () => {
    if (resolveConfirm) dialog.close("cancel");
  });

  // ── The list ────────────────────────────────────────────────────────────────────────────────

  function showInfo() {
    $("#batches-empty").hidden = cards.size > 0;
    $("#batches-more").hidden = !nextCursor;
    const active = [...cards.values()].filter((c) => ACTIVE.has(c.batch.status)).length;
    $("#batches-info").textContent =
      cards.size === 0
        ? ""
        : `${integer(cards.size)} shown${active ? ` · ${integer(active)} in progress` : ""}${nextCursor ? " · more older" : ""}`;
  }

  function append(batches) {
    for (const batch of batches) {
      const known = cards.get(batch.id);
      if (known) {
        known.update(batch);
        continue;
      }
      const card = batchCard(batch);
      cards.set(batch.id, card);
      list.append(card.element);
    }
  }

  async function loadFirst() {
    const mine = ++generation;
    $("#batches-error").hidden = true;
    list.setAttribute("aria-busy", "true");
    try {
      const page = await deps.api.batches({ limit: PAGE_SIZE });
      if (mine !== generation) return;
      cards.clear();
      clear(list);
      nextCursor = page.next_cursor;
      append(page.data);
      showInfo();
    } catch (err) {
      if (mine === generation) showListError(err);
    } finally {
      list.removeAttribute("aria-busy");
      schedule();
    }
  }

  async function loadMore() {
    if (!nextCursor) return;
    const mine = generation;
    const button = $("#batches-more");
    button.setAttribute("aria-disabled", "true");
    try {
      const page = await deps.api.batches({ limit: PAGE_SIZE, cursor: nextCursor });
      if (mine !== generation) return;
      const firstNew = page.data.find((b) => !cards.has(b.id));
      nextCursor = page.next_cursor;
      append(page.data);
      showInfo();
      announce(`${integer(page.data.length)} older batch${page.data.length === 1 ? "" : "es"} shown.`);
      if (firstNew) cards.get(firstNew.id)?.title().focus();
      else if (!nextCursor) $("#batch-list-title").focus();
    } catch (err) {
      if (mine === generation) showListError(err);
    } finally {
      button.removeAttribute("aria-disabled");
      schedule();
    }
  }

  // ── Refreshing the batches still going ──────────────────────────────────────────────────────

  function schedule() {
    clearTimeout(timer);
    timer = null;
    if (!visible || document.hidden || polling) return;
    if (![...cards.values()].some((c) => ACTIVE.has(c.batch.status))) return;
    timer = setTimeout(() => void poll(), POLL_MS);
  }

  async function poll() {
    const mine = generation;
    const active = [...cards.values()].filter((c) => ACTIVE.has(c.batch.status));
    if (active.length === 0 || polling) return;
    polling = true;
    try {
      // One list page holds the newest batches, where running ones usually are; older running ones are asked for
      // one by one. (One request per batch would use up the organization's per-minute read limit with many batches.)
      const newest = await deps.api.batches({ limit: POLL_PAGE_SIZE }).catch((err) => err);
      if (mine !== generation) return;
      if (newest?.status === 401) return void unauthorized(newest);
      const fresh = new Map((Array.isArray(newest?.data) ? newest.data : []).map((b) => [b.id, b]));
      const older = active.filter((c) => !fresh.has(c.id));
      const answers = await Promise.allSettled(older.map((c) => deps.api.batch(c.id)));
      if (mine !== generation) return;
      for (const c of active) if (fresh.has(c.id)) c.update(fresh.get(c.id));
      answers.forEach((answer, i) => {
        if (answer.status === "fulfilled") older[i].update(answer.value);
        else if (answer.reason?.status === 401) unauthorized(answer.reason);
      });
      showInfo();
    } finally {
      polling = false;
      if (mine === generation) schedule();
    }
  }

  document.addEventListener("visibilitychange", () => {
    if (document.hidden) {
      clearTimeout(timer);
      timer = null;
    } else if (visible && loaded) {
      void poll();
    }
  });

  // ── Submitting a file ───────────────────────────────────────────────────────────────────────

  const fileInput = $("#batch-file");
  const result = $("#batch-upload-result");

  function fileProblem(message) {
    fileInput.setAttribute("aria-invalid", "true");
    result.hidden = false;
    clear(result).append(h("div", { class: "error-box", role: "alert" }, h("p", { class: "error-title", text: message })));
  }

  fileInput.addEventListener("change", () => {
    fileInput.removeAttribute("aria-invalid");
    result.hidden = true;
    clear(result);
  });

  $("#batch-upload-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = $("#batch-submit");
    if (button.getAttribute("aria-disabled") === "true") return;
    const file = fileInput.files?.[0];
    if (!file) {
      fileProblem("Choose a file of requests (.ndjson or .jsonl) first.");
      fileInput.focus();
      return;
    }
    fileInput.removeAttribute("aria-invalid");
    result.hidden = true;
    button.setAttribute("aria-disabled", "true");
    const mine = session;
    try {
      const batch = await deps.api.submitBatch(file, modelSelect.value || undefined);
      if (mine !== session) return;
      const card = cards.get(batch.id) ?? batchCard(batch);
      if (!cards.has(batch.id)) {
        // Newest first: the new batch goes on top.
        const rest = [...cards.entries()];
        cards.clear();
        cards.set(batch.id, card);
        for (const [id, c] of rest) cards.set(id, c);
        list.prepend(card.element);
      } else {
        card.update(batch);
      }
      showInfo();
      const summary = `Batch ${batch.id} submitted: ${integer(batch.request_counts.total)} request${batch.request_counts.total === 1 ? "" : "s"}, ${(STATUS_LABELS[batch.status] ?? batch.status).toLowerCase()}.`;
      result.hidden = false;
      clear(result).append(h("p", { class: "result-line batch-submitted", role: "status", text: summary }));
      fileInput.value = "";
      announce(summary);
    } catch (err) {
      if (mine !== session || unauthorized(err)) return;
      fileInput.setAttribute("aria-invalid", "true");
      result.hidden = false;
      clear(result).append(submissionError(err, file.name));
    } finally {
      button.removeAttribute("aria-disabled");
      schedule();
    }
  });

  /** The refusal of a submission: its detail and, for a 422, the problems of its lines. */
  function submissionError(err, fileName) {
    const errors = Array.isArray(err?.errors) ? err.errors : [];
    const shown = errors.slice(0, MAX_LISTED_ERRORS);
    const title = err?.status ? `HTTP ${err.status}: ${err.detail}` : `The file was not sent: ${err?.message ?? err}`;
    return h(
      "div",
      { class: "error-box batch-errors", role: "alert" },
      h("p", { class: "error-title", text: title }),
      h("p", { class: "error-meta", text: `File ${fileName}. Nothing was submitted; fix the file and submit it again.` }),
      shown.length > 0
        ? h(
            "ul",
            { class: "batch-error-list", "aria-label": "Problems in the file" },
            shown.map((e) =>
              h(
                "li",
                {},
                typeof e.field === "string" && e.field ? h("code", { class: "batch-error-field", text: e.field }) : null,
                typeof e.field === "string" && e.field ? " " : null,
                String(e.message ?? ""),
              ),
            ),
          )
        : null,
      errors.length > shown.length
        ? h("p", { class: "error-meta", text: `${integer(errors.length - shown.length)} more not listed.` })
        : null,
    );
  }

  $("#batches-more").addEventListener("click", () => void loadMore());
  $("#batches-refresh").addEventListener("click", () => {
    void loadFirst().then(() => announce("Batches refreshed."));
  });

  return {
    /** Called when the page is shown: loads once, then fetches the batches still going again. */
    async show() {
      visible = true;
      if (!loaded) {
        loaded = true;
        await loadFirst();
      } else {
        await poll();
      }
    },
    /** Leaving the page: no more refreshing, and an open confirmation goes away. */
    hide() {
      visible = false;
      clearTimeout(timer);
      timer = null;
      if (resolveConfirm && dialog.open) dialog.close("");
    },
    setModels(models, defaultModel) {
      const chosen = modelSelect.value;
      clear(modelSelect).append(h("option", { value: "", text: defaultModel ? `Server default (${defaultModel})` : "Server default" }));
      for (const m of models) modelSelect.append(h("option", { value: m.name, text: m.name }));
      modelSelect.value = models.some((m) => m.name === chosen) ? chosen : "";
    },
    /** Sign-out: nothing of the organization stays on the page. */
    reset() {
      generation++;
      session++;
      loaded = false;
      visible = false;
      clearTimeout(timer);
      timer = null;
      cards.clear();
      nextCursor = null;
      clear(list);
      clear(result).hidden = true;
      fileInput.value = "";
      fileInput.removeAttribute("aria-invalid");
      $("#batches-error").hidden = true;
      $("#batches-info").textContent = "";
      $("#batches-more").hidden = true;
      $("#batches-empty").hidden = true;
    },
  };
}
