/**
 * What the console tells the person signed in with an API key when a Playground run is refused, in Debian's chromium
 * against a real gateway: a 402 asks them to have their administrator add credits (no operator command), a 429 says
 * the wait once, and the id of a request refused before it was accepted is a reference for support — not a request
 * id to look up in Usage, which has no record of it — while an accepted request that failed is findable by its id.
 */
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { Browser, Page } from "playwright-core";
import { type Gateway, startGateway } from "../support/gateway-harness.ts";
import { inPage, launchChromium, type PageWatch, watchPage } from "./browser.ts";

const SCREENSHOTS = join(import.meta.dirname, "..", "..", "test-output", "screenshots");
/** Chrome logs non-2xx fetches as console errors; these runs are refused on purpose. */
const EXPECTED_CONSOLE = /Failed to load resource: the server responded with a status of (402|403|404|422|429|502)/;

function assertClean(watch: PageWatch, gw: Gateway) {
  const origin = new URL(gw.url).origin;
  assert.deepEqual(
    watch.requests.filter((url) => new URL(url).origin !== origin),
    [],
    "requests to another host",
  );
  assert.deepEqual(
    watch.problems.filter((p) => !EXPECTED_CONSOLE.test(p)),
    [],
    "console errors, page errors or CSP violations",
  );
}

async function signIn(page: Page, gw: Gateway) {
  await page.goto("/console/");
  await page.getByLabel("API key", { exact: true }).fill(gw.key);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("heading", { name: "Playground", level: 1 }).waitFor();
}

/** Clicks Run and returns the x-service-request-id of the answer. */
async function run(page: Page): Promise<{ status: number; requestId: string }> {
  const answer = page.waitForResponse((r) => new URL(r.url()).pathname === "/v1/systemone");
  await page.getByRole("button", { name: "Run request" }).click();
  const response = await answer;
  const requestId = response.headers()["x-service-request-id"];
  assert.match(requestId ?? "", /^req_/);
  return { status: response.status(), requestId: requestId! };
}

/** The text a person sees (closed disclosures and hidden parts are not rendered, so not in innerText). */
const visibleText = (page: Page) => inPage<string>(page, "document.body.innerText");

/** The line under the error: its data-recorded and its text, once the run's answer is shown. */
async function referenceOf(page: Page, requestId: string) {
  const line = page.locator("#general-error .error-meta", { hasText: requestId });
  await line.waitFor();
  return { recorded: await line.getAttribute("data-recorded"), text: await line.innerText() };
}

const NOT_RECORDED = /^Reference for support: req_\w+\. The request was refused before it was accepted, so Usage has no record of it\.$/;

