/**
 * The console's Admin page in a real browser (Debian's chromium driven by playwright-core) against a real gateway with
 * the admin API enabled: signing in with the admin token (a wrong one refused, an API key refused), organizations
 * (create, a duplicate name shown at its field, paging), a key shown once and copied through the clipboard — and that
 * key used for real decision requests: 402 without credits, 200 after granting them in the console, 403 while the
 * organization is paused, 401 once the key is revoked —, the audit log with client "console" and its paging, the
 * confirmations, keyboard use and focus, labels, 360 px, sign-out, the two sessions (API key and admin token) being
 * independent, and a gateway without an admin API. Screenshots go to test-output/screenshots/.
 */
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { decideWithKey, type Gateway, startGateway } from "../support/gateway-harness.ts";
import { inPage, launchChromium, type PageWatch, unlabelled, watchPage } from "./browser.ts";

const SCREENSHOTS = join(import.meta.dirname, "..", "..", "test-output", "screenshots");
const ADMIN_TOKEN = "adm-console-3Fq8Wz1Lx6Tr9Kp2Vn5Hs7Bd4Gj0Mc";
const WRONG_TOKEN = "adm-console-wrong-wrong-wrong-wrong-00";
const DISABLED = "This gateway has no admin API enabled (set TDS_ADMIN_TOKEN on the server).";

/** Chrome logs non-2xx fetches as console errors; these tests provoke 401, 404 and 409 on purpose. */
const EXPECTED_CONSOLE = /Failed to load resource: (the server responded with a status of (401|404|409|422)|net::ERR_FAILED)/;

function assertOnlyGateway(watch: PageWatch, gw: Gateway) {
  assert.ok(watch.requests.length > 3, "the page made requests");
  const origin = new URL(gw.url).origin;
  const foreign = watch.requests.filter((url) => new URL(url).origin !== origin);
  assert.deepEqual(foreign, [], `requests to another host than ${origin}`);
  const problems = watch.problems.filter((p) => !EXPECTED_CONSOLE.test(p));
  assert.deepEqual(problems, [], "console errors, page errors or CSP violations");
}

interface AdminRequest {
  method: string;
  path: string;
  headers: Record<string, string>;
}

async function newPage(browser: Browser, gw: Gateway, viewport = { width: 1280, height: 900 }) {
  const context: BrowserContext = await browser.newContext({ viewport, baseURL: gw.url });
  await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: gw.url });
  const page = await context.newPage();
  page.setDefaultTimeout(8000);
  const watch = watchPage(page);
  const adminRequests: AdminRequest[] = [];
  page.on("request", (request) => {
    const url = new URL(request.url());
    if (url.pathname.startsWith("/admin/"))
      adminRequests.push({ method: request.method(), path: `${url.pathname}${url.search}`, headers: request.headers() });
  });
  return { context, page, watch, adminRequests };
}

/** Text nodes under `selector` that say "null" (a value the page failed to format). */
function nullText(page: Page, selector: string): Promise<string[]> {
  return inPage(
    page,
    `[...document.querySelectorAll(${JSON.stringify(selector)})].flatMap((el) => {
      const texts = [];
      const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
      while (walk.nextNode()) if (/\\b(null|undefined|NaN)\\b/.test(walk.currentNode.nodeValue)) texts.push(walk.currentNode.parentElement.outerHTML.slice(0, 200));
      return texts;
    })`,
  );
}

/** The text of an element as read out: whitespace collapsed. */
async function spoken(locator: { textContent(): Promise<string | null> }): Promise<string> {
  return ((await locator.textContent()) ?? "").replace(/\s+/g, " ").trim();
}

/** The datetime attributes of the audit log's time cells, top to bottom. */
const auditTimes = (page: Page) =>
  inPage<string[]>(page, `[...document.querySelectorAll("#audit-table tbody time")].map((t) => t.getAttribute("datetime"))`);

