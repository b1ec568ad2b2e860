/**
 * The console in a real browser (Debian's chromium driven by playwright-core) against a real
 * gateway with the fake model server: sign-in, a Playground request with all three question types,
 * answers, copying the request id, Usage (lookup, filters, paging, chart), validation errors next
 * to their fields, the quota-exhausted state, keyboard use, labels, and that the page talks to
 * nothing but the gateway. Screenshots go to test-output/screenshots/.
 */
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { type Gateway, sampleRequest, startGateway } from "../support/gateway-harness.ts";
import { seedUsage } from "../support/usage-fixtures.ts";
import { inPage, launchChromium, type PageWatch, unlabelled, watchPage } from "./browser.ts";

const SCREENSHOTS = join(import.meta.dirname, "..", "..", "test-output", "screenshots");
const DAY_MS = 86_400_000;

/** Chrome logs non-2xx fetches as console errors; the tests provoke 422, 429 and (a model down) 503 on purpose. */
const EXPECTED_CONSOLE = /Failed to load resource: the server responded with a status of (401|402|404|422|429|503)/;

function assertOnlyGateway(watch: PageWatch, gw: Gateway) {
  assert.ok(watch.requests.length > 5, "the page made requests");
  const origin = new URL(gw.url).origin;
  const foreign = watch.requests.filter((url) => new URL(url).origin !== origin);
  assert.deepEqual(foreign, [], `requests to another host than ${origin}`);
  assert.ok(origin.startsWith("http://127.0.0.1:"));
  const problems = watch.problems.filter((p) => !EXPECTED_CONSOLE.test(p));
  assert.deepEqual(problems, [], "console errors, page errors or CSP violations");
}

async function newPage(
  browser: Browser,
  gw: Gateway,
  viewport = { width: 1280, height: 900 },
): Promise<{ context: BrowserContext; page: Page; watch: PageWatch }> {
  const context = await browser.newContext({ viewport, baseURL: gw.url });
  await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: gw.url });
  const page = await context.newPage();
  page.setDefaultTimeout(8000);
  const watch = watchPage(page);
  return { context, page, watch };
}

async function signIn(page: Page, gw: Gateway) {
  const response = await page.goto("/");
  assert.equal(new URL(page.url()).pathname, "/console/");
  assert.match(response?.headers()["content-security-policy"] ?? "", /default-src 'self'/);
  await page.getByRole("heading", { name: "Sign in with an API key" }).waitFor();
  await page.getByLabel("API key", { exact: true }).fill(gw.key);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("heading", { name: "Playground", level: 1 }).waitFor();
}

const card = (page: Page, n: number) => page.locator("#question-list > li").nth(n - 1);

