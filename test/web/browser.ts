import { existsSync } from "node:fs";
import { type Browser, chromium, type Page } from "playwright-core";

/** Debian's chromium (the CI script installs it); playwright-core never downloads a browser of its own. */
export const CHROMIUM = "/usr/bin/chromium";

export const CHROMIUM_ARGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

/** Throws with the install command when Debian's chromium is missing (the test must fail, not skip). */
export function requireChromium(): void {
  if (!existsSync(CHROMIUM)) {
    throw new Error(
      `${CHROMIUM} is missing: the browser tests drive Debian's chromium. Install it with: apt-get update && apt-get install -y chromium`,
    );
  }
}

/** A fresh browser (playwright gives chromium.launch a new temporary user data dir). */
export async function launchChromium(): Promise<Browser> {
  requireChromium();
  return chromium.launch({ executablePath: CHROMIUM, args: CHROMIUM_ARGS, headless: true, timeout: 20_000 });
}

export interface PageWatch {
  /** Every URL the page requested. */
  requests: string[];
  /** console errors, page errors and CSP violations. */
  problems: string[];
}

/** Records each request the page makes and every error it reports. */
export function watchPage(page: Page): PageWatch {
  const watch: PageWatch = { requests: [], problems: [] };
  page.on("request", (request) => watch.requests.push(request.url()));
  page.on("console", (message) => {
    if (message.type() === "error") watch.problems.push(`console: ${message.text()}`);
  });
  page.on("pageerror", (error) => watch.problems.push(`pageerror: ${error.message}`));
  return watch;
}

/**
 * Runs an expression in the page. Browser code stays a string: the project compiles without the
 * DOM library, and tsx would add helpers (__name) to functions passed to page.evaluate.
 */
export function inPage<T>(page: Page, expression: string): Promise<T> {
  return page.evaluate(expression) as Promise<T>;
}

/** Inputs, selects and textareas without a non-empty <label> or aria-label(ledby); buttons without a name. */
export function unlabelled(page: Page): Promise<string[]> {
  return inPage(
    page,
    `(() => {
      const named = (el) => {
        if ([...(el.labels ?? [])].some((l) => l.textContent.trim())) return true;
        if ((el.getAttribute("aria-label") ?? "").trim()) return true;
        return (el.getAttribute("aria-labelledby") ?? "").split(/\\s+/).some((id) => id && (document.getElementById(id)?.textContent ?? "").trim());
      };
      const fields = [...document.querySelectorAll("input, select, textarea")].filter((el) => !named(el));
      const buttons = [...document.querySelectorAll("button")].filter((b) => !b.textContent.trim() && !named(b));
      return [...fields, ...buttons].map((el) => el.outerHTML.slice(0, 160));
    })()`,
  );
}
