// The status strip: service mode, today's preview quota or the credit balance, the per-minute
// limit, and a banner when a limit is reached (from a 429/402 answer or from the organization's
// own numbers), saying which limit and when it resets.

import { $, appendChildren, clear, h } from "./dom.js";
import { duration, integer, localTime, utcTime } from "./format.js";

let resetTimer = null;
/** What the banner shows: "quota" (the organization's day), "capacity" (the service's day), "rate", "credits", "paused" or null. */
let currentKind = null;
/** The organization as last read (GET /v1/organization): its limits for the banner's sentences. */
let lastOrg = null;

export function renderStatus(org) {
  lastOrg = org;
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
    if (currentKind !== "paused") showBanner("paused", null);
  } else if (org.preview && org.preview.remaining === 0) {
    // Keep the banner of a 429 that said the same, with the reset time of its Retry-After.
    if (currentKind !== "quota") showBanner("quota", new Date(org.preview.resets_at));
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

/**
 * Shows the banner for a 429 or 402 answer of POST /v1/systemone and returns its title. The banner speaks to the
 * person signed in with an API key: what happened to their organization and what they can do (wait, or ask their
 * administrator), never an operator's command or setting; the wait is said once, in the banner only.
 */
export function showLimitFromError(err) {
  if (err.status === 402) return showBanner("credits", null);
  const at = err.retryAfterMs !== null ? new Date(Date.now() + err.retryAfterMs) : null;
  if (/per-minute/i.test(err.detail)) return showBanner("rate", at);
  // Daily quotas reset at 00:00 UTC: the answer's Retry-After leads there; round off the network time.
  const midnight = at ? new Date(Math.round(at.getTime() / 60_000) * 60_000) : null;
  return showBanner(/capacity of the service/i.test(err.detail) ? "capacity" : "quota", midnight);
}

const TITLES = {
  rate: "Per-minute rate limit reached.",
  quota: "Daily preview limit reached.",
  capacity: "The service's daily preview capacity is used up.",
  credits: "Not enough credits.",
  paused: "Organization paused.",
};

/** The banner's one sentence for `kind`, with the wait (when known) as its end. */
function sentence(kind, resetsAt) {
  const perMinute = lastOrg?.rate_limit?.requests_per_minute;
  const daily = lastOrg?.preview?.limit;
  switch (kind) {
    case "rate":
      return [
        typeof perMinute === "number"
          ? `Your organization has reached its limit of ${integer(perMinute)} requests per minute; `
          : "Your organization has reached its limit of requests per minute; ",
        resetsAt ? waitUntil(kind, resetsAt) : "try again in a minute",
        ".",
      ];
    case "quota":
      return [
        typeof daily === "number"
          ? `Your organization has used all ${integer(daily)} preview requests of today; `
          : "Your organization has used all its preview requests of today; ",
        resetsAt ? waitUntil(kind, resetsAt) : "they reset at 00:00 UTC",
        ".",
      ];
    case "capacity":
      return [
        "The preview requests the service offers all organizations together are used up for today; ",
        resetsAt ? waitUntil(kind, resetsAt) : "they reset at 00:00 UTC",
        ".",
      ];
    case "credits":
      return ["Your organization has no credits left for this request; ask your administrator to add credits."];
    default:
      return [
        "Your organization's decision requests are paused pending billing review; ask your administrator to resume them. Usage can still be read.",
      ];
  }
}

/** "try again in 42 s (at 14:03:12)" or "they reset at 2026-11-27 00:00 UTC (in 9 h 56 min; 01:00 your time)". */
function waitUntil(kind, resetsAt) {
  const inText = duration(resetsAt.getTime() - Date.now());
  const time = h("time", { datetime: resetsAt.toISOString(), text: kind === "rate" ? localTime(resetsAt) : utcTime(resetsAt) });
  return kind === "rate"
    ? h("span", { class: "limit-reset" }, `try again in ${inText} (at `, time, ")")
    : h("span", { class: "limit-reset" }, "they reset at ", time, ` (in ${inText}; ${localTime(resetsAt)} your time)`);
}

function showBanner(kind, resetsAt) {
  currentKind = kind;
  clearTimeout(resetTimer);
  const banner = $("#limit-banner");
  appendChildren(clear(banner), h("strong", { class: "limit-title", text: TITLES[kind] }), " ", h("span", {}, sentence(kind, resetsAt)));
  if (resetsAt) {
    const wait = resetsAt.getTime() - Date.now();
    if (wait < 2 ** 31 - 1) {
      resetTimer = setTimeout(() => {
        clearLimit();
        document.dispatchEvent(new CustomEvent("tds:limit-reset"));
      }, Math.max(0, wait) + 250);
    }
  }
  banner.dataset.kind = kind;
  banner.hidden = false;
  return TITLES[kind];
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
  lastOrg = null;
  $("#status-strip").hidden = true;
}
