/**
 * The API reference page (/docs) in a real browser (Debian's chromium driven by playwright-core)
 * against a real gateway with the admin API on: it shows every operation of the live /openapi.json,
 * a known operation's request body fields and response statuses, the security schemes; the contents
 * links navigate; headings, landmarks and focus; 390 px without horizontal scrolling; and the page
 * talks to nothing but the gateway, without console errors or CSP violations. Screenshots go to
 * test-output/screenshots/ (api-docs.png, api-docs-phone.png).
 */
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { type Gateway, startGateway } from "../support/gateway-harness.ts";
import { inPage, launchChromium, type PageWatch, watchPage } from "./browser.ts";

const SCREENSHOTS = join(import.meta.dirname, "..", "..", "test-output", "screenshots");
const ADMIN_TOKEN = "docs-page-admin-token-0123456789abcdef";
const METHODS = ["get", "put", "post", "patch", "delete"];

interface OpenApiDocument {
  info: { title: string; version: string; description: string };
  components: { securitySchemes: Record<string, { description: string }> };
  paths: Record<string, Record<string, { responses: Record<string, unknown> }>>;
}

async function openDocs(
  browser: Browser,
  gw: Gateway,
  viewport: { width: number; height: number },
): Promise<{ context: BrowserContext; page: Page; watch: PageWatch }> {
  const context = await browser.newContext({ viewport, baseURL: gw.url });
  const page = await context.newPage();
  page.setDefaultTimeout(8000);
  const watch = watchPage(page);
  const response = await page.goto("/docs");
  assert.equal(new URL(page.url()).pathname, "/docs/");
  assert.match(response?.headers()["content-security-policy"] ?? "", /^default-src 'self'; script-src 'self'; style-src 'self'/);
  await page.locator("#main:not([aria-busy])").waitFor();
  return { context, page, watch };
}

function assertOnlyGateway(watch: PageWatch, gw: Gateway) {
  const foreign = watch.requests.filter((url) => new URL(url).origin !== gw.url);
  assert.deepEqual(foreign, [], `requests to another origin than ${gw.url}`);
  assert.ok(
    watch.requests.some((url) => url.endsWith("/openapi.json")),
    "the page read /openapi.json",
  );
  assert.deepEqual(watch.problems, [], "console errors, page errors or CSP violations");
}

const noHorizontalScroll = (page: Page) => inPage<boolean>(page, "document.documentElement.scrollWidth <= window.innerWidth");

