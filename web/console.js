// Entry point of the console: sign-in with an API key (sessionStorage only), the status strip, the pages of an
// organization (Playground, Usage, Batches) and the Admin page (its own sign-in with the admin token), chosen by the URL hash.
// The two sessions are independent: either, both or neither may be signed in.

import { createAdmin } from "./admin.js";
import { createApi } from "./api.js";
import { createBatches } from "./batches.js";
import { $, announce } from "./dom.js";
import { createPlayground } from "./playground.js";
import { forgetKey, loadKey, saveKey } from "./session.js";
import { hideStatus, renderModels, renderStatus } from "./status.js";
import { createUsage } from "./usage.js";

let key = loadKey();
let config = null;
let signedIn = false;
/** The check of the kept key (enter()) while it runs. */
let entering = null;

const api = createApi(() => key);
const playground = createPlayground({ api, afterRun: () => afterRun(), unauthorized: (message) => signOut(message) });
const usage = createUsage({ api, unauthorized: (message) => signOut(message) });
const batches = createBatches({ api, unauthorized: (message) => signOut(message) });
const admin = createAdmin({ getConfig: () => config, onSessionChange: () => updateNav() });

/** The pages of the signed-in organization (API key). */
const PAGES = { playground: "Playground", usage: "Usage", batches: "Batches" };

function currentPage() {
  const name = location.hash.replace(/^#\/?/, "");
  return name in PAGES || name === "admin" ? name : "playground";
}

/** The page links: shown while either session is open, and on the Admin page (the way back to the API key). */
function updateNav() {
  const page = currentPage();
  $("#nav").hidden = !(signedIn || admin.signedIn() || page === "admin");
  for (const link of document.querySelectorAll("#nav a")) {
    if (link.dataset.page === page) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

/** Shows the page named by the hash; `focusHeading` moves the focus to its heading (navigation). */
function route(focusHeading = false) {
  const page = currentPage();
  updateNav();
  if (page === "admin") {
    $("#signin").hidden = true;
    $("#account").hidden = true;
    $("#status-strip").hidden = true;
    for (const name of Object.keys(PAGES)) $(`#page-${name}`).hidden = true;
    $("#page-admin").hidden = false;
    batches.hide();
    void admin.show(focusHeading);
    return;
  }
  $("#page-admin").hidden = true;
  admin.hide();
  if (!signedIn) {
    if (key) {
      if (!entering) void enter();
      return;
    }
    showSignIn();
    if (focusHeading) $("#signin-title").focus();
    return;
  }
  $("#signin").hidden = true;
  $("#account").hidden = false;
  $("#status-strip").hidden = false;
  for (const name of Object.keys(PAGES)) $(`#page-${name}`).hidden = name !== page;
  document.title = `${PAGES[page]} · Typed Decision Service`;
  if (focusHeading) $(`#${page}-title`).focus();
  if (page === "usage") void usage.show();
  if (page === "batches") void batches.show();
  else batches.hide();
}

async function refreshStatus() {
  void refreshModels();
  try {
    renderStatus(await api.organization());
    // The strip belongs to the organization's pages, not to Admin.
    if (currentPage() === "admin") $("#status-strip").hidden = true;
  } catch (err) {
    if (err?.status === 401) signOut(err.detail);
  }
}

const MODELS_REFRESH_MS = 15_000;
let modelsTimer = null;

/** The Models item of the status strip, refreshed while signed in (a model may degrade between runs). */
async function refreshModels() {
  clearTimeout(modelsTimer);
  let readiness = null;
  try {
    readiness = await api.readiness();
  } catch {
    /* shown as unknown */
  }
  if (!signedIn) return;
  renderModels(readiness);
  modelsTimer = setTimeout(() => void refreshModels(), MODELS_REFRESH_MS);
}

function afterRun() {
  usage.invalidate();
  void refreshStatus();
}

async function loadModels() {
  try {
    const { models } = await api.models();
    playground.setModels(models, config?.default_model ?? null);
    batches.setModels(models, config?.default_model ?? null);
  } catch (err) {
    playground.setModels([], config?.default_model ?? null);
    batches.setModels([], config?.default_model ?? null);
    if (err?.status === 401) signOut(err.detail);
  }
}

function showSignIn(message) {
  signedIn = false;
  clearTimeout(modelsTimer);
  batches.hide();
  $("#account").hidden = true;
  for (const name of Object.keys(PAGES)) $(`#page-${name}`).hidden = true;
  hideStatus();
  updateNav();
  const onAdmin = currentPage() === "admin";
  $("#signin").hidden = onAdmin;
  if (!onAdmin) document.title = "Sign in · Typed Decision Service";
  const error = $("#signin-error");
  error.hidden = !message;
  error.textContent = message ?? "";
  if (message) $("#api-key").setAttribute("aria-invalid", "true");
  else $("#api-key").removeAttribute("aria-invalid");
}

/** Checks the key with GET /v1/organization and opens the console; false when it was refused. */
function enter() {
  entering ??= check().finally(() => {
    entering = null;
  });
  return entering;
}

async function check() {
  let org;
  try {
    org = await api.organization();
  } catch (err) {
    if (err?.status === 401) {
      forgetKey();
      key = null;
      showSignIn(`This key was not accepted: ${err.detail}`);
    } else {
      showSignIn(`The gateway did not answer as expected: ${err?.detail ?? err?.message ?? err}`);
    }
    return false;
  }
  signedIn = true;
  $("#org-name").textContent = org.name;
  renderStatus(org);
  void refreshModels();
  route();
  await loadModels();
  return true;
}

function signOut(message) {
  forgetKey();
  key = null;
  playground.reset();
  usage.reset();
  batches.reset();
  $("#api-key").value = "";
  showSignIn(message ? `Signed out: ${message}` : undefined);
  $("#api-key").focus();
  announce(message ? `Signed out: ${message}` : "Signed out. The key was removed from this tab.");
}

$("#signin-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const value = $("#api-key").value.trim();
  if (!value) {
    showSignIn("Enter an API key.");
    $("#api-key").focus();
    return;
  }
  const button = $("#signin-button");
  button.setAttribute("aria-disabled", "true");
  key = value;
  const ok = await enter();
  button.removeAttribute("aria-disabled");
  if (ok) {
    saveKey(value);
    $("#api-key").value = "";
    announce(`Signed in to ${$("#org-name").textContent}.`);
    $(`#${currentPage()}-title`).focus();
  } else {
    $("#api-key").focus();
  }
});

$("#sign-out").addEventListener("click", () => signOut());
// A limit's reset time has passed: show the fresh numbers.
document.addEventListener("tds:limit-reset", () => {
  if (signedIn) void refreshStatus();
});
window.addEventListener("hashchange", () => route(true));

async function boot() {
  try {
    config = await api.config();
    playground.setLimits(config);
    $("#service-info").textContent =
      `This gateway runs in ${config.service_mode} mode${config.default_model ? `; default model ${config.default_model}` : ""}.`;
  } catch {
    /* the console still works without it */
  }
  route();
}

void boot();
