/**
 * The console's layout at a desktop (1280×800) and a phone (390×844) size, in Debian's chromium against a real
 * gateway: the Usage history shows every column it offers inside its box (no column cut off, nothing to scroll
 * sideways, even with long values), and the Playground's sticky run bar does not cover an option row scrolled into
 * view, reached with Tab, or at the end of the page. Screenshots go to test-output/screenshots/ (docs/images/ has
 * copies of the console-*.png ones).
 */
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { Browser, Locator, Page } from "playwright-core";
import { type Gateway, sampleRequest, startGateway } from "../support/gateway-harness.ts";
import { seedUsage } from "../support/usage-fixtures.ts";
import { inPage, launchChromium, watchPage } from "./browser.ts";

const SCREENSHOTS = join(import.meta.dirname, "..", "..", "test-output", "screenshots");
const SIZES = [
  { name: "1280", width: 1280, height: 800 },
  { name: "390", width: 390, height: 844 },
] as const;

interface Box {
  x: number;
  y: number;
  width: number;
  height: number;
}

async function box(locator: Locator): Promise<Box> {
  const b = await locator.boundingBox();
  assert.ok(b, "the element is rendered");
  return b;
}

/** The last option row of the last question, as a browser expression. */
const LAST_ROW = `[...[...document.querySelectorAll("#question-list > li")].at(-1).querySelectorAll(".crit-row")].at(-1)`;

const overlaps = (a: Box, b: Box) => a.y < b.y + b.height - 0.5 && b.y < a.y + a.height - 0.5;

async function signIn(page: Page, gw: Gateway) {
  await page.goto("/console/");
  await page.getByLabel("API key", { exact: true }).fill(gw.key);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("heading", { name: "Playground", level: 1 }).waitFor();
}

/** Records as wide as they come: long model name, the longest outcome, large token counts, cost and latency. */
async function seedWideRecords(gw: Gateway) {
  const now = Date.now();
  await seedUsage(
    gw.store,
    ["reservation_expired", "context_rejected", "gateway_error"].map((outcome, i) => ({
      requestId: `req_wide${i}${"x".repeat(19)}`,
      orgId: gw.orgId,
      keyId: gw.keyId,
      createdAtMs: now - 60_000 * (i + 1),
      source: "playground",
      model: "a-rather-long-model-name-v2-instruct",
      mode: "paid",
      outcome: outcome as "reservation_expired",
      httpStatus: outcome === "reservation_expired" ? 409 : outcome === "context_rejected" ? 422 : 503,
      inputTokens: 1_234_567,
      outputTokens: 123_456,
      costMicrousd: 123_456_789_012,
      latencyMs: 123_456.7,
      gatewayLatencyMs: 1,
      errorDetail: null,
      overReservation: false,
    })),
  );
}

