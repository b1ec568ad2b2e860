/**
 * The Admin page's per-key controls in a real browser (Debian's chromium driven by playwright-core) against a real
 * gateway (SQLite, admin API on, paid mode): a key created with an expiry, models, a per-minute limit and a budget and
 * listed with them; a 422 and the page's own checks shown at their fields; editing and clearing settings (PATCH with
 * null); the last use; rotating a key (the new key shown once, the old one marked with its retirement, both keys
 * working, then a rotation without grace refusing the old key); the audit log; labels, keyboard and focus, 360 px.
 * Screenshots go to test-output/screenshots/.
 */
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { Browser, Locator, Page } from "playwright-core";
import type { AdminApiKey } from "../../src/contract/admin.ts";
import { decideWithKey, type Gateway, startGateway } from "../support/gateway-harness.ts";
import { inPage, launchChromium, type PageWatch, unlabelled, watchPage } from "./browser.ts";

const SCREENSHOTS = join(import.meta.dirname, "..", "..", "test-output", "screenshots");
const ADMIN_TOKEN = "adm-keyset-7Hq2Lp9Zx4Wc1Vb8Nm3Ks6Dj0Rt5Gf";

/** Chrome logs non-2xx fetches as console errors; these tests provoke 422 on purpose. */
const EXPECTED_CONSOLE = /Failed to load resource: the server responded with a status of 422/;

interface SentRequest {
  method: string;
  path: string;
  body: unknown;
}

