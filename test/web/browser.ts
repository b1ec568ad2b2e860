import { existsSync } from "node:fs";
import { chromium, type Browser, type Page } from "playwright-core";

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
    throw new Error(`${CHROMIUM} is missing: the browser tests drive Debian's chromium. Install it with: apt-get update && apt-get install -y chromium`);
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
