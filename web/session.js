// The API key lives only in this tab's sessionStorage: it is gone when the tab closes, is never
// written to localStorage, cookies or the URL, and "Sign out" removes it.

const KEY = "tds.console.apiKey";

export function loadKey() {
  try {
    return sessionStorage.getItem(KEY);
  } catch {
    return null;
  }
}

export function saveKey(key) {
  sessionStorage.setItem(KEY, key);
}

export function forgetKey() {
  try {
    sessionStorage.removeItem(KEY);
  } catch {
    /* storage unavailable: nothing was kept */
  }
}
