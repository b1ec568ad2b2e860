// The API key and the admin token live only in this tab's sessionStorage, each under its own name: they are gone
// when the tab closes, are never written to localStorage, cookies or the URL, and each "Sign out" removes its own.

const KEY = "tds.console.apiKey";
const ADMIN_TOKEN = "tds.console.adminToken";

function load(name) {
  try {
    return sessionStorage.getItem(name);
  } catch {
    return null;
  }
}

function forget(name) {
  try {
    sessionStorage.removeItem(name);
  } catch {
    /* storage unavailable: nothing was kept */
  }
}

export function loadKey() {
  return load(KEY);
}

export function saveKey(key) {
  sessionStorage.setItem(KEY, key);
}

export function forgetKey() {
  forget(KEY);
}

export function loadAdminToken() {
  return load(ADMIN_TOKEN);
}

export function saveAdminToken(token) {
  sessionStorage.setItem(ADMIN_TOKEN, token);
}

export function forgetAdminToken() {
  forget(ADMIN_TOKEN);
}
