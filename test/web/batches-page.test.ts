/**
 * The console's Batches page in a real browser (Debian's chromium driven by playwright-core) against a real gateway
 * whose batch runner is off: the test finishes requests itself through the store. Submitting a file, the progress
 * moving while the page refreshes itself, cancelling, downloading the results, the line errors of a refused file,
 * paging with "More batches", labels and narrow screens.
 */
import assert from "node:assert/strict";
import { mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { Browser, BrowserContext, Locator, Page } from "playwright-core";
import type { ClaimedRequest } from "../../src/store/batches.ts";
import { type Gateway, sampleRequest, startGateway } from "../support/gateway-harness.ts";
import { inPage, launchChromium, type PageWatch, unlabelled, watchPage } from "./browser.ts";

/** Chrome logs non-2xx fetches as console errors; the test provokes a 422 on purpose. */
const EXPECTED_CONSOLE = /Failed to load resource: the server responded with a status of 422/;

const SCREENSHOTS = join(import.meta.dirname, "..", "..", "test-output", "screenshots");

const ndjson = (lines: unknown[]) => Buffer.from(`${lines.map((l) => (typeof l === "string" ? l : JSON.stringify(l))).join("\n")}\n`);
const requestLine = (customId: string): Record<string, unknown> => ({ custom_id: customId, ...sampleRequest() });

async function signIn(page: Page, gw: Gateway) {
  await page.goto("/console/");
  await page.getByLabel("API key", { exact: true }).fill(gw.key);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("heading", { name: "Playground", level: 1 }).waitFor();
}

async function submit(page: Page, name: string, body: Buffer) {
  await page.getByLabel("Requests file (.ndjson or .jsonl)").setInputFiles({ name, mimeType: "application/x-ndjson", buffer: body });
  await page.getByRole("button", { name: "Submit batch" }).click();
}

/** The ids of the batches listed, in their order. */
const shownIds = (page: Page) => inPage<string[]>(page, `[...document.querySelectorAll(".batch-card")].map((c) => c.dataset.batchId)`);

const cardOf = (page: Page, id: string) => page.locator(`.batch-card[data-batch-id="${id}"]`);

async function progressOf(card: Locator) {
  const bar = card.getByRole("progressbar");
  return {
    now: await bar.getAttribute("aria-valuenow"),
    max: await bar.getAttribute("aria-valuemax"),
    text: await bar.getAttribute("aria-valuetext"),
  };
}

async function finish(gw: Gateway, claimed: ClaimedRequest, status: number, costMicrousd: number) {
  const body = status === 200 ? { request_id: claimed.requestId, answers: {} } : { detail: "The model service returned HTTP 500" };
  const finished = await gw.store.batches.finishRequest({
    batchId: claimed.batchId,
    position: claimed.position,
    requestId: claimed.requestId,
    status,
    body: JSON.stringify(body),
    costMicrousd,
    nowMs: Date.now(),
  });
  assert.equal(finished, true);
}

/** The calls to GET /v1/batches/{id} the page made since `from`. */
/** A refresh reads the newest batches in one list page of 200; the first load and "Show more" read pages of 20. */
const isRefreshRead = (u: string) => {
  const url = new URL(u);
  return url.pathname === "/v1/batches" && url.searchParams.get("limit") === "200";
};
const isOneBatchRead = (u: string) => /\/v1\/batches\/batch_[^/]+$/.test(new URL(u).pathname);
const batchReads = (watch: PageWatch, from: number) => watch.requests.slice(from).filter((u) => isOneBatchRead(u) || isRefreshRead(u));

describe("the Batches page in a browser", { timeout: 120_000 }, () => {
  let browser: Browser;
  let gw: Gateway;
  let context: BrowserContext;
  let page: Page;
  let watch: PageWatch;
  before(async () => {
    mkdirSync(SCREENSHOTS, { recursive: true });
    browser = await launchChromium();
    gw = await startGateway({ runBatches: false });
    // Reduced motion: the bars take their widths at once (no transition to catch half-way on a busy machine).
    context = await browser.newContext({
      viewport: { width: 1280, height: 900 },
      baseURL: gw.url,
      acceptDownloads: true,
      reducedMotion: "reduce",
    });
    page = await context.newPage();
    page.setDefaultTimeout(10_000);
    watch = watchPage(page);
  });
  after(async () => {
    await context?.close();
    await browser?.close();
    await gw?.close();
  });

  test("submit a file, watch it progress, download the results, cancel it", async () => {
    await signIn(page, gw);
    await page.getByRole("link", { name: "Batches" }).click();
    await page.getByRole("heading", { name: "Batches", level: 1 }).waitFor();
    await page.locator("#batches-empty", { hasText: "No batches yet" }).waitFor();

    // The model list is the console's (GET /v1/models).
    const models = page.getByLabel("Batch model");
    const options = await models.locator("option").allInnerTexts();
    assert.ok(options.includes("fake-small") && options.includes("fake-large"), options.join(","));
    await models.selectOption("fake-small");

    await submit(page, "three.ndjson", ndjson([requestLine("a"), requestLine("b"), requestLine("c")]));
    const submitted = page.locator(".batch-submitted");
    await submitted.waitFor();
    const id = /Batch (batch_\S+) submitted/.exec(await submitted.innerText())?.[1];
    assert.ok(id, await submitted.innerText());
    assert.match(await submitted.innerText(), /3 requests, queued/);
    const card = cardOf(page, id);
    await card.waitFor();
    assert.equal(await card.locator(".batch-status").innerText(), "Queued");
    assert.deepEqual(await progressOf(card), { now: "0", max: "3", text: "0 of 3 finished: 0 succeeded, 0 failed" });
    assert.match(await card.locator(".batch-counts").innerText(), /0 \/ 3 finished/);
    assert.match(await card.innerText(), /fake-small/);
    assert.equal(await card.getByRole("button", { name: `Download results of batch ${id}` }).isVisible(), false, "nothing to download yet");
    const stored = (await (await gw.get(`/v1/batches/${id}`)).json()) as { model: string; status: string };
    assert.deepEqual([stored.model, stored.status], ["fake-small", "queued"]);

    // Three requests claimed, two finished (one succeeded, one failed): the page shows it by itself.
    const claimed = await gw.store.batches.claimRequests({
      instanceId: "t",
      nowMs: Date.now(),
      leaseUntilMs: Date.now() + 600_000,
      limit: 3,
    });
    assert.equal(claimed.length, 3);
    await finish(gw, claimed[0]!, 200, 1234);
    await finish(gw, claimed[1]!, 502, 0);
    await card.locator('[role="progressbar"][aria-valuenow="2"]').waitFor();
    assert.deepEqual(await progressOf(card), { now: "2", max: "3", text: "2 of 3 finished: 1 succeeded, 1 failed" });
    assert.equal(await card.locator(".batch-status").innerText(), "Running");
    assert.match(await card.locator(".batch-counts").innerText(), /2 \/ 3 finished · 1 succeeded · 1 failed/);
    assert.match(await card.innerText(), /0\.001234 USD/);
    const widths = await inPage<number[]>(
      page,
      `[...document.querySelectorAll('.batch-card[data-batch-id="${id}"] .batch-fill')].map((e) => e.getBoundingClientRect().width / e.parentElement.getBoundingClientRect().width)`,
    );
    assert.equal(widths.length, 2);
    for (const w of widths) assert.ok(Math.abs(w - 1 / 3) < 0.02, `each fill is a third of the bar: ${widths}`);

    // The results so far: one line per finished request.
    const [download] = await Promise.all([
      page.waitForEvent("download"),
      card.getByRole("button", { name: `Download results of batch ${id}` }).click(),
    ]);
    assert.equal(download.suggestedFilename(), `${id}-results.ndjson`);
    const lines = readFileSync((await download.path())!, "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { custom_id: string; status: number });
    assert.deepEqual(
      lines.map((l) => [l.custom_id, l.status]),
      [
        ["a", 200],
        ["b", 502],
      ],
    );

    // Cancel, confirmed in the dialog: the claimed request is still running, so the batch is cancelling.
    await card.getByRole("button", { name: `Cancel batch ${id}` }).click();
    const dialog = page.getByRole("dialog");
    await dialog.waitFor();
    assert.match(await dialog.innerText(), new RegExp(`Cancel batch ${id}\\?`));
    await dialog.getByRole("button", { name: "Keep it" }).click();
    await dialog.waitFor({ state: "hidden" });
    assert.equal(await card.locator(".batch-status").innerText(), "Running", "kept");
    await card.getByRole("button", { name: `Cancel batch ${id}` }).click();
    await dialog.getByRole("button", { name: "Cancel batch", exact: true }).click();
    await card.locator(".batch-status", { hasText: "Cancelling" }).waitFor();
    assert.equal(await card.getByRole("button", { name: `Cancel batch ${id}` }).count(), 0, "no Cancel button once cancelling");
    assert.equal(await page.locator("#confirm-cancel").innerText(), "Cancel", "the shared dialog is left as it was");

    // A refresh is one list read, not one read per running batch.
    const refreshFrom = watch.requests.length;
    await page.waitForRequest((r) => isRefreshRead(r.url()));
    assert.deepEqual(watch.requests.slice(refreshFrom).filter(isOneBatchRead), [], "the shown batch is refreshed from the list page");

    // While the browser tab is hidden nothing is fetched; shown again, the batch is fetched at once.
    const setHidden = (hidden: boolean) =>
      inPage(
        page,
        `Object.defineProperty(document, "hidden", { configurable: true, get: () => ${hidden} }); document.dispatchEvent(new Event("visibilitychange"))`,
      );
    await setHidden(true);
    const hiddenFrom = watch.requests.length;
    await page.waitForTimeout(4500);
    assert.deepEqual(batchReads(watch, hiddenFrom), [], "no refreshing while the tab is hidden");
    await Promise.all([page.waitForRequest((r) => isRefreshRead(r.url())), setHidden(false)]);

    // Away from the page nothing is fetched; back on it, the batch is fetched again.
    await page.getByRole("link", { name: "Usage" }).click();
    await page.getByRole("heading", { name: "Usage", level: 1 }).waitFor();
    const away = watch.requests.length;
    await page.waitForTimeout(4500);
    assert.deepEqual(batchReads(watch, away), [], "no refreshing while the page is not shown");

    await finish(gw, claimed[2]!, 200, 1000);
    await page.getByRole("link", { name: "Batches" }).click();
    await card.locator(".batch-status", { hasText: "Cancelled" }).waitFor();
    assert.deepEqual(await progressOf(card), { now: "3", max: "3", text: "3 of 3 finished: 2 succeeded, 1 failed" });
    assert.match(await card.innerText(), /0\.002234 USD/);
    assert.match(await card.innerText(), /\bEnded\b/i);

    // Nothing left going: the refreshing stops.
    const ended = watch.requests.length;
    await page.waitForTimeout(4500);
    assert.deepEqual(batchReads(watch, ended), [], "no refreshing once every shown batch has ended");

    const [again] = await Promise.all([
      page.waitForEvent("download"),
      card.getByRole("button", { name: `Download results of batch ${id}` }).click(),
    ]);
    assert.equal(
      readFileSync((await again.path())!, "utf8")
        .trim()
        .split("\n").length,
      3,
    );
  });

  test("a refused file lists its line errors; nothing is submitted", async () => {
    const before = ((await (await gw.get("/v1/batches")).json()) as { data: unknown[] }).data.length;
    const bad = requestLine("q");
    (bad.questions as Record<string, { type: string }>).topic!.type = "multiple";
    await submit(page, "bad.jsonl", ndjson([requestLine("ok"), "{not json", bad, { state: "x", questions: {} }]));
    const box = page.locator("#batch-upload-result .error-box");
    await box.waitFor();
    assert.equal(await box.getAttribute("role"), "alert");
    assert.match(await box.locator(".error-title").innerText(), /^HTTP 422: /);
    assert.match(await box.innerText(), /bad\.jsonl/);
    const items = await box.getByRole("list", { name: "Problems in the file" }).getByRole("listitem").allInnerTexts();
    assert.ok(items.length >= 3, items.join("\n"));
    assert.ok(
      items.some((t) => /^line 2\b/.test(t)),
      items.join("\n"),
    );
    assert.ok(
      items.some((t) => /^line 3: questions\.topic\.type\b/.test(t)),
      items.join("\n"),
    );
    assert.ok(
      items.some((t) => /^line 4\b/.test(t) && /custom_id/.test(t)),
      items.join("\n"),
    );
    assert.ok(!items.some((t) => /^line 1\b/.test(t)), "the valid line is not listed");
    assert.equal(await page.getByLabel("Requests file (.ndjson or .jsonl)").getAttribute("aria-invalid"), "true");
    assert.equal(((await (await gw.get("/v1/batches")).json()) as { data: unknown[] }).data.length, before);

    // Many bad lines: the first 50 the API names.
    await submit(page, "worse.ndjson", ndjson(Array.from({ length: 70 }, () => "[")));
    await box.locator("li").nth(49).waitFor();
    assert.equal(await box.locator("li").count(), 50);
    assert.match(await box.locator("li").first().innerText(), /^line 1\b/);
    assert.match(await box.locator("li").nth(49).innerText(), /^line 50\b/);

    // Choosing another file clears the error.
    await page
      .getByLabel("Requests file (.ndjson or .jsonl)")
      .setInputFiles({ name: "x.ndjson", mimeType: "application/x-ndjson", buffer: ndjson([requestLine("x")]) });
    assert.equal(await page.locator("#batch-upload-result").isVisible(), false);
    assert.equal(await page.getByLabel("Requests file (.ndjson or .jsonl)").getAttribute("aria-invalid"), null);
  });

  test('newest first, "More batches", labels, narrow screens, sign-out', async () => {
    const ids: string[] = [];
    for (let i = 0; i < 22; i++) {
      const res = await fetch(`${gw.url}/v1/batches`, {
        method: "POST",
        headers: { authorization: `Bearer ${gw.key}`, "content-type": "application/x-ndjson" },
        body: ndjson([requestLine(`n${i}`)]),
      });
      assert.equal(res.status, 202);
      ids.push(((await res.json()) as { id: string }).id);
    }
    const total = ((await (await gw.get("/v1/batches?limit=100")).json()) as { data: unknown[] }).data.length;
    assert.ok(total >= 23, String(total));

    await page.getByRole("button", { name: "Refresh" }).click();
    await page.locator(`.batch-card[data-batch-id="${ids.at(-1)}"]`).waitFor();
    assert.equal(await page.locator(".batch-card").count(), 20);
    const firstPage = await shownIds(page);
    assert.deepEqual(firstPage.slice(0, 20), [...ids].reverse().slice(0, 20), "newest first");
    const more = page.getByRole("button", { name: "More batches" });
    await more.click();
    await page
      .locator(".batch-card")
      .nth(total - 1)
      .waitFor();
    assert.equal(await page.locator(".batch-card").count(), total);
    await more.waitFor({ state: "hidden" });
    const all = await shownIds(page);
    assert.equal(new Set(all).size, all.length, "no batch twice");
    assert.deepEqual(all.slice(0, 22), [...ids].reverse());

    assert.deepEqual(await unlabelled(page), [], "every field and button has an accessible name");
    assert.equal(await page.getByRole("progressbar").count(), total);

    await inPage(page, "window.scrollTo(0, 0)");
    await page.screenshot({ path: join(SCREENSHOTS, "batches-desktop.png") });
    for (const width of [390, 360]) {
      await page.setViewportSize({ width, height: 800 });
      if (width === 390) await page.screenshot({ path: join(SCREENSHOTS, "batches-phone.png") });
      assert.ok(await inPage(page, `document.documentElement.scrollWidth <= ${width}`), `no horizontal scrolling at ${width} px`);
      const navRight = await inPage<number>(
        page,
        `Math.max(...[...document.querySelectorAll("#nav a")].map((a) => a.getBoundingClientRect().right))`,
      );
      assert.ok(navRight <= width, `the page links fit at ${width} px`);
    }
    await page.setViewportSize({ width: 1280, height: 900 });

    await page.getByRole("button", { name: "Sign out" }).click();
    await page.getByRole("heading", { name: "Sign in with an API key" }).waitFor();
    assert.equal(await page.locator(".batch-card").count(), 0, "nothing of the organization is left on the page");

    const origin = new URL(gw.url).origin;
    assert.deepEqual(
      watch.requests.filter((u) => new URL(u).origin !== origin && !u.startsWith("blob:")),
      [],
    );
    assert.deepEqual(
      watch.problems.filter((p) => !EXPECTED_CONSOLE.test(p)),
      [],
    );
  });
});