describe("console messages to a key holder", { timeout: 60_000 }, () => {
  let browser: Browser;
  before(async () => {
    mkdirSync(SCREENSHOTS, { recursive: true });
    browser = await launchChromium();
  });
  after(async () => {
    await browser?.close();
  });

  test("402 asks the administrator for credits, 429 says the wait once; their ids are references, not in Usage", async () => {
    const gw = await startGateway({
      env: { TDS_SERVICE_MODE: "paid", TDS_PRICE_PER_MILLION_INPUT_USD: "1", TDS_RESERVE_TOKENS: "1000", TDS_REQUESTS_PER_MINUTE: "2" },
    });
    const context = await browser.newContext({ viewport: { width: 390, height: 844 }, baseURL: gw.url });
    const page = await context.newPage();
    page.setDefaultTimeout(8000);
    const watch = watchPage(page);
    try {
      await gw.store.grantCredits({ orgId: gw.orgId, amountMicrousd: 1000, nowMs: Date.now() });
      await signIn(page, gw);
      const banner = page.locator("#limit-banner");
      const box = page.locator("#general-error");

      assert.equal((await run(page)).status, 200, "the first run spends part of the credits");
      await page.locator(".acard").first().waitFor();

      // 402: what it means for the organization and whom to ask; no command of the operator's CLI.
      const refused = await run(page);
      assert.equal(refused.status, 402);
      await banner.filter({ hasText: "Not enough credits." }).waitFor();
      assert.equal(
        await banner.innerText(),
        "Not enough credits. Your organization has no credits left for this request; ask your administrator to add credits.",
      );
      await box.filter({ hasText: "HTTP 402" }).waitFor();
      const boxText = await box.innerText();
      assert.match(boxText, /^HTTP 402: The request was not run\. Not enough credits\./);
      assert.match(boxText, /cannot cover the reservation of this request/, "the server's amounts are kept");
      let text = await visibleText(page);
      assert.doesNotMatch(text, /\btds [a-z]/i, "no tds command for a key holder");
      assert.doesNotMatch(text, /credits grant|TDS_[A-Z]/);
      const ref402 = await referenceOf(page, refused.requestId);
      assert.equal(ref402.recorded, "false");
      assert.match(ref402.text, NOT_RECORDED);
      assert.doesNotMatch(boxText, /Request id/, "not offered as a request id to look up");

      // 429 of the per-minute limit: one sentence with the wait, said once on the whole page.
      const limited = await run(page);
      assert.equal(limited.status, 429);
      await banner.filter({ hasText: "Per-minute rate limit reached." }).waitFor();
      await box.filter({ hasText: "HTTP 429" }).waitFor();
      assert.match(
        await banner.innerText(),
        /^Per-minute rate limit reached\. Your organization has reached its limit of 2 requests per minute; try again in (5\d|60) s \(at [^)]+\)\.$/,
      );
      assert.equal(await box.locator(".error-title").innerText(), "HTTP 429: The request was not run. Per-minute rate limit reached.");
      text = await visibleText(page);
      assert.equal(text.match(/\b\d+ s\b/g)?.length, 1, `the wait once: ${text}`);
      assert.equal(text.match(/try again/gi)?.length, 1);
      assert.doesNotMatch(text, /retry in|requests_per_minute/i);
      const ref429 = await referenceOf(page, limited.requestId);
      assert.equal(ref429.recorded, "false");
      assert.match(ref429.text, NOT_RECORDED);
      await inPage(page, "window.scrollTo(0, 0)");
      await page.screenshot({ path: join(SCREENSHOTS, "limit-429-phone.png") });
      await box.scrollIntoViewIfNeeded();
      await page.screenshot({ path: join(SCREENSHOTS, "limit-429-error-phone.png") });

      // What the page says is what the server does: neither refused request has a usage record, and the console
      // did not look them up (their status says so).
      for (const id of [refused.requestId, limited.requestId]) {
        assert.equal((await gw.get(`/v1/usage/${id}`)).status, 404, `${id} has no usage record`);
        assert.ok(!watch.requests.some((url) => url.includes(`/v1/usage/${id}`)), "no lookup of a refused request");
      }
      // Looked up in Usage anyway: the answer says why there is none.
      await page.getByRole("link", { name: "Usage" }).click();
      await page.getByLabel("Request id", { exact: true }).fill(refused.requestId);
      await page.getByRole("button", { name: "Find" }).click();
      const missing = page.locator(".lookup-missing");
      await missing.waitFor();
      assert.match(await missing.innerText(), /No usage record with request id req_\w+ in this organization\./);
      assert.match(await missing.innerText(), /refused before they were accepted .*leave no record/);
      assertClean(watch, gw);
    } finally {
      await context.close();
      await gw.close();
    }
  });

  test("accepted requests that failed are findable by id; a paused organization and invalid fields get references", async () => {
    const gw = await startGateway();
    const context = await browser.newContext({ viewport: { width: 1280, height: 800 }, baseURL: gw.url });
    const page = await context.newPage();
    page.setDefaultTimeout(8000);
    const watch = watchPage(page);
    try {
      await signIn(page, gw);
      const box = page.locator("#general-error");

      // The model rejects the context (422) or fails (502): accepted first, so recorded.
      for (const [behavior, status, outcome] of [
        ["context-rejected", 422, "context_rejected"],
        ["status:500", 502, "model_error"],
      ] as const) {
        gw.fake!.setBehavior(behavior);
        const failed = await run(page);
        assert.equal(failed.status, status);
        const ref = await referenceOf(page, failed.requestId);
        assert.equal(ref.recorded, "true", behavior);
        assert.equal(ref.text, `Request id ${failed.requestId} · recorded in Usage`);
        const record = (await (await gw.get(`/v1/usage/${failed.requestId}`)).json()) as { outcome: string };
        assert.equal(record.outcome, outcome);
      }
      gw.fake!.setBehavior(null);

      // A 422 with field errors was refused before acceptance: a reference, without asking Usage.
      await page.locator("#question-list > li").first().getByLabel("Question id").fill("");
      const invalid = await run(page);
      assert.equal(invalid.status, 422);
      const ref422 = await referenceOf(page, invalid.requestId);
      assert.equal(ref422.recorded, "false");
      assert.match(ref422.text, NOT_RECORDED);
      assert.ok(!watch.requests.some((url) => url.includes(`/v1/usage/${invalid.requestId}`)));
      assert.equal((await gw.get(`/v1/usage/${invalid.requestId}`)).status, 404);
      await page.locator("#question-list > li").first().getByLabel("Question id").fill("topic");

      // A paused organization (403): whom to ask, and a reference.
      await gw.store.setOrganizationPaused(gw.orgId, true);
      const paused = await run(page);
      assert.equal(paused.status, 403);
      const ref403 = await referenceOf(page, paused.requestId);
      assert.equal(ref403.recorded, "false");
      assert.match(await box.innerText(), /HTTP 403/);
      const banner = page.locator("#limit-banner");
      await banner.filter({ hasText: "Organization paused." }).waitFor();
      assert.match(await banner.innerText(), /ask your administrator to resume them/);
      assert.doesNotMatch(await visibleText(page), /\btds [a-z]/i);
      assert.equal((await gw.get(`/v1/usage/${paused.requestId}`)).status, 404);
      assertClean(watch, gw);
    } finally {
      await context.close();
      await gw.close();
    }
  });
});