describe("API reference page in a browser", { timeout: 60_000 }, () => {
  let browser: Browser;
  let gw: Gateway;
  let doc: OpenApiDocument;
  before(async () => {
    mkdirSync(SCREENSHOTS, { recursive: true });
    browser = await launchChromium();
    gw = await startGateway({ env: { TDS_ADMIN_TOKEN: ADMIN_TOKEN } });
    doc = (await (await fetch(`${gw.url}/openapi.json`)).json()) as OpenApiDocument;
  });
  after(async () => {
    await browser?.close();
    await gw?.close();
  });

  test("shows the document: info, security schemes, every operation; a known operation in detail", async () => {
    const { context, page, watch } = await openDocs(browser, gw, { width: 1280, height: 900 });
    try {
      await page.screenshot({ path: join(SCREENSHOTS, "api-docs.png") });
      assert.equal(await page.getByRole("heading", { level: 1 }).innerText(), doc.info.title);
      assert.match(await page.locator("#api-meta").innerText(), new RegExp(`Version ${doc.info.version.replaceAll(".", "\\.")}`));
      await page.getByText(doc.info.description, { exact: true }).waitFor();

      for (const [name, scheme] of Object.entries(doc.components.securitySchemes)) {
        const card = page.locator(`#security-${name}`);
        assert.equal(await card.getByRole("heading", { level: 3 }).innerText(), name);
        assert.match(await card.innerText(), /Authorization: Bearer <token>/);
        await card.getByText(scheme.description, { exact: true }).waitFor();
      }
      assert.deepEqual(Object.keys(doc.components.securitySchemes).sort(), ["admin", "bearer"]);

      const expected = Object.entries(doc.paths)
        .flatMap(([path, item]) => METHODS.filter((m) => item[m]).map((m) => `${m.toUpperCase()} ${path}`))
        .sort();
      assert.ok(expected.length >= 15 && expected.includes("POST /admin/v1/organizations"), "the admin API is documented too");
      const shown = (await page.locator("article.operation h3").allInnerTexts()).map((t) => t.replace(/\s+/g, " ").trim()).sort();
      assert.deepEqual(shown, expected);
      const listed = (await page.getByRole("navigation", { name: "Contents" }).locator("ul ul a").allInnerTexts())
        .map((t) => t.replace(/\s+/g, " ").trim())
        .sort();
      assert.deepEqual(listed, expected);

      // POST /v1/systemone: its body's fields (required ones marked), its parameters and every response status.
      const decide = page.locator("article.operation", { has: page.getByRole("heading", { name: "POST /v1/systemone", level: 3 }) });
      await decide.getByText("Authentication: bearer").waitFor();
      const body = decide.locator("section.op-part", { has: page.getByRole("heading", { name: "Request body", level: 4 }) });
      const field = (name: string) =>
        body.locator(".schema-root > li.field", { has: page.locator(`> .field-head > code.field-name:text-is("${name}")`) });
      for (const name of ["state", "questions"]) assert.match(await field(name).locator("> .field-head").innerText(), /REQUIRED/i, name);
      assert.doesNotMatch(await field("model").locator("> .field-head").innerText(), /REQUIRED/i);
      assert.match(await field("model").locator("> .field-head").innerText(), /string or null/);
      assert.match(await field("questions").innerText(), /1–32 entries/);
      for (const variant of ["ChoiceQuestion", "ScoreQuestion", "NoulQuestion"])
        await field("questions").getByText(variant, { exact: true }).waitFor();
      const params = decide.locator("section.op-part", { has: page.getByRole("heading", { name: "Parameters", level: 4 }) });
      assert.match(await params.innerText(), /idempotency-key\s+in header\s+string/);

      const statuses = await decide.locator(".response .status").allInnerTexts();
      assert.deepEqual(statuses, Object.keys(doc.paths["/v1/systemone"]!.post!.responses));
      for (const status of ["200", "401", "422"]) assert.ok(statuses.includes(status), status);
      const unprocessable = decide.locator(".response", { has: page.locator('.status:text-is("422")') });
      await unprocessable.getByText("Invalid body or query, unknown model, or context rejected").waitFor();
      await unprocessable.getByText("application/json · ErrorResponse").click();
      await unprocessable.locator("code.field-name", { hasText: "detail" }).waitFor();
      const success = decide.locator(".response", { has: page.locator('.status:text-is("200")') });
      await success.getByText("application/json · DecisionResponse").click();
      await success.locator("code.field-name", { hasText: "answers" }).first().waitFor();

      // A parameter's enum and a path parameter.
      const usage = page.locator("article.operation", { has: page.getByRole("heading", { name: "GET /v1/usage", exact: true, level: 3 }) });
      assert.match(await usage.innerText(), /one of "in_flight", "succeeded"/);
      const record = page.locator("article.operation", {
        has: page.getByRole("heading", { name: "GET /v1/usage/{request_id}", level: 3 }),
      });
      assert.match(await record.locator(".params").innerText(), /request_id\s+in path\s+string\s+REQUIRED/i);

      // Headings never skip a level, one h1; the landmarks.
      const levels = await inPage<number[]>(
        page,
        `[...document.querySelectorAll("h1, h2, h3, h4, h5, h6")].map((e) => Number(e.tagName[1]))`,
      );
      assert.equal(levels.filter((l) => l === 1).length, 1);
      levels.reduce((previous, level) => {
        assert.ok(level <= previous + 1, `h${previous} followed by h${level}`);
        return level;
      });
      assert.equal(await page.getByRole("main").count(), 1);
      assert.equal(await page.getByRole("banner").count(), 1);
      await page.getByRole("navigation", { name: "Contents" }).waitFor();

      assertOnlyGateway(watch, gw);
    } finally {
      await context.close();
    }
  });

  test("contents links navigate, focus is visible, the console link leads to the console", async () => {
    const { context, page, watch } = await openDocs(browser, gw, { width: 1280, height: 900 });
    try {
      const contents = page.getByRole("navigation", { name: "Contents" });
      const broken = await inPage<string[]>(
        page,
        `[...document.querySelectorAll("#toc a")].map((a) => a.getAttribute("href")).filter((href) => !document.getElementById(href.slice(1)))`,
      );
      assert.deepEqual(broken, [], "contents links without a target");

      const target = "POST /admin/v1/organizations/{org}/credits";
      const link = contents.getByRole("link", { name: target });
      const href = (await link.getAttribute("href"))!;
      await link.click();
      await page.waitForFunction(`location.hash === ${JSON.stringify(href)}`);
      const top = await inPage<number>(page, `document.getElementById(${JSON.stringify(href.slice(1))}).getBoundingClientRect().top`);
      assert.ok(top >= 0 && top < 100, `the operation is scrolled to the top (at ${top})`);
      assert.ok((await inPage<number>(page, "scrollY")) > 2000, "the page scrolled");
      assert.equal(
        await page
          .locator(`${href} h3`)
          .innerText()
          .then((t) => t.replace(/\s+/g, " ")),
        target,
      );

      await contents.getByRole("link", { name: "Authentication" }).click();
      await page.waitForFunction(`location.hash === "#security"`);

      // A fragment in the URL is honoured although the page is built after loading.
      await page.goto(`/docs/${href}`);
      await page.locator("#main:not([aria-busy])").waitFor();
      await page.waitForFunction(`Math.abs(document.querySelector(${JSON.stringify(href)}).getBoundingClientRect().top) < 100`);

      // Keyboard: the skip link comes first, and focus is drawn.
      await page.goto("/docs/");
      await page.locator("#main:not([aria-busy])").waitFor();
      await page.keyboard.press("Tab");
      assert.equal(await inPage(page, "document.activeElement.textContent"), "Skip to content");
      assert.equal(await inPage(page, "getComputedStyle(document.activeElement).outlineStyle"), "solid");
      await page.keyboard.press("Tab");
      assert.equal(await inPage(page, "document.activeElement.textContent"), "Console");
      assert.notEqual(await inPage(page, "getComputedStyle(document.activeElement).outlineStyle"), "none");

      await page.getByRole("link", { name: "Console", exact: true }).click();
      await page.waitForURL(`${gw.url}/console/`);
      assertOnlyGateway(watch, gw);
    } finally {
      await context.close();
    }
  });

  test("390 px: no horizontal scrolling, also with the contents and every schema unfolded", async () => {
    const { context, page, watch } = await openDocs(browser, gw, { width: 390, height: 844 });
    try {
      assert.ok(await noHorizontalScroll(page), "no horizontal scrolling at 390 px");
      const toc = page.locator("#toc-details");
      assert.equal(await toc.getAttribute("open"), null, "the contents start folded on a phone");
      await page.screenshot({ path: join(SCREENSHOTS, "api-docs-phone.png") });
      await toc.locator("summary").click();
      await page.getByRole("navigation", { name: "Contents" }).getByRole("link", { name: "POST /v1/systemone" }).click();
      // Anchors are named after the operationId (createDecision).
      await page.waitForFunction(`location.hash === "#op-createdecision"`);
      assert.equal(await toc.getAttribute("open"), null, "following a link folds the contents again");
      await inPage(page, `document.querySelectorAll("details").forEach((d) => (d.open = true))`);
      assert.ok(await noHorizontalScroll(page), "no horizontal scrolling with everything unfolded");
      const overflowing = await inPage<string[]>(
        page,
        `[...document.querySelectorAll("#main *")].filter((e) => e.getBoundingClientRect().right > innerWidth + 0.5).map((e) => e.outerHTML.slice(0, 120))`,
      );
      assert.deepEqual(overflowing, [], "elements past the right edge");
      assertOnlyGateway(watch, gw);
    } finally {
      await context.close();
    }
  });

  test("other documents: tags group operations, $refs are followed, recursion is cut, examples are shown", async () => {
    const pet = {
      type: "object",
      required: ["name"],
      properties: {
        name: { type: "string", minLength: 1, description: "The pet's `name`" },
        kind: { enum: ["cat", "dog"] },
        parent: { $ref: "#/components/schemas/Pet" },
      },
    };
    const synthetic = {
      openapi: "3.1.0",
      info: { title: "Pets", version: "2.0.0", description: "A test document." },
      tags: [{ name: "pets", description: "Everything about pets" }],
      components: { schemas: { Pet: pet }, securitySchemes: { key: { type: "apiKey", in: "header", name: "x-key" } } },
      security: [{ key: [] }],
      paths: {
        "/pets/{id}": {
          parameters: [{ name: "id", in: "path", required: true, schema: { type: "integer", minimum: 1 } }],
          put: {
            tags: ["pets"],
            summary: "Replace a pet",
            requestBody: {
              required: true,
              content: { "application/json": { schema: { $ref: "#/components/schemas/Pet" }, example: { name: "Rex", kind: "dog" } } },
            },
            responses: {
              "200": { description: "The pet", content: { "application/json": { schema: { $ref: "#/components/schemas/Pet" } } } },
            },
          },
        },
      },
    };
    const context = await browser.newContext({ baseURL: gw.url });
    const page = await context.newPage();
    const watch = watchPage(page);
    try {
      await page.route("**/openapi.json", (route) =>
        route.fulfill({ status: 200, contentType: "application/json", body: JSON.stringify(synthetic) }),
      );
      await page.goto("/docs/");
      await page.locator("#main:not([aria-busy])").waitFor();
      assert.equal(
        await page
          .locator("#docs-content > section h2")
          .allInnerTexts()
          .then((t) => t.join("|")),
        "Authentication|pets",
      );
      await page.getByText("Everything about pets").waitFor();
      assert.match(await page.locator("#security-key").innerText(), /An API key in the header x-key\s+Used by 1 operation in pets/);

      const op = page.locator("article.operation", { has: page.getByRole("heading", { name: "PUT /pets/{id}", level: 3 }) });
      assert.match(await op.locator(".params").innerText(), /id\s+in path\s+integer\s+REQUIRED\s+≥ 1/i);
      assert.match(await op.innerText(), /Authentication: key/);
      const body = op.locator("section.op-part", { has: page.getByRole("heading", { name: "Request body" }) });
      assert.match(await body.locator(".schema-type").innerText(), /Pet\s+object/);
      assert.match(await body.innerText(), /name\s+string\s+REQUIRED\s+at least 1 character\s+The pet's name/i);
      assert.equal(await body.locator("code", { hasText: /^name$/ }).count(), 2, "the backticked `name` is code");
      assert.match(await body.innerText(), /kind\s+string\s+one of "cat", "dog"/);
      assert.match(await body.innerText(), /parent\s+Pet\s+recursive: see above/);
      assert.deepEqual(JSON.parse(await body.locator("pre").innerText()), { name: "Rex", kind: "dog" });
      assertOnlyGateway(watch, gw);
    } finally {
      await context.close();
    }
  });

  test("an unavailable /openapi.json is reported on the page", async () => {
    const context = await browser.newContext({ baseURL: gw.url });
    const page = await context.newPage();
    try {
      await page.route("**/openapi.json", (route) =>
        route.fulfill({ status: 503, contentType: "application/json", body: '{"detail":"down"}' }),
      );
      await page.goto("/docs/");
      const alert = page.getByRole("alert");
      await alert.waitFor();
      assert.match(await alert.innerText(), /Could not load the API description .*503/);
    } finally {
      await context.close();
    }
  });
});
