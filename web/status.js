// The status strip: service mode, today's preview quota or the credit balance, the per-minute
// limit, and a banner when a limit is reached (from a 429/402 answer or from the organization's
// own numbers), saying which limit and when it resets.

import { $, appendChildren, clear, h } from "./dom.js";
import { duration, integer, localTime, utcTime } from "./format.js";

let resetTimer = null;
/** What the banner shows: "quota" (the organization's day), "capacity" (the service's day), "rate", "credits", "paused" or null. */
let currentKind = null;

export function renderStatus(org) {
  $("#status-strip").hidden = false;
  $("#st-mode").textContent = org.service_mode === "paid" ? "Paid" : "Preview (free)";
  if (org.preview) {
    $("#st-quota-label").textContent = "Preview requests left today";
    $("#st-quota").replaceChildren(
      h("strong", { text: integer(org.preview.remaining) }),
      ` of ${integer(org.preview.limit)}`,
      h("span", { class: "st-note", text: ` · resets 00:00 UTC` }),
    );
  } else if (org.balance) {
    $("#st-quota-label").textContent = "Credits available";
    appendChildren(
      clear($("#st-quota")),
      h("strong", { text: `${org.balance.available_usd} USD` }),
      org.balance.reserved_microusd > 0 ? h("span", { class: "st-note", text: ` · ${org.balance.reserved_usd} USD reserved` }) : null,
    );
  }
  $("#st-rate").textContent = `${integer(org.rate_limit.requests_per_minute)} requests / min`;

  if (org.paused) {
    if (currentKind !== "paused") {
      showBanner(
        "Organization paused",
        "Decision requests of this organization are paused pending billing review (403). Usage can still be read.",
        null,
        "paused",
      );
    }
  } else if (org.preview && org.preview.remaining === 0) {
    // Keep the banner of a 429 that said the same (its text is the server's own).
    if (currentKind !== "quota") {
      showBanner(
        "Daily preview limit reached",
        `All ${integer(org.preview.limit)} preview requests of today are used.`,
        new Date(org.preview.resets_at),
        "quota",
      );
    }
  } else if (currentKind === "quota" || currentKind === "paused") {
    clearLimit();
  }
}

/**
 * The Models item from GET /readyz: "All ready", or each model that is not, with how many of its deployments take
 * calls. `readiness` is null when the gateway could not be asked.
 */
export function renderModels(readiness) {
  const dd = $("#st-models");
  const models = readiness?.json?.models && typeof readiness.json.models === "object" ? Object.entries(readiness.json.models) : null;
  if (!models) {
    dd.replaceChildren(h("span", { class: "st-note", text: "unknown" }));
    return;
  }
  const notOk = models.filter(([, m]) => m.state !== "ok");
  if (notOk.length === 0) {
    const check = readiness.json.checks?.models;
    dd.replaceChildren(
      models.length > 0 || check === "ok"
        ? h("span", { class: "st-ok", text: models.length === 1 ? "Ready" : `All ${integer(models.length)} ready` })
        : h("span", { class: "st-unavailable", text: "Not ready", title: String(check ?? "") }),
    );
    return;
  }
  const parts = [];
  for (const [name, m] of notOk) {
    if (parts.length > 0) parts.push(", ");
    const unavailable = m.state === "unavailable";
    parts.push(
      h("span", { class: unavailable ? "st-unavailable" : "st-degraded", text: `${name} ${unavailable ? "unavailable" : "degraded"}` }),
      h("span", {
        class: "st-note",
        text: unavailable ? " (no healthy deployment)" : ` (${integer(m.healthy)} of ${integer(m.deployments)} deployments healthy)`,
      }),
    );
  }
  dd.replaceChildren(...parts);
}

/** Shows the banner for a 429 or 402 answer of POST /v1/systemone. */
export function showLimitFromError(err) {
  if (err.status === 402) {
    showBanner("Not enough credits", `${err.detail} Grant credits (tds credits grant) and run again.`, null, "credits");
    return;
  }
  const at = err.retryAfterMs !== null ? new Date(Date.now() + err.retryAfterMs) : null;
  if (/per-minute/i.test(err.detail)) {
    showBanner("Per-minute rate limit reached", err.detail, at, "rate");
    return;
  }
  // Daily quotas reset at 00:00 UTC: the answer's Retry-After leads there; round off the network time.
  const midnight = at ? new Date(Math.round(at.getTime() / 60_000) * 60_000) : null;
  if (/capacity of the service/i.test(err.detail))
    showBanner("The service's daily preview capacity is used up", err.detail, midnight, "capacity");
  else showBanner("Daily preview limit reached", err.detail, midnight, "quota");
}

function showBanner(title, text, resetsAt, kind) {
  currentKind = kind;
  clearTimeout(resetTimer);
  const banner = $("#limit-banner");
  const parts = [h("strong", { class: "limit-title", text: title }), " ", h("span", { text })];
  if (resetsAt) {
    const inText = duration(resetsAt.getTime() - Date.now());
    parts.push(
      " ",
      h(
        "span",
        { class: "limit-reset" },
        kind === "rate" ? "Try again " : "Resets ",
        kind === "rate" ? `in ${inText} (at ` : "at ",
        h("time", { datetime: resetsAt.toISOString(), text: kind === "rate" ? localTime(resetsAt) : utcTime(resetsAt) }),
        kind === "rate" ? ")." : ` (in ${inText}; ${localTime(resetsAt)} your time).`,
      ),
    );
    const wait = resetsAt.getTime() - Date.now();
    if (wait < 2 ** 31 - 1) {
      resetTimer = setTimeout(() => {
        clearLimit();
        document.dispatchEvent(new CustomEvent("tds:limit-reset"));
      }, Math.max(0, wait) + 250);
    }
  }
  clear(banner).append(...parts);
  banner.dataset.kind = kind;
  banner.hidden = false;
}

export function clearLimit() {
  currentKind = null;
  clearTimeout(resetTimer);
  const banner = $("#limit-banner");
  banner.hidden = true;
  clear(banner);
  delete banner.dataset.kind;
}

export function hideStatus() {
  clearLimit();
  $("#status-strip").hidden = true;
}