describe("console layout at 1280 and 390 px", { timeout: 90_000 }, () => {
  let browser: Browser;
  let gw: Gateway;
  before(async () => {
    mkdirSync(SCREENSHOTS, { recursive: true });
    browser = await launchChromium();
    gw = await startGateway();
    for (let i = 0; i < 3; i++) await (await gw.decide(sampleRequest())).text();
    await seedWideRecords(gw);
  });
  after(async () => {
    await browser?.close();
    await gw?.close();
  });

  for (const size of SIZES) {
    test(`${size.width}×${size.height}: the Usage history's last column inside its box; the run bar clear of the option rows`, async () => {
      const context = await browser.newContext({ viewport: { width: size.width, height: size.height }, baseURL: gw.url });
      const page = await context.newPage();
      page.setDefaultTimeout(8000);
      const watch = watchPage(page);
      try {
        await signIn(page, gw);

        // ── Playground: six questions, longer than the window, so the run bar sticks to its bottom.
        for (const type of ["choice", "score", "choice"]) await page.locator(`[data-add="${type}"]`).click();
        const bar = page.locator(".run-bar");
        assert.equal(await inPage(page, `getComputedStyle(document.querySelector(".run-bar")).position`), "sticky");
        const lastRow = page.locator("#question-list > li").last().locator(".crit-row").last();
        const rowBefore = page.locator("#question-list > li").last().locator(".crit-row").nth(-2);

        // Reached with Tab from the row before (the browser scrolls the focused field into view).
        await inPage(page, "window.scrollTo(0, 0)");
        await rowBefore.getByRole("button").focus();
        await inPage(page, "window.scrollTo(0, 0)");
        await page.keyboard.press("Tab");
        const focused = lastRow.locator("input").first();
        assert.equal(await inPage(page, `document.activeElement === ${LAST_ROW}.querySelector("input")`), true, "Tab reached the last row");
        const barBox = await box(bar);
        assert.ok(barBox.y + barBox.height <= size.height + 0.5, "the bar is in the window");
        assert.ok(!overlaps(await box(focused), barBox), "the focused field is not under the bar");

        // Scrolled into view up to its end (block "end", as a search or a script does).
        await inPage(page, `${LAST_ROW}.scrollIntoView({ block: "end" })`);
        const stuck = await box(bar);
        assert.ok(Math.abs(stuck.y + stuck.height - size.height) < 24, "the bar is stuck to the window's bottom");
        const rowBox = await box(lastRow);
        assert.ok(
          rowBox.y + rowBox.height <= stuck.y + 0.5,
          `the last option row ends above the bar: ${JSON.stringify({ rowBox, stuck })}`,
        );
        await page.screenshot({ path: join(SCREENSHOTS, `console-playground-${size.name}.png`) });

        // Scrolled to the end of the page: the bar is back under the form, clear of its rows and buttons.
        await inPage(page, "window.scrollTo(0, document.documentElement.scrollHeight)");
        const endBar = await box(bar);
        for (const part of [lastRow, page.locator(".add-questions")]) assert.ok(!overlaps(await box(part), endBar));
        assert.ok(await inPage(page, `document.documentElement.scrollWidth <= ${size.width}`), "no sideways scrolling");

        // ── Usage: every column shown is inside the table's box; nothing is hidden behind a sideways scroll.
        await page.getByRole("link", { name: "Usage" }).click();
        await page.locator("#usage-table tbody tr").nth(5).waitFor();
        const wrap = page.locator("#usage-table").locator("xpath=..");
        await wrap.scrollIntoViewIfNeeded();
        const fit = await inPage<{ scrollWidth: number; clientWidth: number; inner: { left: number; right: number }; cells: string[] }>(
          page,
          `(() => {
            const wrap = document.querySelector("#usage-table").parentElement;
            const r = wrap.getBoundingClientRect();
            const inner = { left: r.left + wrap.clientLeft, right: r.left + wrap.clientLeft + wrap.clientWidth };
            const shown = (el) => el.getClientRects().length > 0;
            const rows = [...document.querySelectorAll("#usage-table tr")];
            const cells = rows.map((tr) => [...tr.children].filter(shown).at(-1)).filter(Boolean)
              .filter((c) => { const b = c.getBoundingClientRect(); return b.right > inner.right + 0.5 || b.right > innerWidth + 0.5 || b.left < inner.left - 0.5; })
              .map((c) => c.className + " " + c.textContent);
            return { scrollWidth: wrap.scrollWidth, clientWidth: wrap.clientWidth, inner, cells };
          })()`,
        );
        assert.ok(fit.inner.right <= size.width, "the box is inside the window");
        assert.equal(fit.scrollWidth, fit.clientWidth, "nothing to scroll sideways inside the box");
        assert.deepEqual(fit.cells, [], "every row's last column inside the box");
        const lastHead = page.locator("#usage-table thead th:visible").last();
        const headBox = await box(lastHead);
        assert.ok(headBox.x >= fit.inner.left - 0.5 && headBox.x + headBox.width <= fit.inner.right + 0.5);
        assert.ok(await inPage(page, `document.documentElement.scrollWidth <= ${size.width}`), "no sideways page scrolling");

        // Every record's id and outcome are readable at this width (on a phone under the time and the outcome).
        const rows = await inPage<{ id: string; text: string }[]>(
          page,
          `[...document.querySelectorAll("#usage-table tbody tr")].map((tr) => ({ id: tr.dataset.requestId, text: tr.innerText }))`,
        );
        for (const row of rows) assert.ok(row.text.includes(row.id), `${row.id} shown: ${row.text}`);
        assert.ok(
          rows.some((r) => /Reservation\s+expired/.test(r.text) && r.text.includes("123456.789012")),
          "outcome and cost shown",
        );
        if (size.width < 700) assert.equal(await page.locator("#usage-table .col-id:visible").count(), 0, "fewer columns on a phone");
        else assert.equal(await page.locator("#usage-table thead th:visible").count(), 9, "every column at 1280 px");

        await page.locator("#history-title").scrollIntoViewIfNeeded();
        await inPage(page, `document.querySelector("#history-title").scrollIntoView({ block: "start" })`);
        await page.screenshot({ path: join(SCREENSHOTS, `console-usage-${size.name}.png`) });
        assert.deepEqual(watch.problems, [], "console errors, page errors or CSP violations");
      } finally {
        await context.close();
      }
    });
  }
});