const activeId = (page: Page) => inPage<string | null>(page, "document.activeElement?.id || null");
const activeLabel = (page: Page) =>
  inPage<string | null>(page, `document.activeElement?.getAttribute("aria-label") ?? document.activeElement?.textContent ?? null`);

async function signInAsAdmin(page: Page, token = ADMIN_TOKEN) {
  await page.getByLabel("Admin token", { exact: true }).fill(token);
  await page.getByRole("button", { name: "Sign in as administrator" }).click();
}

describe("console admin page in a browser", { timeout: 120_000 }, () => {
  let browser: Browser;
  before(async () => {
    mkdirSync(SCREENSHOTS, { recursive: true });
    browser = await launchChromium();
  });
  after(async () => {
    await browser?.close();
  });

  test("sign in with the admin token; organizations, a key shown once, credits, pause and resume, revoke, the audit log", async () => {
    const gw = await startGateway({ env: { TDS_ADMIN_TOKEN: ADMIN_TOKEN, TDS_SERVICE_MODE: "paid" } });
    const { context, page, watch, adminRequests } = await newPage(browser, gw);
    try {
      // From the sign-in page of the API key to the Admin page.
      await page.goto("/console/");
      await page.getByRole("heading", { name: "Sign in with an API key" }).waitFor();
      await page.getByRole("link", { name: "Administer this gateway" }).click();
      await page.getByRole("heading", { name: "Administer this gateway", level: 1 }).waitFor();
      assert.equal(new URL(page.url()).hash, "#admin");
      assert.equal(await activeId(page), "admin-signin-title", "navigation moves the focus to the heading");
      assert.equal(await page.getByLabel("Admin token", { exact: true }).getAttribute("type"), "password");
      assert.equal(await page.getByLabel("API key", { exact: true }).isVisible(), false, "no API key needed");
      assert.deepEqual(await unlabelled(page), []);

      // An empty, a wrong token, and an API key are refused; nothing is kept.
      await page.getByRole("button", { name: "Sign in as administrator" }).click();
      await page.locator("#admin-signin-error", { hasText: "Enter the admin token." }).waitFor();
      await signInAsAdmin(page, WRONG_TOKEN);
      const signinError = page.locator("#admin-signin-error");
      await signinError.filter({ hasText: "This token was not accepted: Invalid admin token." }).waitFor();
      assert.equal(await signinError.getAttribute("role"), "alert");
      assert.equal(await page.getByLabel("Admin token", { exact: true }).getAttribute("aria-invalid"), "true");
      assert.equal(await activeId(page), "admin-token", "the focus goes back to the token field");
      assert.equal(await inPage(page, "sessionStorage.length + localStorage.length"), 0);
      await signInAsAdmin(page, gw.key);
      await signinError.filter({ hasText: "API keys are not accepted by the admin API" }).waitFor();
      assert.equal(await inPage(page, "sessionStorage.length + localStorage.length"), 0);

      // The right token.
      await signInAsAdmin(page);
      await page.getByRole("heading", { name: "Admin", level: 1, exact: true }).waitFor();
      assert.equal(await activeId(page), "admin-title");
      await page.locator("#announcer", { hasText: "Signed in as administrator." }).waitFor();
      assert.equal(await inPage(page, `sessionStorage.getItem("tds.console.adminToken")`), ADMIN_TOKEN);
      assert.equal(await inPage(page, `sessionStorage.getItem("tds.console.apiKey")`), null, "no API key session was opened");
      assert.equal(await inPage(page, "localStorage.length"), 0);
      assert.equal(await inPage(page, "document.cookie"), "");
      assert.equal(await page.getByLabel("Admin token", { exact: true }).inputValue(), "", "the field does not keep the token");
      await page.locator("#admin-mode", { hasText: "paid mode" }).waitFor();
      assert.equal(await page.locator("#status-strip").isVisible(), false, "the organization's status strip is not part of Admin");
      const orgRows = page.locator("#orgs-table tbody tr");
      await orgRows.first().waitFor();
      assert.equal(await orgRows.count(), 1);
      assert.match(await orgRows.first().innerText(), /test-org[\s\S]*Active[\s\S]*0 USD/);

      // Create an organization: its panel opens with the focus on its heading.
      await page.getByLabel("New organization name").fill("  Acme Robotics ");
      await page.getByRole("button", { name: "Create organization" }).click();
      const detail = page.locator("#org-detail");
      const detailTitle = page.getByRole("heading", { level: 2, name: /Acme Robotics/ });
      await detailTitle.waitFor();
      assert.equal(await spoken(detailTitle), "Organization Acme Robotics Active");
      assert.equal(await activeId(page), "org-detail-title");
      await page.locator("#announcer", { hasText: "Organization Acme Robotics created." }).waitFor();
      await orgRows.nth(1).waitFor();
      const acmeRow = orgRows.filter({ hasText: "Acme Robotics" });
      const acmeId = (await acmeRow.locator("code").innerText()).trim();
      assert.match(acmeId, /^org_[a-z0-9]{12}$/);
      assert.equal(await acmeRow.getAttribute("class"), "is-selected");
      assert.equal(await page.getByRole("button", { name: "Manage Acme Robotics" }).getAttribute("aria-expanded"), "true");
      await page.locator("#keys-empty").waitFor();

      // A duplicate name: the server's message next to the field, the field marked invalid and focused.
      const nameInput = page.getByLabel("New organization name");
      await nameInput.fill("Acme Robotics");
      await nameInput.press("Enter");
      const nameError = page.locator("#org-name-error");
      await nameError.filter({ hasText: 'An organization named "Acme Robotics" already exists.' }).waitFor();
      assert.equal(await nameInput.getAttribute("aria-invalid"), "true");
      assert.match((await nameInput.getAttribute("aria-describedby")) ?? "", /\borg-name-error\b/);
      assert.equal(await activeId(page), "org-name-input");
      assert.equal(await page.locator("#orgs-error").isVisible(), false, "the only error is at its field");
      await nameInput.fill("");
      assert.equal(await nameInput.getAttribute("aria-invalid"), null, "typing clears the error");
      assert.equal(await nameError.isVisible(), false);
      // A name the server refuses: a validation message (422) at the field too.
      await nameInput.fill("org_abcdefabcdef");
      await page.getByRole("button", { name: "Create organization" }).click();
      await nameError.filter({ hasText: "must not look like an organization id" }).waitFor();
      await nameInput.fill("");

      // Create a key: shown once, in a marked box, with the focus on its Copy button.
      const keyOnce = page.locator("#key-once");
      await page.getByLabel("Key name (optional)").fill("ci runner");
      await page.getByRole("button", { name: "Create key" }).click();
      await keyOnce.waitFor();
      assert.match(await keyOnce.innerText(), /New API key: copy it now[\s\S]*only time the key is shown/);
      const newKey = (await page.locator("#key-once-value").innerText()).trim();
      assert.match(newKey, /^tds_[a-z0-9]+_/);
      assert.equal(await activeId(page), "key-once-copy");
      await page.locator("#announcer", { hasText: "Copy it now" }).waitFor();
      const keyRows = page.locator("#keys-table tbody tr");
      await keyRows.first().waitFor();
      const keyId = (await keyRows.first().locator("code").innerText()).trim();
      assert.ok(newKey.startsWith(`tds_${keyId}_`), "the listed key is the new one");
      assert.match(await keyRows.first().innerText(), /ci runner[\s\S]*Active/);
      assert.equal(await page.getByLabel("Key name (optional)").inputValue(), "");

      // Copy it with the keyboard (the focus is on Copy) and read the clipboard.
      await page.keyboard.press("Enter");
      await page.locator("#key-once-status", { hasText: "Copied" }).waitFor();
      const copied = await inPage<string>(page, "navigator.clipboard.readText()");
      assert.equal(copied, newKey);
      await inPage(page, "window.scrollTo(0, 0)");
      await detail.scrollIntoViewIfNeeded();
      await page.screenshot({ path: join(SCREENSHOTS, "admin-key-created.png") });

      // The copied key works: a paid request without credits is refused with 402.
      assert.equal(await decideWithKey(gw, copied), 402);

      // Grant credits: client-side checks first, then the new balance; the key box is gone (another action).
      const amount = page.getByLabel("Amount (USD)");
      await amount.fill("12,50");
      await page.getByRole("button", { name: "Grant credits" }).click();
      await page.locator("#grant-amount-error", { hasText: "Use a dot for decimals" }).waitFor();
      assert.equal(await keyOnce.isVisible(), false, "the key disappears when another action is taken");
      assert.equal(await page.locator("#key-once-value").innerText(), "", "and is removed from the page");
      assert.equal(await amount.getAttribute("aria-invalid"), "true");
      await amount.fill("1.1234567");
      await amount.press("Enter");
      await page.locator("#grant-amount-error", { hasText: "at most 6 decimals" }).waitFor();
      await amount.fill("25.50");
      assert.equal(await amount.getAttribute("aria-invalid"), null);
      await page.getByLabel("Note (optional)").fill("invoice 2026-114");
      await page.getByRole("button", { name: "Grant credits" }).click();
      const grantResult = page.locator("#grant-result");
      await grantResult.filter({ hasText: "Granted 25.50 USD to Acme Robotics. Available now: 25.5 USD" }).waitFor();
      await page.locator("#announcer", { hasText: "Granted 25.50 USD" }).waitFor();
      await page.locator("#org-facts", { hasText: "25.5 USD" }).waitFor();
      await acmeRow.filter({ hasText: "25.5 USD" }).waitFor();
      assert.equal(await amount.inputValue(), "", "the form is cleared after a grant");
      const grants = adminRequests.filter((r) => r.method === "POST" && r.path.endsWith("/credits"));
      assert.equal(grants.length, 1, "the client-side checks sent nothing");
      assert.match(grants[0]!.headers["idempotency-key"] ?? "", /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
      assert.equal((await gw.store.getBalance(acmeId)).granted, 25_500_000);
      assert.equal(await decideWithKey(gw, copied), 200, "with credits the new key's request is served");

      // A grant whose answer is lost: the gateway applied it, the page saw a network failure. Submitting the same
      // form again sends the same Idempotency-Key, so the grant is applied once.
      await page.route("**/admin/v1/organizations/*/credits", async (route) => {
        await route.fetch();
        await route.abort("failed");
      });
      await amount.fill("1");
      await page.getByRole("button", { name: "Grant credits" }).click();
      const orgError = page.locator("#org-error");
      await orgError.filter({ hasText: "No answer from the gateway" }).waitFor();
      assert.match(await orgError.innerText(), /applied only once/);
      assert.equal((await gw.store.getBalance(acmeId)).granted, 26_500_000, "the lost grant was applied");
      await page.unrouteAll();
      await page.getByRole("button", { name: "Grant credits" }).click();
      await grantResult.filter({ hasText: "already been applied; nothing was granted again" }).waitFor();
      assert.equal(await orgError.isVisible(), false);
      assert.equal((await gw.store.getBalance(acmeId)).granted, 26_500_000, "the retry granted nothing again");
      const lostGrant = adminRequests.filter((r) => r.method === "POST" && r.path.endsWith("/credits")).slice(1);
      assert.equal(lostGrant.length, 2);
      assert.equal(lostGrant[0]!.headers["idempotency-key"], lostGrant[1]!.headers["idempotency-key"], "the retry sent the same key");
      assert.notEqual(lostGrant[0]!.headers["idempotency-key"], grants[0]!.headers["idempotency-key"], "a new form, a new key");

      // Pause: a confirmation first (Escape cancels, the focus returns); then 403 for the key; Resume: 200 again.
      const pause = page.getByRole("button", { name: "Pause Acme Robotics" });
      await pause.click();
      const dialog = page.getByRole("dialog", { name: "Pause Acme Robotics?" });
      await dialog.waitFor();
      assert.equal(await activeId(page), "confirm-cancel", "the safe choice has the focus");
      assert.match(await dialog.innerText(), /decision requests get 403/);
      await page.keyboard.press("Escape");
      await dialog.waitFor({ state: "hidden" });
      assert.equal(await activeId(page), "org-pause");
      assert.equal(await gw.store.findOrganization(acmeId).then((o) => o?.paused), false, "cancelled: not paused");
      await pause.click();
      await dialog.getByRole("button", { name: "Pause organization" }).click();
      const resume = page.getByRole("button", { name: "Resume Acme Robotics" });
      await resume.waitFor();
      assert.equal(await spoken(detailTitle), "Organization Acme Robotics Paused");
      assert.equal(await activeId(page), "org-pause", "the focus stays on the (now Resume) button");
      await page.locator("#announcer", { hasText: "Acme Robotics is paused" }).waitFor();
      await acmeRow.filter({ hasText: "Paused" }).waitFor();
      assert.equal(await decideWithKey(gw, copied), 403);
      await resume.click();
      await pause.waitFor();
      assert.equal(await spoken(detailTitle), "Organization Acme Robotics Active");
      await page.locator("#announcer", { hasText: "Acme Robotics is resumed" }).waitFor();
      assert.equal(await decideWithKey(gw, copied), 200);

      // Revoke the key: a confirmation; then 401 for it.
      const revoke = page.getByRole("button", { name: `Revoke key ${keyId} (ci runner)` });
      await revoke.click();
      const revokeDialog = page.getByRole("dialog", { name: `Revoke key ${keyId}?` });
      await revokeDialog.getByRole("button", { name: "Cancel" }).click();
      assert.equal(await activeLabel(page), `Revoke key ${keyId} (ci runner)`, "cancel returns the focus to the row's button");
      await revoke.click();
      await revokeDialog.getByRole("button", { name: "Revoke key" }).click();
      await keyRows.first().filter({ hasText: "Revoked" }).waitFor();
      assert.equal(await revoke.count(), 0, "a revoked key has no Revoke button");
      assert.equal(await activeId(page), "keys-title");
      await page.locator("#announcer", { hasText: `Key ${keyId} revoked` }).waitFor();
      await page.locator("#org-facts", { hasText: "0 active · 1 revoked" }).waitFor();
      assert.equal(await decideWithKey(gw, copied), 401);

      // The audit log: newest first, every change made here, by the console.
      const auditRows = page.locator("#audit-table tbody tr");
      await auditRows.filter({ hasText: "Key revoked" }).waitFor();
      const actions = await inPage<string[]>(
        page,
        `[...document.querySelectorAll("#audit-table tbody tr")].map((tr) => tr.dataset.action)`,
      );
      assert.deepEqual(actions, [
        "key.revoked",
        "organization.resumed",
        "organization.paused",
        "credits.granted",
        "credits.granted",
        "key.created",
        "organization.created",
      ]);
      for (const text of await page.locator("#audit-table tbody td.audit-source").allInnerTexts()) assert.match(text, /^http · console\b/);
      const auditText = await page.locator("#audit-table").innerText();
      for (const part of [
        "Acme Robotics",
        keyId,
        "25.5 USD",
        "1 USD",
        "note “invoice 2026-114”",
        "name “ci runner”",
        "name “Acme Robotics”",
        "UTC",
      ]) {
        assert.ok(auditText.includes(part), `audit log shows ${part}`);
      }
      const at = await auditRows.first().locator("time").getAttribute("datetime");
      assert.ok(at && Math.abs(Date.parse(at) - Date.now()) < 60_000, "the time is the entry's");
      assert.match(await auditRows.first().locator(".cell-sub").first().innerText(), /^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} UTC$/);
      // Every admin request of the page named the console.
      assert.ok(adminRequests.length > 10);
      for (const r of adminRequests) assert.equal(r.headers["x-tds-client"], "console", `${r.method} ${r.path}`);
      assert.ok(!adminRequests.some((r) => r.path.includes(ADMIN_TOKEN)), "the token is never in a URL");

      // "Its audit entries": the log filtered to the organization.
      await page.getByRole("button", { name: "Its audit entries" }).click();
      await page.locator("#audit-info", { hasText: "Acme Robotics · Page 1 · 7 entries" }).waitFor();
      assert.equal(await activeId(page), "audit-title");
      await page.getByRole("button", { name: "All organizations" }).click();
      await page.locator("#audit-info", { hasText: /^Page 1 · 7 entries/ }).waitFor();

      assert.deepEqual(await unlabelled(page), [], "every field and button has an accessible name");
      assert.deepEqual(await nullText(page, "#page-admin"), []);

      // Screenshots: the organizations with a panel open, and the audit log.
      await page.getByLabel("New organization name").fill("Globex Support");
      await page.getByRole("button", { name: "Create organization" }).click();
      await page.getByRole("heading", { level: 2, name: /Globex Support/ }).waitFor();
      await page.getByLabel("Amount (USD)").fill("100");
      await page.getByRole("button", { name: "Grant credits" }).click();
      await grantResult.filter({ hasText: "Granted 100 USD to Globex Support" }).waitFor();
      await page.getByRole("button", { name: "Create key" }).click();
      await keyOnce.waitFor();
      await page.getByRole("button", { name: "Manage Acme Robotics" }).click();
      await detailTitle.waitFor();
      assert.equal(await keyOnce.isVisible(), false, "opening another organization hides the key");
      await keyRows.first().filter({ hasText: "Revoked" }).waitFor();
      await orgRows.nth(2).filter({ hasText: "100 USD" }).waitFor();
      await inPage(page, "window.scrollTo(0, 0)");
      await page.screenshot({ path: join(SCREENSHOTS, "admin-organizations.png") });
      await page.locator("section.panel", { has: page.locator("#audit-title") }).screenshot({ path: join(SCREENSHOTS, "admin-audit.png") });

      // Close the panel with the keyboard: Escape inside it; the focus returns to the row's Manage button.
      await page.getByRole("button", { name: "Close" }).focus();
      await page.keyboard.press("Escape");
      await detail.waitFor({ state: "hidden" });
      assert.equal(await activeLabel(page), "Manage Acme Robotics");
      assert.equal(await page.getByRole("button", { name: "Manage Acme Robotics" }).getAttribute("aria-expanded"), "false");
      // …and open it again with Enter.
      await page.keyboard.press("Enter");
      await detailTitle.waitFor();
      assert.equal(await activeId(page), "org-detail-title");

      // Phone size: nothing wider than the screen, the panel included.
      await page.setViewportSize({ width: 360, height: 740 });
      await page.getByRole("button", { name: "Create key" }).click();
      await keyOnce.waitFor();
      assert.ok(await inPage(page, "document.documentElement.scrollWidth <= 360"), "no horizontal page scrolling at 360 px");
      await page.locator("#key-once").scrollIntoViewIfNeeded();
      await page.screenshot({ path: join(SCREENSHOTS, "admin-phone.png") });
      await page.setViewportSize({ width: 1280, height: 900 });

      // Paging: more organizations than a page, and more audit entries than a page (grants by another client).
      for (let i = 0; i < 20; i++) await gw.newOrg(`Bulk ${String(i).padStart(2, "0")}`);
      for (let i = 0; i < 22; i++) {
        const res = await fetch(`${gw.url}/admin/v1/organizations/${acmeId}/credits`, {
          method: "POST",
          headers: { authorization: `Bearer ${ADMIN_TOKEN}`, "content-type": "application/json", "x-tds-client": "test" },
          body: JSON.stringify({ amount_usd: "0.01" }),
        });
        assert.equal(res.status, 200);
      }
      await page.getByRole("button", { name: "Refresh" }).click();
      await page.locator("#orgs-info", { hasText: "Page 1 · 20 organizations" }).waitFor();
      const orgPager = page.getByRole("navigation", { name: "Organization pages" });
      await orgPager.waitFor();
      const firstPage = await page.locator("#orgs-table tbody th").allInnerTexts();
      await orgPager.getByRole("button", { name: "Next page →" }).click();
      await page.locator("#orgs-info", { hasText: "Page 2 · 3 organizations" }).waitFor();
      const secondPage = await page.locator("#orgs-table tbody th").allInnerTexts();
      assert.deepEqual(
        [...firstPage, ...secondPage],
        (await gw.store.listOrganizations()).map((o) => o.name),
        "every organization once, oldest first",
      );
      assert.equal(await orgPager.getByRole("button", { name: "Next page →" }).isDisabled(), true);
      await orgPager.getByRole("button", { name: "← Previous page" }).click();
      await page.locator("#orgs-info", { hasText: "Page 1 · 20 organizations" }).waitFor();

      await page.locator("#audit-info", { hasText: "Page 1 · 25 entries" }).waitFor();
      const newest = await auditTimes(page);
      assert.match(await auditRows.first().locator("td.audit-source").innerText(), /^http · test/);
      await page.getByRole("button", { name: "Older entries →" }).click();
      await page.locator("#audit-info", { hasText: /Page 2 · \d+ entr/ }).waitFor();
      const older = await auditTimes(page);
      const all = [...newest, ...older];
      assert.deepEqual(all, [...all].sort().reverse(), "newest first across pages");
      assert.equal(await auditRows.last().getAttribute("data-action"), "organization.created", "the oldest entry last");
      await page.getByRole("button", { name: "← Newer entries" }).click();
      await page.locator("#audit-info", { hasText: "Page 1 · 25 entries" }).waitFor();
      assert.deepEqual(await unlabelled(page), []);

      // Sign out of admin: the token and everything shown are gone.
      await page.getByRole("button", { name: "Sign out of admin" }).click();
      await page.getByRole("heading", { name: "Administer this gateway" }).waitFor();
      assert.equal(await activeId(page), "admin-token");
      assert.equal(await inPage(page, "sessionStorage.length + localStorage.length"), 0);
      assert.equal(await page.locator("#orgs-table tbody tr").count(), 0);
      assert.equal(await page.locator("#audit-table tbody tr").count(), 0);
      assert.equal(await page.locator("#keys-table tbody tr").count(), 0);
      assert.equal(await page.locator("#org-detail").isVisible(), false);
      assert.equal(await page.locator("#key-once-value").innerText(), "");
      await page.locator("#announcer", { hasText: "Signed out of admin" }).waitFor();

      assertOnlyGateway(watch, gw);
    } finally {
      await context.close();
      await gw.close();
    }
  });

  test("the API key session and the admin session are independent", async () => {
    const gw = await startGateway({ env: { TDS_ADMIN_TOKEN: ADMIN_TOKEN } });
    const { context, page, watch } = await newPage(browser, gw);
    try {
      // Signed in with an API key, the Admin page still asks for the admin token.
      await page.goto("/console/");
      await page.getByLabel("API key", { exact: true }).fill(gw.key);
      await page.getByRole("button", { name: "Sign in", exact: true }).click();
      await page.getByRole("heading", { name: "Playground", level: 1 }).waitFor();
      await page.getByRole("link", { name: "Admin" }).click();
      await page.getByRole("heading", { name: "Administer this gateway" }).waitFor();
      assert.equal(await page.locator("#status-strip").isVisible(), false);
      assert.equal(await page.locator("#account").isVisible(), false, "the organization's account area belongs to its pages");
      assert.equal(await page.getByRole("link", { name: "Admin" }).getAttribute("aria-current"), "page");
      await signInAsAdmin(page);
      await page.getByRole("heading", { name: "Admin", level: 1, exact: true }).waitFor();
      assert.equal(await inPage(page, `sessionStorage.getItem("tds.console.apiKey")`), gw.key);
      assert.equal(await inPage(page, `sessionStorage.getItem("tds.console.adminToken")`), ADMIN_TOKEN);

      // Back to the Playground: still signed in with the key; signing out there keeps the admin session.
      await page.getByRole("link", { name: "Playground" }).click();
      await page.getByRole("heading", { name: "Playground", level: 1 }).waitFor();
      await page.locator("#org-name", { hasText: "test-org" }).waitFor();
      assert.equal(await page.locator("#status-strip").isVisible(), true);
      assert.equal(await page.locator("#admin-account").isVisible(), false);
      await page.getByRole("button", { name: "Sign out", exact: true }).click();
      await page.getByRole("heading", { name: "Sign in with an API key" }).waitFor();
      assert.equal(await inPage(page, `sessionStorage.getItem("tds.console.apiKey")`), null);
      assert.equal(await inPage(page, `sessionStorage.getItem("tds.console.adminToken")`), ADMIN_TOKEN);
      assert.equal(await page.getByRole("navigation", { name: "Console pages" }).isVisible(), true, "the way back to Admin");

      // A reload at #admin: the kept token is checked and the page opens without asking again.
      await page.goto("/console/#admin");
      await page.reload();
      await page.getByRole("heading", { name: "Admin", level: 1, exact: true }).waitFor();
      await page.locator("#orgs-table tbody tr").first().waitFor();
      assert.equal(await page.getByLabel("API key", { exact: true }).isVisible(), false);

      // Signing out of admin leaves nothing in storage.
      await page.getByRole("button", { name: "Sign out of admin" }).click();
      await page.getByRole("heading", { name: "Administer this gateway" }).waitFor();
      assert.equal(await inPage(page, "sessionStorage.length + localStorage.length"), 0);

      // A kept token the server no longer accepts: signed out with the server's message on the next load.
      await inPage(page, `sessionStorage.setItem("tds.console.adminToken", ${JSON.stringify(WRONG_TOKEN)})`);
      await page.reload();
      await page.locator("#admin-signin-error", { hasText: "This token was not accepted: Invalid admin token." }).waitFor();
      assert.equal(await inPage(page, "sessionStorage.length"), 0);
      assertOnlyGateway(watch, gw);
    } finally {
      await context.close();
      await gw.close();
    }
  });

  test("a gateway without an admin API says so clearly", async () => {
    const gw = await startGateway();
    const { context, page, watch } = await newPage(browser, gw, { width: 360, height: 740 });
    try {
      await page.goto("/console/#admin");
      await page.getByRole("heading", { name: "Administer this gateway" }).waitFor();
      assert.deepEqual(await unlabelled(page), []);
      assert.ok(await inPage(page, "document.documentElement.scrollWidth <= 360"), "no horizontal page scrolling at 360 px");
      await signInAsAdmin(page);
      const error = page.locator("#admin-signin-error");
      await error.filter({ hasText: DISABLED }).waitFor();
      assert.equal((await error.innerText()).trim(), DISABLED);
      assert.equal(await inPage(page, "sessionStorage.length + localStorage.length"), 0);
      await page.screenshot({ path: join(SCREENSHOTS, "admin-disabled-phone.png") });

      // A token kept from before (the server was restarted without one): the same message, the token dropped.
      await inPage(page, `sessionStorage.setItem("tds.console.adminToken", ${JSON.stringify(ADMIN_TOKEN)})`);
      await page.reload();
      await error.filter({ hasText: DISABLED }).waitFor();
      assert.equal(await inPage(page, "sessionStorage.length"), 0);

      // The API-key side of the console is unaffected.
      await page.getByRole("link", { name: "Use the console with an API key instead" }).click();
      await page.getByRole("heading", { name: "Sign in with an API key" }).waitFor();
      assertOnlyGateway(watch, gw);
    } finally {
      await context.close();
      await gw.close();
    }
  });
});