async function adminGet<T>(gw: Gateway, path: string): Promise<T> {
  const res = await fetch(`${gw.url}/admin/v1${path}`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
  assert.equal(res.status, 200, `GET ${path}`);
  return (await res.json()) as T;
}

const listKeys = async (gw: Gateway) => (await adminGet<{ data: AdminApiKey[] }>(gw, `/organizations/${gw.orgId}/keys`)).data;

const activeId = (page: Page) => inPage<string | null>(page, "document.activeElement?.id || null");
const activeLabel = (page: Page) => inPage<string | null>(page, `document.activeElement?.getAttribute("aria-label") ?? null`);

/** The value of a datetime-local input `hours` from now (in the browser's time zone) and the instant it stands for. */
function localInputIn(page: Page, hours: number) {
  return inPage<{ value: string; iso: string }>(
    page,
    `(() => {
      const d = new Date(Date.now() + ${hours} * 3600000);
      d.setSeconds(0, 0);
      const p = (n) => String(n).padStart(2, "0");
      const value = d.getFullYear() + "-" + p(d.getMonth() + 1) + "-" + p(d.getDate()) + "T" + p(d.getHours()) + ":" + p(d.getMinutes());
      return { value, iso: d.toISOString() };
    })()`,
  );
}

/** Text nodes under `selector` that say "null", "undefined" or "NaN" (a value the page failed to format). */
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

const text = async (locator: Locator) => ((await locator.innerText()) ?? "").replace(/\s+/g, " ").trim();

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

describe("the Admin page's per-key controls in a browser", { timeout: 120_000 }, () => {
  let browser: Browser;
  before(async () => {
    mkdirSync(SCREENSHOTS, { recursive: true });
    browser = await launchChromium();
  });
  after(async () => {
    await browser?.close();
  });

  test("create a key with limits, a 422 at its field, edit and clear, last use, rotate with the new key shown once", async () => {
    const gw = await startGateway({ env: { TDS_ADMIN_TOKEN: ADMIN_TOKEN, TDS_SERVICE_MODE: "paid" } });
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, baseURL: gw.url });
    await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: gw.url });
    const page = await context.newPage();
    page.setDefaultTimeout(8000);
    const watch = watchPage(page);
    const sent: SentRequest[] = [];
    page.on("request", (request) => {
      const url = new URL(request.url());
      if (!url.pathname.startsWith("/admin/") || request.method() === "GET") return;
      const data = request.postData();
      sent.push({ method: request.method(), path: url.pathname, body: data ? JSON.parse(data) : null });
    });
    const sentTo = (method: string, suffix: string) => sent.filter((r) => r.method === method && r.path.endsWith(suffix));
    try {
      await page.goto("/console/#admin");
      await page.getByLabel("Admin token", { exact: true }).fill(ADMIN_TOKEN);
      await page.getByRole("button", { name: "Sign in as administrator" }).click();
      await page.getByRole("button", { name: "Manage test-org" }).click();
      const keyRows = page.locator("#keys-table tbody tr");
      const row = (id: string) => keyRows.filter({ has: page.locator("code", { hasText: id }) });
      await row(gw.keyId).waitFor();
      assert.deepEqual(
        (await page.locator("#keys-table thead th").allTextContents()).map((t) => t.trim()),
        ["Key id", "Name", "Created", "Last used", "Limits", "Status", "Actions"],
      );
      assert.match(await text(row(gw.keyId)), /Never None Active/, "a key without limits, never used");

      // The create form: the name and the limits of its own.
      const form = page.locator("#key-create-form");
      const limits = form.getByRole("group", { name: "Limits of its own (optional)" });
      await limits.waitFor();
      const models = form.getByRole("group", { name: "Models" });
      // The gateway's default model (GET /api/config) is offered as a checkbox; others are typed in.
      await models.getByRole("checkbox", { name: "fake-small" }).waitFor();
      await form.getByText("Within the organization's limit of 100,000 a minute. Empty: none of its own.").waitFor();

      // The page's own checks: nothing is sent.
      await page.getByLabel("Key name (optional)").fill("ci runner");
      await form.getByLabel("Budget (USD)").fill("12,5");
      await form.getByLabel("Requests per minute").fill("ten");
      await page.getByRole("button", { name: "Create key" }).click();
      const budgetInput = form.getByLabel("Budget (USD)");
      const rpmInput = form.getByLabel("Requests per minute");
      await form.locator(".field-error", { hasText: "Enter a whole number of requests" }).waitFor();
      await form.locator(".field-error", { hasText: "Use a dot for decimals" }).waitFor();
      assert.equal(await rpmInput.getAttribute("aria-invalid"), "true");
      assert.equal(await budgetInput.getAttribute("aria-invalid"), "true");
      assert.equal(await activeLabel(page), null);
      assert.equal(
        await inPage(page, "document.activeElement === document.querySelector('#key-create-form input[inputmode=numeric]')"),
        true,
      );
      assert.equal(sentTo("POST", "/keys").length, 0, "the checks sent nothing");

      // A value only the server refuses: its 422 at the field, the field focused, nothing else shown.
      const expiry = await localInputIn(page, 48);
      await form.getByLabel("Expires at").fill(expiry.value);
      await rpmInput.fill("0");
      assert.equal(await rpmInput.getAttribute("aria-invalid"), null, "typing clears the error");
      await budgetInput.fill("25.5");
      await form.getByLabel("Budget period").selectOption("day");
      await models.getByRole("checkbox", { name: "fake-small" }).check();
      await models.getByLabel("Other models").fill("fake-large");
      const refused = page.waitForResponse((r) => r.request().method() === "POST" && r.url().endsWith("/keys"));
      await page.getByRole("button", { name: "Create key" }).click();
      assert.equal((await refused).status(), 422);
      await form.locator(".field-error", { hasText: "The per-minute limit must be at least 1." }).waitFor();
      assert.equal(await rpmInput.getAttribute("aria-invalid"), "true");
      assert.match((await rpmInput.getAttribute("aria-describedby")) ?? "", /error/);
      assert.equal(
        await inPage(page, "document.activeElement === document.querySelector('#key-create-form input[inputmode=numeric]')"),
        true,
      );
      assert.equal(await page.locator("#org-error").isVisible(), false, "the only error is at its field");
      assert.equal((await listKeys(gw)).length, 1, "nothing was created");

      // Created with its limits: shown once, listed with them.
      await rpmInput.fill("120");
      await page.getByRole("button", { name: "Create key" }).click();
      const keyOnce = page.locator("#key-once");
      await keyOnce.waitFor();
      assert.match(await keyOnce.innerText(), /copy it now[\s\S]*only time the key is shown/);
      assert.equal(await activeId(page), "key-once-copy");
      const created = sentTo("POST", "/keys").at(-1)!.body;
      assert.deepEqual(created, {
        name: "ci runner",
        expires_at: expiry.iso,
        requests_per_minute: 120,
        budget: { usd: "25.5", period: "day" },
        models: ["fake-small", "fake-large"],
      });
      const firstKey = (await page.locator("#key-once-value").innerText()).trim();
      const ciKey = (await listKeys(gw)).find((k) => k.name === "ci runner")!;
      assert.ok(firstKey.startsWith(`tds_${ciKey.id}_`));
      assert.equal(ciKey.expires_at, expiry.iso);
      assert.deepEqual([...(ciKey.models ?? [])].sort(), ["fake-large", "fake-small"]);
      assert.equal(ciKey.requests_per_minute, 120);
      assert.deepEqual(ciKey.budget, { usd: "25.5", period: "day" });
      const ciRow = row(ciKey.id);
      await ciRow.waitFor();
      const listed = await text(ciRow);
      for (const part of [
        "ci runner",
        "Never",
        "Expires",
        "Models: fake-small, fake-large",
        "120 requests/min",
        "Budget 25.5 USD per UTC day",
        "Active",
      ])
        assert.ok(listed.includes(part), `the row shows ${part}: ${listed}`);
      assert.equal(await ciRow.locator("time[datetime]").nth(1).getAttribute("datetime"), expiry.iso, "the expiry's time");
      assert.ok(!listed.includes(firstKey) && !(await text(keyRows.first())).includes("tds_"), "never a secret in the list");
      // The form is emptied for the next key.
      assert.equal(await budgetInput.inputValue(), "");
      assert.equal(await models.getByRole("checkbox", { name: "fake-small" }).isChecked(), false);
      assert.equal(await decideWithKey(gw, firstKey), 402, "the new key authenticates (no credits yet)");
      await page.screenshot({ path: join(SCREENSHOTS, "admin-key-limits.png") });
      await form.screenshot({ path: join(SCREENSHOTS, "admin-key-create-form.png") });

      // Edit: the dialog is filled with the key's settings; Escape closes it and the focus returns.
      const edit = page.getByRole("button", { name: `Edit the settings of key ${ciKey.id} (ci runner)` });
      await edit.click();
      const dialog = page.getByRole("dialog", { name: `Settings of key ${ciKey.id}` });
      await dialog.waitFor();
      assert.equal(await dialog.getByLabel("Name", { exact: true }).inputValue(), "ci runner");
      assert.equal(await inPage(page, "document.activeElement?.closest('dialog')?.open === true && document.activeElement.type"), "text");
      assert.equal(await dialog.getByLabel("Expires at").inputValue(), expiry.value);
      assert.equal(await dialog.getByLabel("Requests per minute").inputValue(), "120");
      assert.equal(await dialog.getByLabel("Budget (USD)").inputValue(), "25.5");
      assert.equal(await dialog.getByLabel("Budget period").inputValue(), "day");
      assert.equal(await dialog.getByRole("checkbox", { name: "fake-small" }).isChecked(), true);
      assert.equal(await dialog.getByRole("checkbox", { name: "fake-large" }).isChecked(), true);
      assert.deepEqual(await unlabelled(page), [], "every field of the dialog has a label");
      await page.keyboard.press("Escape");
      await dialog.waitFor({ state: "hidden" });
      assert.equal(await activeLabel(page), `Edit the settings of key ${ciKey.id} (ci runner)`);

      // Unchanged: nothing is sent.
      await edit.click();
      await dialog.getByRole("button", { name: "Save settings" }).click();
      await dialog.getByRole("alert").filter({ hasText: "Nothing to save" }).waitFor();
      assert.equal(sentTo("PATCH", `/keys/${ciKey.id}`).length, 0);

      // Clear the expiry and the budget, untick a model, change the limit: only those are sent, null for cleared.
      await dialog.getByLabel("Expires at").fill("");
      await dialog.getByLabel("Budget (USD)").fill("");
      await dialog.getByRole("checkbox", { name: "fake-small" }).uncheck();
      await dialog.getByLabel("Requests per minute").fill("30");
      await dialog.getByRole("button", { name: "Save settings" }).click();
      await dialog.waitFor({ state: "hidden" });
      await ciRow.filter({ hasText: "30 requests/min" }).waitFor();
      assert.deepEqual(sentTo("PATCH", `/keys/${ciKey.id}`).at(-1)!.body, {
        expires_at: null,
        requests_per_minute: 30,
        budget: null,
        models: ["fake-large"],
      });
      const edited = await text(ciRow);
      assert.match(edited, /Model: fake-large/);
      assert.ok(!/Expires|Budget/.test(edited), `expiry and budget removed: ${edited}`);
      assert.equal(await activeLabel(page), `Edit the settings of key ${ciKey.id} (ci runner)`, "the focus returns to Edit");
      await page.locator("#announcer", { hasText: `Settings of key ${ciKey.id} saved` }).waitFor();
      const afterEdit = (await listKeys(gw)).find((k) => k.id === ciKey.id)!;
      assert.equal(afterEdit.expires_at, null);
      assert.equal(afterEdit.budget, null);
      assert.deepEqual(afterEdit.models, ["fake-large"]);
      assert.equal(afterEdit.requests_per_minute, 30);

      // A 422 inside the dialog, at its field; then clear the rest: every model, no limit of its own.
      await edit.click();
      await dialog.getByLabel("Requests per minute").fill("0");
      await dialog.getByRole("button", { name: "Save settings" }).click();
      await dialog.locator(".field-error", { hasText: "The per-minute limit must be at least 1." }).waitFor();
      assert.equal(await dialog.getByLabel("Requests per minute").getAttribute("aria-invalid"), "true");
      // An expiry in the past: the server's reason at that field.
      await dialog.getByLabel("Requests per minute").fill("");
      const expiresInput = dialog.getByLabel("Expires at");
      await expiresInput.fill((await localInputIn(page, -2)).value);
      await dialog.getByRole("button", { name: "Save settings" }).click();
      await dialog.locator(".field-error", { hasText: /^The expiry time must be in the future \(it is .+ now\)\.$/ }).waitFor();
      assert.equal(await expiresInput.getAttribute("aria-invalid"), "true");
      assert.equal(await inPage(page, "document.activeElement?.type"), "datetime-local", "the field is focused");
      await expiresInput.fill("");
      await dialog.getByRole("checkbox", { name: "fake-large" }).uncheck();
      await dialog.getByLabel("Name", { exact: true }).fill("ci");
      await dialog.getByRole("button", { name: "Save settings" }).click();
      await dialog.waitFor({ state: "hidden" });
      assert.deepEqual(sentTo("PATCH", `/keys/${ciKey.id}`).at(-1)!.body, { requests_per_minute: null, models: null, name: "ci" });
      await ciRow.filter({ hasText: "None" }).waitFor();
      assert.match(await text(ciRow), /ci .*Never None Active/);

      // The last use, as recorded by the gateway: relative, its time in the title.
      const usedAt = Date.now() - 5 * 60_000;
      await gw.store.recordKeyUse([{ keyId: ciKey.id, atMs: usedAt }]);
      await page.getByRole("button", { name: "Refresh" }).click();
      await ciRow.locator("td.key-last-used", { hasText: "5 min ago" }).waitFor();
      const lastUsed = await ciRow.locator("td.key-last-used time").getAttribute("datetime");
      assert.ok(lastUsed && Math.abs(Date.parse(lastUsed) - usedAt) <= 60_000, `last used ${lastUsed}`);

      // Give it limits again, then rotate it with a grace of 2 hours: the new key is shown once, with what it replaces.
      await page.getByRole("button", { name: `Edit the settings of key ${ciKey.id} (ci)` }).click();
      await dialog.getByLabel("Requests per minute").fill("45");
      await dialog.getByRole("button", { name: "Save settings" }).click();
      await ciRow.filter({ hasText: "45 requests/min" }).waitFor();
      const rotate = page.getByRole("button", { name: `Rotate key ${ciKey.id} (ci)` });
      await rotate.click();
      const rotateDialog = page.getByRole("dialog", { name: `Rotate key ${ciKey.id}?` });
      await rotateDialog.waitFor();
      const grace = rotateDialog.getByLabel("Grace period (hours)");
      assert.equal(await grace.inputValue(), "24", "the default grace is 24 hours");
      assert.equal(await inPage(page, "document.activeElement?.closest('dialog')?.open === true"), true);
      await grace.fill("two");
      await rotateDialog.getByRole("button", { name: "Rotate key", exact: true }).click();
      await rotateDialog.locator(".field-error", { hasText: "in hours" }).waitFor();
      assert.equal(sentTo("POST", "/rotate").length, 0);
      await grace.fill("2");
      const rotatedAnswer = page.waitForResponse((r) => r.url().endsWith(`/keys/${ciKey.id}/rotate`));
      await grace.press("Enter");
      assert.equal((await rotatedAnswer).status(), 201);
      await rotateDialog.waitFor({ state: "hidden" });
      assert.deepEqual(sentTo("POST", `/keys/${ciKey.id}/rotate`).at(-1)!.body, { grace_seconds: 7200 });
      await keyOnce.waitFor();
      assert.equal(await activeId(page), "key-once-copy", "the focus goes to Copy");
      const once = await text(keyOnce);
      assert.match(once, /copy it now .*only time the key is shown/);
      assert.match(
        once,
        new RegExp(`It replaces key ${ciKey.id} \\(ci\\), with the same settings\\. The old key works until .*then gets 401`),
      );
      const rotatedKey = (await page.locator("#key-once-value").innerText()).trim();
      await page.keyboard.press("Enter");
      await page.locator("#key-once-status", { hasText: "Copied" }).waitFor();
      assert.equal(await inPage<string>(page, "navigator.clipboard.readText()"), rotatedKey);

      // Both keys are listed: the old one rotated, with its successor and its retirement; the new one with the settings.
      const all = await listKeys(gw);
      const oldKey = all.find((k) => k.id === ciKey.id)!;
      const newKey = all.find((k) => k.replaced_by === null && k.id !== gw.keyId && k.id !== ciKey.id)!;
      assert.equal(oldKey.replaced_by, newKey.id);
      assert.ok(rotatedKey.startsWith(`tds_${newKey.id}_`));
      assert.ok(Math.abs(Date.parse(oldKey.retires_at!) - (Date.now() + 7_200_000)) < 120_000, "retires in 2 hours");
      const oldRow = row(oldKey.id);
      const newRow = row(newKey.id);
      await oldRow.filter({ hasText: "Rotated" }).waitFor();
      await newRow.waitFor();
      assert.match(await text(oldRow), new RegExp(`Rotated Replaced by ${newKey.id} Works until`));
      assert.equal(await oldRow.locator("td.key-status time").getAttribute("datetime"), oldKey.retires_at);
      assert.match(await text(newRow), new RegExp(`ci .*Never 45 requests/min Active Replaces ${oldKey.id}`));
      assert.equal(await oldRow.getByRole("button", { name: /^Rotate|^Edit/ }).count(), 0, "a rotated key is not rotated or edited again");
      await oldRow.getByRole("button", { name: `Revoke key ${oldKey.id} (ci)` }).waitFor();
      assert.equal(await decideWithKey(gw, firstKey), 402, "the old key still works during its grace");
      assert.equal(await decideWithKey(gw, rotatedKey), 402, "and so does the new one");
      await inPage(page, "window.scrollTo(0, 0)");
      await page.locator("#org-detail").scrollIntoViewIfNeeded();
      await page.screenshot({ path: join(SCREENSHOTS, "admin-key-rotated.png") });

      // Another action hides the new key; a rotation without grace refuses the old key at once.
      await page.getByRole("button", { name: `Rotate key ${newKey.id} (ci)` }).click();
      assert.equal(await keyOnce.isVisible(), false);
      assert.equal(await page.locator("#key-once-value").innerText(), "", "the key is removed from the page");
      const rotateNew = page.getByRole("dialog", { name: `Rotate key ${newKey.id}?` });
      await rotateNew.getByLabel("Grace period (hours)").fill("0");
      await rotateNew.getByRole("button", { name: "Rotate key", exact: true }).click();
      await keyOnce.waitFor();
      const third = (await page.locator("#key-once-value").innerText()).trim();
      await newRow.filter({ hasText: "Retired" }).waitFor();
      assert.match(await text(newRow), /Retired .*Replaced by/);
      assert.equal(await newRow.getByRole("button").count(), 0, "a retired key has no actions");
      assert.equal(await decideWithKey(gw, rotatedKey), 401, "a retired key is refused");
      assert.equal(await decideWithKey(gw, third), 402);

      // The audit log names the changes.
      await page.locator("#audit-table tbody tr[data-action='key.rotated']").first().waitFor();
      const actions = await inPage<string[]>(
        page,
        `[...document.querySelectorAll("#audit-table tbody tr")].map((tr) => tr.dataset.action)`,
      );
      assert.deepEqual(
        actions,
        ["key.rotated", "key.created", "key.rotated", "key.created", "key.updated", "key.updated", "key.updated", "key.created"],
        "a rotation writes the old key's key.rotated and the new key's key.created",
      );
      const auditText = await text(page.locator("#audit-table"));
      for (const part of [
        "Key settings changed",
        "Key rotated",
        "expiry removed",
        "budget removed",
        "models fake-large",
        "30 requests/min",
        "per-minute limit removed",
        "model list removed",
        "budget 25.5 USD per UTC day",
        `new key ${newKey.id}`,
        `replaces key ${ciKey.id}`,
        "old key works until",
      ])
        assert.ok(auditText.includes(part), `the audit log shows ${part}: ${auditText}`);

      assert.deepEqual(await unlabelled(page), []);
      assert.deepEqual(await nullText(page, "#page-admin"), []);

      // Phone size: the page and the dialog fit.
      await page.setViewportSize({ width: 360, height: 740 });
      assert.ok(await inPage(page, "document.documentElement.scrollWidth <= 360"), "no horizontal page scrolling at 360 px");
      await page
        .getByRole("button", { name: /^Edit the settings of key/ })
        .last()
        .click();
      const phoneDialog = page.getByRole("dialog");
      await phoneDialog.waitFor();
      const box = await phoneDialog.boundingBox();
      assert.ok(box && box.x >= 0 && box.x + box.width <= 360, `the dialog fits: ${JSON.stringify(box)}`);
      await page.screenshot({ path: join(SCREENSHOTS, "admin-key-edit-phone.png") });
      await page.keyboard.press("Escape");
      assertClean(watch, gw);
    } finally {
      await context.close();
      await gw.close();
    }
  });
});