describe("console in a browser", { timeout: 60_000 }, () => {
  let browser: Browser;
  before(async () => {
    mkdirSync(SCREENSHOTS, { recursive: true });
    browser = await launchChromium();
  });
  after(async () => {
    await browser?.close();
  });

  test("sign in, build and run a request, answers, copy the id, usage, validation errors, keyboard, labels, sign out", async () => {
    const gw = await startGateway();
    const { context, page, watch } = await newPage(browser, gw);
    try {
      await signIn(page, gw);
      await assert.doesNotReject(page.locator("#status-strip").getByText("Preview (free)").waitFor());
      assert.match(await page.locator("#st-rate").innerText(), /100,000 requests \/ min/);
      await page.locator("#st-models", { hasText: "All 2 ready" }).waitFor();
      assert.equal(await inPage(page, `sessionStorage.getItem("tds.console.apiKey")`), gw.key);
      assert.equal(await inPage(page, "localStorage.length"), 0);

      // Start from nothing: remove the example's questions.
      for (let i = 0; i < 3; i++) await page.getByRole("button", { name: "Remove question 1" }).click();
      assert.equal(await page.locator("#question-list > li").count(), 0);

      // A choice question from its template.
      await page.getByRole("button", { name: "Add a choice question" }).click();
      const choice = card(page, 1);
      await choice.getByLabel("Question id").fill("topic");
      await choice.getByLabel("Instructions").fill("What is the ticket about?");
      for (const [i, name, description] of [
        [1, "billing", "Payments and invoices"],
        [2, "bug", "Something is broken"],
        [3, "other", ""],
      ] as const) {
        await page.getByLabel(`Question 1, option ${i} name`).fill(name);
        await page.getByLabel(`Question 1, option ${i} description`).fill(description);
      }
      await page.getByRole("button", { name: "Add an option to question 1" }).click();
      await page.getByLabel("Question 1, option 4 name").fill("spam");
      await page.getByRole("button", { name: "Remove option 4 of question 1" }).click();
      assert.equal(await choice.locator(".crit-row").count(), 3);

      // A score question with one more level.
      await page.getByRole("button", { name: "Add a score question" }).click();
      const score = card(page, 2);
      await score.getByLabel("Question id").fill("urgency");
      await score.getByLabel("Instructions").fill("How urgent is it?");
      await page.getByRole("button", { name: "Add a level to question 2" }).click();
      await page.getByLabel("Question 2, level 4 description").fill("emergency");
      assert.equal(await score.locator(".crit-row").count(), 5);

      // A noul question, moved to the top with the up buttons.
      await page.getByRole("button", { name: "Add a noul (yes/no) question" }).click();
      const noul = card(page, 3);
      await noul.getByLabel("Question id").fill("refund");
      await noul.getByLabel("Instructions").fill("Does the customer ask for a refund?");
      await noul.getByLabel("When true").fill("asks for money back");
      await page.getByRole("button", { name: "Move question 3 up" }).click();
      await page.getByRole("button", { name: "Move question 2 up" }).click();
      const ids = await inPage(page, `[...document.querySelectorAll("#question-list .input-id")].map((e) => e.value)`);
      assert.deepEqual(ids, ["refund", "topic", "urgency"]);

      // State as JSON, validated while typing.
      await page.locator('label[for="state-mode-json"]').click();
      const state = page.getByLabel("State (text or JSON)");
      await state.fill('{"ticket": "I was charged twice for my subscription", "tier": ');
      assert.match(await page.locator("#state-json-status").innerText(), /Not valid JSON/);
      assert.equal(await state.getAttribute("aria-invalid"), "true");
      await state.fill('{"ticket": "I was charged twice for my subscription", "tier": "gold"}');
      assert.match(await page.locator("#state-json-status").innerText(), /Valid JSON \(object, 2 keys\)/);

      // A model from GET /v1/models.
      const modelOptions = await page.getByLabel("Model", { exact: true }).locator("option").allInnerTexts();
      assert.ok(modelOptions.includes("fake-small") && modelOptions.includes("fake-large"), modelOptions.join(","));
      await page.getByLabel("Model", { exact: true }).selectOption("fake-small");

      const labelsMissing = await unlabelled(page);
      assert.deepEqual(labelsMissing, [], "every field and button has an accessible name");

      // Run with the button.
      await page.getByRole("button", { name: "Run request" }).click();
      await page.locator(".acard").nth(2).waitFor();
      assert.deepEqual(await page.locator(".acard .acard-title").allInnerTexts(), ["refund", "topic", "urgency"]);
      const chosen = await page.locator(".acard-choice .answer-value").innerText();
      assert.ok(["billing", "bug", "other"].includes(chosen), chosen);
      assert.equal(await page.locator(".acard-choice .prob").count(), 3);
      assert.equal(await page.locator(".acard-score .prob").count(), 5);
      await page.locator(".acard-score .scale-marker").waitFor();
      await page.locator(".acard-noul svg.gauge").waitFor();
      assert.match(await page.locator(".acard-noul").innerText(), /P\(TRUE\)|P\(true\)/);
      await page.locator("#announcer", { hasText: "Answers received" }).waitFor();
      const meta = await page.locator("#result-meta").innerText();
      for (const word of [/Tokens/i, /Cost/i, /Mode/i, /Model latency/i, /fake-small/, /preview/]) assert.match(meta, word);
      const requestId = await page.locator("#result-request-id").innerText();
      assert.match(requestId, /^req_/);

      // The request reached the model as edited and was recorded as a Playground request.
      const sent = gw.fake!.received.at(-1)!;
      assert.deepEqual(sent.state, { ticket: "I was charged twice for my subscription", tier: "gold" });
      assert.deepEqual(Object.keys(sent.questions as object), ["refund", "topic", "urgency"]);
      assert.deepEqual((sent.questions as Record<string, { criteria: unknown }>).urgency!.criteria, [
        "not at all",
        "a little",
        "clearly",
        "strongly",
        "emergency",
      ]);
      const record = (await (await gw.get(`/v1/usage/${requestId}`)).json()) as { source: string; model: string };
      assert.equal(record.source, "playground");
      assert.equal(record.model, "fake-small");

      // Copy the request id with the clipboard API.
      await page.getByRole("button", { name: "Copy request id" }).click();
      await page.locator(".copy-status", { hasText: "Copied" }).waitFor();
      assert.equal(await inPage<string>(page, "navigator.clipboard.readText()"), requestId);

      // Raw JSON and code.
      await page.locator("#raw-details summary").click();
      const rawRequest = JSON.parse(await page.locator("#raw-request").innerText());
      assert.equal(rawRequest.model, "fake-small");
      assert.equal(JSON.parse(await page.locator("#raw-response").innerText()).request_id, requestId);
      await page.locator("#code-details summary").click();
      await page.locator("#code-curl", { hasText: "curl -s" }).waitFor();
      const curl = await page.locator("#code-curl").innerText();
      assert.match(curl, new RegExp(`^curl -s ${gw.url}/v1/systemone`));
      assert.match(curl, /Authorization: Bearer \$TDS_KEY/);
      assert.ok(!curl.includes(gw.key), "no key in the snippet");
      assert.deepEqual(JSON.parse(curl.slice(curl.indexOf("-d '") + 4, curl.lastIndexOf("'"))), rawRequest);
      const ts = await page.locator("#code-ts").innerText();
      assert.ok(ts.includes(`new TypeSafeClient({ apiKey: process.env.TDS_KEY, baseURL: "${gw.url}" })`), ts);
      assert.match(ts, /import \{ TypeSafeClient \} from "@typesafe-ai\/sdk";/);
      assert.match(ts, /client\.systemOne\(\{\n {2}model: "fake-small",/);
      await page.locator("#code-details summary").click();
      await page.locator("#raw-details summary").click();

      await page.locator("#results").scrollIntoViewIfNeeded();
      await inPage(page, "window.scrollTo(0, 0)");
      await page.screenshot({ path: join(SCREENSHOTS, "playground-desktop.png") });

      // Ctrl+Enter runs from the keyboard.
      await state.focus();
      await page.keyboard.press("Control+Enter");
      await page.locator("#result-request-id").filter({ hasNotText: requestId }).waitFor();
      const secondId = await page.locator("#result-request-id").innerText();
      assert.notEqual(secondId, requestId);
      assert.equal(await inPage(page, "document.activeElement?.id"), "state-input", "the focus stays where it was");

      // Phone size: one column, nothing wider than the screen.
      await page.setViewportSize({ width: 390, height: 844 });
      await inPage(page, "window.scrollTo(0, document.documentElement.scrollHeight)");
      assert.ok(await inPage(page, "document.documentElement.scrollWidth <= 390"), "no horizontal scrolling at 390 px");
      await page.screenshot({ path: join(SCREENSHOTS, "playground-phone.png"), fullPage: true });
      await page.setViewportSize({ width: 360, height: 740 });
      assert.ok(await inPage(page, "document.documentElement.scrollWidth <= 360"), "no horizontal scrolling at 360 px");
      await page.setViewportSize({ width: 1280, height: 900 });

      // Validation errors from the server next to the fields they name.
      for (let i = 0; i < 5; i++) await page.getByRole("button", { name: "Remove level 0 of question 3" }).click();
      await card(page, 2).getByLabel("Question id").fill("");
      await page.keyboard.press("Control+Enter");
      await page.locator("#general-error", { hasText: "HTTP 422" }).waitFor();
      assert.equal(
        await inPage(page, `document.activeElement === document.querySelectorAll("#question-list > li")[1].querySelector(".input-id")`),
        true,
        "the focus stays in the field being edited when the list is redrawn",
      );
      const idError = card(page, 2).locator(".field-id .field-error");
      assert.match(await idError.innerText(), /id must be 1 to 100 characters/);
      assert.equal(await card(page, 2).getByLabel("Question id").getAttribute("aria-invalid"), "true");
      const idErrorId = await idError.getAttribute("id");
      assert.ok((await card(page, 2).getByLabel("Question id").getAttribute("aria-describedby"))?.includes(idErrorId!));
      assert.match(await card(page, 3).locator("fieldset.criteria.has-error .field-error").innerText(), /must have at least 1 levels/);
      assert.equal(await card(page, 1).locator(".field-error:visible").count(), 0, "no error on the valid question");
      await page.locator("#announcer", { hasText: "HTTP 422" }).waitFor();
      // Editing the field clears its error.
      await card(page, 2).getByLabel("Question id").fill("topic");
      assert.equal(await idError.isVisible(), false);

      // Usage: 26 more requests from the API today, and 34 older records over the six days before
      // (5 of them model errors); then paging, lookup, filters, totals and the chart.
      for (let i = 0; i < 26; i++) await (await gw.decide(sampleRequest())).text();
      const startOfToday = Math.floor(Date.now() / DAY_MS) * DAY_MS;
      let seeded = 0;
      for (const [daysAgo, count] of [
        [1, 6],
        [2, 9],
        [3, 4],
        [4, 7],
        [5, 3],
        [6, 5],
      ] as const) {
        for (let i = 0; i < count; i++) {
          const failed = i === 0 && daysAgo !== 3;
          await seedUsage(gw.store, [
            {
              requestId: `req_seed${daysAgo}x${i}`,
              orgId: gw.orgId,
              keyId: gw.keyId,
              createdAtMs: startOfToday - daysAgo * DAY_MS + 9 * 3_600_000 + i * 600_000,
              source: i % 3 === 0 ? "playground" : "api",
              model: "fake-small",
              mode: "preview",
              outcome: failed ? "model_error" : "succeeded",
              httpStatus: failed ? 502 : 200,
              inputTokens: failed ? 0 : 100 + i,
              outputTokens: failed ? 0 : 3,
              costMicrousd: 0,
              latencyMs: failed ? null : 2 + i / 10,
              gatewayLatencyMs: 1,
              errorDetail: failed ? "The model service returned HTTP 500" : null,
              overReservation: false,
            },
          ]);
          seeded++;
        }
      }
      await page.getByRole("link", { name: "Usage" }).click();
      await page.getByRole("heading", { name: "Usage", level: 1 }).waitFor();
      await page.locator("#usage-table tbody tr").nth(24).waitFor();
      assert.equal(await page.locator("#usage-table tbody tr").count(), 25);
      assert.equal(await page.locator("#today-requests").innerText(), "28");
      assert.equal(await page.locator("#usage-chart rect.chart-bar").count(), 14);
      const allIds = await page.locator("#usage-table tbody .col-id code").allInnerTexts();
      for (let p = 2; !(await page.getByRole("button", { name: "Older →" }).isDisabled()); p++) {
        await page.getByRole("button", { name: "Older →" }).click();
        await page.locator("#page-info", { hasText: `Page ${p} ·` }).waitFor();
        allIds.push(...(await page.locator("#usage-table tbody .col-id code").allInnerTexts()));
      }
      assert.equal(allIds.length, 28 + seeded);
      assert.equal(new Set(allIds).size, allIds.length, "no record twice");
      assert.deepEqual(allIds.slice(26, 28), [secondId, requestId], "newest first: the two Playground runs are today's oldest");
      assert.equal(allIds.at(-1), "req_seed6x0", "the oldest record last");
      await page.locator("#page-info", { hasText: `Page 3 · ${28 + seeded - 50} records` }).waitFor();
      await page.getByRole("button", { name: "← Newer" }).click();
      await page.getByRole("button", { name: "← Newer" }).click();
      await page.locator("#page-info", { hasText: "Page 1 · 25 records" }).waitFor();
      assert.equal(await page.getByRole("button", { name: "← Newer" }).isDisabled(), true);

      await page.getByLabel("Request id", { exact: true }).fill(await inPage<string>(page, "navigator.clipboard.readText()"));
      await page.getByRole("button", { name: "Find" }).click();
      const found = page.locator(".record-card");
      await found.waitFor();
      const foundText = await found.innerText();
      assert.ok(foundText.includes(requestId) && foundText.includes("Succeeded") && foundText.includes("playground"), foundText);
      await page.getByLabel("Request id", { exact: true }).fill("req_nope");
      await page.getByRole("button", { name: "Find" }).click();
      await page.locator(".lookup-missing", { hasText: "No usage record" }).waitFor();

      await page.getByLabel("Outcome").selectOption("model_error");
      await page.getByRole("button", { name: "Apply" }).click();
      await page.locator("#page-info", { hasText: "Page 1 · 5 records" }).waitFor();
      assert.deepEqual(await page.locator("#usage-table tbody .badge").allInnerTexts(), Array(5).fill("Model error"));
      await page.getByRole("button", { name: "Clear" }).click();
      await page.locator("#usage-table tbody tr").nth(24).waitFor();
      await page.getByLabel("From (your time)").fill("2000-01-01T00:00:00");
      await page.getByLabel("Until (your time, exclusive)").fill("2000-01-02T00:00:00");
      await page.getByRole("button", { name: "Apply" }).click();
      await page.locator("#usage-empty").waitFor();
      // A window of the day before yesterday (UTC; the browser runs in the machine's zone): its 9 records.
      const local = (ms: number) => new Date(ms - new Date(ms).getTimezoneOffset() * 60_000).toISOString().slice(0, 19);
      await page.getByLabel("From (your time)").fill(local(startOfToday - 2 * DAY_MS));
      await page.getByLabel("Until (your time, exclusive)").fill(local(startOfToday - DAY_MS));
      await page.getByRole("button", { name: "Apply" }).click();
      await page.locator("#page-info", { hasText: "Page 1 · 9 records" }).waitFor();
      await page.getByRole("button", { name: "Clear" }).click();
      await page.locator("#usage-table tbody tr").nth(24).waitFor();

      await page.getByLabel("Request id", { exact: true }).fill(requestId);
      await page.getByRole("button", { name: "Find" }).click();
      await found.waitFor();
      await inPage(page, "window.scrollTo(0, 0)");
      await page.screenshot({ path: join(SCREENSHOTS, "usage-desktop.png") });
      await page.screenshot({ path: join(SCREENSHOTS, "usage-desktop-full.png"), fullPage: true });
      await page.setViewportSize({ width: 390, height: 844 });
      assert.ok(await inPage(page, "document.documentElement.scrollWidth <= 390"), "usage: no horizontal page scrolling at 390 px");
      await page.screenshot({ path: join(SCREENSHOTS, "usage-phone.png"), fullPage: true });
      await page.setViewportSize({ width: 360, height: 740 });
      assert.ok(await inPage(page, "document.documentElement.scrollWidth <= 360"), "usage: no horizontal page scrolling at 360 px");
      await page.setViewportSize({ width: 1280, height: 900 });
      assert.deepEqual(await unlabelled(page), []);

      // Sign out forgets the key.
      await page.getByRole("button", { name: "Sign out" }).click();
      await page.getByRole("heading", { name: "Sign in with an API key" }).waitFor();
      assert.equal(await inPage(page, "sessionStorage.length + localStorage.length"), 0);
      assert.equal(await inPage(page, "document.cookie"), "");
      assert.equal(await page.locator("#usage-table tbody tr").count(), 0, "nothing of the organization is left on the page");

      assertOnlyGateway(watch, gw);
    } finally {
      await context.close();
      await gw.close();
    }
  });

  test("the quota-exhausted state: which limit and when it resets; the run button by keyboard", async () => {
    const gw = await startGateway({ env: { TDS_PREVIEW_REQUEST_LIMIT: "1" } });
    const { context, page, watch } = await newPage(browser, gw);
    try {
      await signIn(page, gw);
      assert.match(await page.locator("#st-quota").innerText(), /^1 of 1/);
      await page.getByRole("button", { name: "Run request" }).click();
      await page.locator(".acard").first().waitFor();
      await page.locator("#st-quota", { hasText: "0 of 1" }).waitFor();
      // The organization's own numbers already say so (GET /v1/organization after the run).
      await page.locator("#limit-banner", { hasText: "Your organization has used all 1 preview requests of today" }).waitFor();

      // Keyboard: Tab from the model select reaches the run button; Enter presses it.
      await page.getByLabel("Model", { exact: true }).focus();
      await page.keyboard.press("Tab");
      assert.equal(await inPage(page, "document.activeElement?.id"), "run-button");
      await page.keyboard.press("Enter");

      const banner = page.locator("#limit-banner");
      await page.locator("#general-error", { hasText: "HTTP 429" }).waitFor();
      assert.equal(await banner.getAttribute("role"), "alert");
      const text = await banner.innerText();
      assert.match(text, /Daily preview limit reached/);
      assert.match(text, /they reset at \d{4}-\d{2}-\d{2} 00:00 UTC/);
      assert.doesNotMatch(text, /preview_request_limit/, "no server setting named to a key holder");
      const midnight = new Date(Math.floor(Date.now() / DAY_MS) * DAY_MS + DAY_MS).toISOString();
      assert.equal(await banner.locator("time").getAttribute("datetime"), midnight);
      assert.match(await page.locator("#general-error").innerText(), /HTTP 429: The request was not run\. Daily preview limit reached\./);

      // Reloading keeps the session (sessionStorage) and shows the same state from GET /v1/organization.
      await page.reload();
      await banner.waitFor();
      assert.equal(await banner.locator("time").getAttribute("datetime"), midnight);
      assert.match(await page.locator("#st-quota").innerText(), /^0 of 1/);

      assertOnlyGateway(watch, gw);
    } finally {
      await context.close();
      await gw.close();
    }
  });

  test("paid mode: credits in the status strip; a 402 says credits, a 429 says the per-minute limit and when to retry", async () => {
    const gw = await startGateway({
      env: { TDS_SERVICE_MODE: "paid", TDS_PRICE_PER_MILLION_INPUT_USD: "1", TDS_RESERVE_TOKENS: "1000", TDS_REQUESTS_PER_MINUTE: "2" },
    });
    const { context, page, watch } = await newPage(browser, gw);
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 1000, nowMs: Date.now() });
      await signIn(page, gw);
      assert.match(await page.locator("#status-strip").innerText(), /Paid/);
      assert.equal(await page.locator("#st-quota").innerText(), "0.001 USD", 'nothing reserved: no second part, no "null"');
      assert.match(await page.locator("#st-rate").innerText(), /^2 requests \/ min/);
      const run = page.getByRole("button", { name: "Run request" });

      await run.click();
      await page.locator(".acard").first().waitFor();
      assert.doesNotMatch(await page.locator("#result-meta").innerText(), /\b0 USD/, "a paid request costs something");

      await run.click();
      const banner = page.locator("#limit-banner");
      await banner.filter({ hasText: "Not enough credits" }).waitFor();
      await page.locator("#general-error", { hasText: "HTTP 402" }).waitFor();

      await run.click();
      await banner.filter({ hasText: "Per-minute rate limit reached" }).waitFor();
      assert.match(await banner.innerText(), /try again in (5\d|60) s/);
      const retryAt = Date.parse((await banner.locator("time").getAttribute("datetime"))!);
      assert.ok(Math.abs(retryAt - (Date.now() + 60_000)) < 5_000, "about a minute from now");
      assertOnlyGateway(watch, gw);
    } finally {
      await context.close();
      await gw.close();
    }
  });

  test('a failed run shows its error and request id, and no stray "null" text', async () => {
    const gw = await startGateway({ env: { TDS_PREVIEW_REQUEST_LIMIT: "0" } });
    const { context, page, watch } = await newPage(browser, gw);
    const nullText = (selector: string) =>
      inPage<string[]>(
        page,
        `[...document.querySelectorAll(${JSON.stringify(selector)})].flatMap((el) => {
          const texts = [];
          const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
          while (walk.nextNode()) if (/\\bnull\\b/.test(walk.currentNode.nodeValue)) texts.push(walk.currentNode.parentElement.outerHTML.slice(0, 200));
          return texts;
        })`,
      );
    try {
      await signIn(page, gw);
      // A 429 without field errors: the title and the request id, nothing else.
      await page.getByRole("button", { name: "Run request" }).click();
      const box = page.locator("#general-error");
      await box.filter({ hasText: "HTTP 429" }).waitFor();
      await box.locator("code", { hasText: /^req_/ }).waitFor();
      assert.deepEqual(await inPage(page, `[...document.querySelector("#general-error").children].map((e) => e.className)`), [
        "error-title",
        "error-meta",
      ]);
      assert.doesNotMatch(await box.innerText(), /\bnull\b/);
      assert.deepEqual(await nullText("#general-error, #question-list, #status-strip, #limit-banner"), []);

      // A 422 whose only error is placed next to its field: no list of unplaced errors either.
      await card(page, 1).getByLabel("Question id").fill("");
      await page.getByRole("button", { name: "Run request" }).click();
      await box.filter({ hasText: "HTTP 422" }).waitFor();
      assert.doesNotMatch(await box.innerText(), /\bnull\b/);
      assert.deepEqual(await nullText("#general-error, #question-list, #status-strip"), []);
      assertOnlyGateway(watch, gw);
    } finally {
      await context.close();
      await gw.close();
    }
  });

  test("the status strip shows a degraded model, then an unavailable one", async () => {
    const servers = await Promise.all([startFakeModelServer(), startFakeModelServer()]);
    const dir = mkdtempSync(join(tmpdir(), "tds-console-routing-"));
    const path = join(dir, "config.json");
    writeFileSync(
      path,
      JSON.stringify({
        model_services: servers.map((s, i) => ({ name: `gpu-${i + 1}`, url: s.url })),
        models: [{ name: "decider", deployments: servers.map((_, i) => ({ service: `gpu-${i + 1}`, upstream_name: "fake-large" })) }],
      }),
    );
    const gw = await startGateway({
      fake: false,
      env: { TDS_CONFIG: path },
      routerOptions: { failureThreshold: 1, cooldownInitialMs: 60_000, cooldownMaxMs: 60_000, healthCheckIntervalMs: null },
    });
    const { context, page, watch } = await newPage(browser, gw);
    const failedOver: string[] = [];
    /** Sends n requests, or (n = 0) until one has met the closed server (the balancer picks at random). */
    const send = async (n: number) => {
      for (let i = 0; n === 0 ? failedOver.length === 0 && i < 100 : i < n; i++) {
        const res = await gw.decide(sampleRequest());
        await res.arrayBuffer();
        const id = res.headers.get("x-service-request-id")!;
        if ((await gw.store.getUsage(gw.orgId, id))?.attempts === 2) failedOver.push(id);
      }
    };
    try {
      await servers[0]!.close();
      await send(0); // the request that meets the closed server fails over; the server cools down
      await signIn(page, gw);
      const models = page.locator("#st-models");
      await models.filter({ hasText: "decider degraded (1 of 2 deployments healthy)" }).waitFor();
      await page.screenshot({ path: join(SCREENSHOTS, "status-degraded.png") });
      // The request that met the closed server: its record names the deployment that answered.
      assert.equal(failedOver.length, 1, "one request met the closed server before its cooldown");
      await page.getByRole("link", { name: "Usage" }).click();
      await page.getByLabel("Request id", { exact: true }).fill(failedOver[0]!);
      await page.getByRole("button", { name: "Find" }).click();
      await page.locator(".record-card", { hasText: "gpu-2 (after 2 attempts)" }).waitFor();
      await page.getByRole("link", { name: "Playground" }).click();

      await servers[1]!.close();
      await send(2);
      await page.reload();
      await models.filter({ hasText: "decider unavailable (no healthy deployment)" }).waitFor();
      assert.equal(await models.locator(".st-unavailable").count(), 1);
      assertOnlyGateway(watch, gw);
    } finally {
      await context.close();
      await gw.close();
      await Promise.all(servers.map((s) => s.close()));
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("a wrong key is refused and not kept", async () => {
    const gw = await startGateway();
    const { context, page, watch } = await newPage(browser, gw, { width: 360, height: 740 });
    try {
      await page.goto("/console/");
      await page.getByLabel("API key", { exact: true }).fill("tds_nope_nope");
      await page.getByRole("button", { name: "Sign in" }).click();
      await page.locator("#signin-error", { hasText: "not accepted" }).waitFor();
      assert.equal(await inPage(page, "sessionStorage.length"), 0);
      assert.equal(await page.getByRole("heading", { name: "Playground" }).count(), 0);
      assert.deepEqual(await unlabelled(page), []);
      assertOnlyGateway(watch, gw);
    } finally {
      await context.close();
      await gw.close();
    }
  });
});
