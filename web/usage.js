// The Usage page: today's totals and a per-day chart (GET /v1/usage/summary), the organization's
// usage records newest first with filters and cursor paging (GET /v1/usage), and lookup by
// request id (GET /v1/usage/{request_id}).

import { drawResponsive } from "./chart.js";
import { $, announce, clear, h } from "./dom.js";
import { integer, localInputToIso, localTime, ms, usd } from "./format.js";

const OUTCOME_LABELS = {
  succeeded: "Succeeded",
  model_error: "Model error",
  context_rejected: "Context rejected",
  reservation_expired: "Reservation expired",
  in_flight: "In flight",
  gateway_error: "Gateway error",
};

/** @param {{ api: ReturnType<import("./api.js").createApi>, unauthorized: (message: string) => void }} deps */
export function createUsage(deps) {
  const PAGE_SIZE = 25;
  /** cursors[i] is the cursor of page i (null for the first). */
  let cursors = [null];
  let page = 0;
  let nextCursor = null;
  let filters = {};
  let stopChart = () => {};
  let loaded = false;

  function handle(err, where) {
    if (err?.status === 401) {
      deps.unauthorized(err.detail);
      return;
    }
    where.hidden = false;
    clear(where).append(h("p", { class: "error-title", text: err?.detail ?? String(err) }));
  }

  // ── Summary: today and the chart ────────────────────────────────────────────────────────────

  async function loadSummary() {
    const days = Number($("#summary-days").value);
    const errorBox = $("#summary-error");
    errorBox.hidden = true;
    try {
      const summary = await deps.api.usageSummary(days);
      const today = summary.days.at(-1);
      $("#today-date").textContent = today ? `UTC day ${today.date}` : "";
      $("#today-requests").textContent = integer(today?.requests ?? 0);
      $("#today-tokens").textContent = `${integer((today?.input_tokens ?? 0) + (today?.output_tokens ?? 0))}`;
      $("#today-tokens-split").textContent = today ? `${integer(today.input_tokens)} in · ${integer(today.output_tokens)} out` : "";
      $("#today-cost").textContent = usd(today?.cost_usd ?? "0");
      stopChart();
      stopChart = drawResponsive($("#usage-chart"), summary.days);
      $("#summary-truncated").hidden = !summary.truncated;
      renderSummaryTable(summary.days);
    } catch (err) {
      handle(err, errorBox);
    }
  }
  $("#summary-days").addEventListener("change", () => void loadSummary());

  function renderSummaryTable(days) {
    const body = clear($("#summary-table tbody"));
    for (const d of [...days].reverse()) {
      body.append(
        h(
          "tr",
          {},
          h("th", { scope: "row", text: d.date }),
          h("td", { class: "num", text: integer(d.requests) }),
          h("td", { class: "num", text: integer(d.input_tokens) }),
          h("td", { class: "num", text: integer(d.output_tokens) }),
          h("td", { class: "num", text: d.cost_usd }),
        ),
      );
    }
  }

  // ── History ─────────────────────────────────────────────────────────────────────────────────

  async function loadPage() {
    const errorBox = $("#history-error");
    errorBox.hidden = true;
    const params = { limit: String(PAGE_SIZE), ...filters };
    if (cursors[page]) params.cursor = cursors[page];
    const table = $("#usage-table");
    table.setAttribute("aria-busy", "true");
    try {
      const result = await deps.api.usagePage(params);
      nextCursor = result.next_cursor;
      renderRows(result.data);
      $("#page-info").textContent =
        result.data.length === 0 ? "No records" : `Page ${page + 1} · ${result.data.length} record${result.data.length === 1 ? "" : "s"}`;
      $("#usage-newer").disabled = page === 0;
      $("#usage-older").disabled = !nextCursor;
    } catch (err) {
      handle(err, errorBox);
    } finally {
      table.removeAttribute("aria-busy");
    }
  }

  function outcomeBadge(outcome) {
    return h("span", { class: ["badge", `outcome-${outcome}`], text: OUTCOME_LABELS[outcome] ?? outcome });
  }

  function renderRows(records) {
    const body = clear($("#usage-table tbody"));
    $("#usage-empty").hidden = records.length > 0;
    for (const r of records) {
      const at = new Date(r.created_at);
      body.append(
        h(
          "tr",
          { dataset: { requestId: r.request_id } },
          // On narrow screens the id and the cost move under the time and the outcome (their own columns are hidden).
          h(
            "td",
            { class: "col-time" },
            h("time", { datetime: r.created_at, text: localTime(at) }),
            h("code", { class: "request-id cell-sub narrow-only", text: r.request_id }),
          ),
          h("td", { class: "col-id" }, h("code", { class: "request-id", text: r.request_id })),
          h("td", { class: "col-source", text: r.source }),
          h("td", { class: "col-model", text: r.model }),
          h("td", { class: "col-outcome" }, outcomeBadge(r.outcome), h("span", { class: "cell-sub narrow-only", text: usd(r.cost_usd) })),
          h("td", { class: "num col-http", text: r.http_status === null ? "–" : String(r.http_status) }),
          h("td", { class: "num col-tokens", text: `${integer(r.input_tokens)} / ${integer(r.output_tokens)}` }),
          h("td", { class: "num col-cost", text: r.cost_usd }),
          h("td", { class: "num col-latency", text: ms(r.latency_ms) }),
        ),
      );
    }
  }

  $("#usage-filters").addEventListener("submit", (event) => {
    event.preventDefault();
    const next = {};
    const outcome = $("#filter-outcome").value;
    const from = localInputToIso($("#filter-from").value);
    const to = localInputToIso($("#filter-to").value);
    if (outcome) next.outcome = outcome;
    if (from) next.from = from;
    if (to) next.to = to;
    filters = next;
    cursors = [null];
    page = 0;
    void loadPage().then(() => announce(`Usage filtered. ${$("#page-info").textContent}.`));
  });
  $("#usage-filters").addEventListener("reset", () => {
    filters = {};
    cursors = [null];
    page = 0;
    setTimeout(() => void loadPage(), 0);
  });
  $("#usage-older").addEventListener("click", () => {
    if (!nextCursor) return;
    cursors[page + 1] = nextCursor;
    page += 1;
    void loadPage().then(() => announce($("#page-info").textContent));
  });
  $("#usage-newer").addEventListener("click", () => {
    if (page === 0) return;
    page -= 1;
    void loadPage().then(() => announce($("#page-info").textContent));
  });
  $("#usage-refresh").addEventListener("click", () => {
    void refresh().then(() => announce("Usage refreshed."));
  });

  // ── Lookup by request id ────────────────────────────────────────────────────────────────────

  $("#lookup-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const id = $("#lookup-id").value.trim();
    const out = clear($("#lookup-result"));
    out.hidden = false;
    if (!id) {
      out.append(h("p", { class: "field-error", text: "Enter a request id (req_…)." }));
      return;
    }
    try {
      const r = await deps.api.usageRecord(id);
      out.append(recordCard(r));
      announce(`Found request ${r.request_id}: ${OUTCOME_LABELS[r.outcome] ?? r.outcome}.`);
    } catch (err) {
      if (err?.status === 401) return deps.unauthorized(err.detail);
      out.append(
        h("p", {
          class: "lookup-missing",
          text:
            err?.status === 404
              ? `No usage record with request id ${id} in this organization. Requests refused before they were accepted (an invalid key or body, a paused organization, a limit reached, not enough credits) leave no record.`
              : (err?.detail ?? String(err)),
        }),
      );
      announce(err?.status === 404 ? "No record with that request id." : "Lookup failed.");
    }
  });

  function recordCard(r) {
    const item = (label, value) => h("div", { class: "meta-item" }, h("dt", { text: label }), h("dd", {}, value));
    return h(
      "article",
      { class: "record-card", dataset: { requestId: r.request_id } },
      h("h3", {}, h("code", { class: "request-id", text: r.request_id }), " ", outcomeBadge(r.outcome)),
      h(
        "dl",
        { class: "meta" },
        item("Time", h("time", { datetime: r.created_at, text: `${localTime(new Date(r.created_at))} (${r.created_at})` })),
        item("Source", r.source),
        item("Model", r.model),
        item("Mode", r.service_mode),
        item("HTTP status", r.http_status === null ? "– (none yet)" : String(r.http_status)),
        item("Tokens", `${integer(r.input_tokens)} in · ${integer(r.output_tokens)} out`),
        item("Cost", usd(r.cost_usd)),
        item("Latency", `model ${ms(r.latency_ms)} · gateway ${ms(r.gateway_latency_ms)}`),
        r.deployment ? item("Deployment", r.attempts > 1 ? `${r.deployment} (after ${integer(r.attempts)} attempts)` : r.deployment) : null,
        item("Key id", r.key_id),
        r.over_reservation ? item("Over reservation", "yes: the reservation was charged") : null,
        r.error ? item("Error", r.error) : null,
      ),
    );
  }

  async function refresh() {
    await Promise.all([loadSummary(), loadPage()]);
  }

  return {
    /** Called when the page is shown: loads once, then on "Refresh". */
    async show() {
      if (loaded) return;
      loaded = true;
      await refresh();
    },
    /** Marks the data stale (after a Playground run) so the next visit reloads it. */
    invalidate() {
      loaded = false;
    },
    reset() {
      loaded = false;
      stopChart();
      stopChart = () => {};
      cursors = [null];
      page = 0;
      filters = {};
      for (const id of ["#filter-outcome", "#filter-from", "#filter-to"]) $(id).value = "";
      clear($("#usage-table tbody"));
      clear($("#usage-chart"));
      clear($("#summary-table tbody"));
      clear($("#lookup-result")).hidden = true;
      $("#lookup-id").value = "";
      for (const id of ["#today-requests", "#today-tokens", "#today-cost", "#today-date", "#today-tokens-split", "#page-info"])
        $(id).textContent = "";
    },
  };
}
