/**
 * GET /docs through a real gateway (no browser): the redirect, the page and its assets with their
 * content types and the console's security headers, every URL the page refers to resolving, 404s
 * for unknown files and paths out of web/docs/, and the route staying out of /openapi.json.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { request } from "node:http";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { DEFAULT_DOCS_ROOT } from "../../src/http/routes/api-docs.ts";
import { CONSOLE_CSP } from "../../src/http/routes/console.ts";
import { type Gateway, startGateway } from "../support/gateway-harness.ts";

/** A GET with the path sent exactly as written (fetch would normalise "..", "%2e"). */
function rawGet(url: string, path: string): Promise<{ status: number; body: string }> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const req = request({ host: hostname, port, path, method: "GET" }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => (body += chunk));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on("error", reject);
    req.end();
  });
}

function assertSecurityHeaders(res: Response, what: string) {
  assert.equal(res.headers.get("content-security-policy"), CONSOLE_CSP, what);
  assert.equal(res.headers.get("x-content-type-options"), "nosniff", what);
  assert.equal(res.headers.get("x-frame-options"), "DENY", what);
  assert.equal(res.headers.get("referrer-policy"), "no-referrer", what);
  assert.equal(res.headers.get("cache-control"), "no-cache", what);
}

/** The URLs an HTML page or a module refers to: src/href attributes and static imports. */
function references(text: string): string[] {
  const attributes = [...text.matchAll(/\s(?:src|href)="([^"#][^"]*)"/g)].map((m) => m[1]!);
  const imports = [...text.matchAll(/^import\b[^"]*"([^"]+)";$/gm)].map((m) => m[1]!);
  return [...attributes, ...imports];
}

describe("GET /docs", () => {
  let gw: Gateway;
  before(async () => {
    gw = await startGateway({ env: { TDS_ADMIN_TOKEN: "docs-test-admin-token-0123456789abcdef" } });
  });
  after(async () => {
    await gw?.close();
  });

  test("/docs redirects to /docs/ (relative), which serves the page with the console's CSP and headers", async () => {
    const bare = await fetch(`${gw.url}/docs`, { redirect: "manual" });
    assert.equal(bare.status, 301);
    assert.equal(bare.headers.get("location"), "docs/");
    assert.equal(new URL(bare.headers.get("location")!, `${gw.url}/docs`).href, `${gw.url}/docs/`);
    assert.equal((await fetch(`${gw.url}/docs`)).url, `${gw.url}/docs/`);

    const page = await fetch(`${gw.url}/docs/`);
    assert.equal(page.status, 200);
    assert.equal(page.headers.get("content-type"), "text/html; charset=utf-8");
    assertSecurityHeaders(page, "/docs/");
    assert.equal(await page.text(), readFileSync(join(DEFAULT_DOCS_ROOT, "index.html"), "utf8"));
    assert.equal((await fetch(`${gw.url}/docs/index.html`)).status, 200);

    const etag = page.headers.get("etag")!;
    const again = await fetch(`${gw.url}/docs/`, { headers: { "if-none-match": etag } });
    assert.equal(again.status, 304);
  });

  test("its assets have their content types, and everything the page and its modules refer to resolves", async () => {
    const types: Record<string, string> = {
      "docs.js": "text/javascript; charset=utf-8",
      "schema-view.js": "text/javascript; charset=utf-8",
      "docs.css": "text/css; charset=utf-8",
    };
    for (const [file, type] of Object.entries(types)) {
      const res = await fetch(`${gw.url}/docs/${file}`);
      assert.equal(res.status, 200, file);
      assert.equal(res.headers.get("content-type"), type, file);
      assertSecurityHeaders(res, file);
      await res.arrayBuffer();
    }

    const pending = ["/docs/", "/docs/docs.js", "/docs/schema-view.js"].map((path) => new URL(path, gw.url));
    const checked = new Set<string>();
    while (pending.length > 0) {
      const url = pending.pop()!;
      if (checked.has(url.href)) continue;
      checked.add(url.href);
      const res = await fetch(url);
      assert.equal(res.status, 200, url.href);
      assert.equal(url.origin, gw.url, `${url.href}: another origin`);
      const text = await res.text();
      const type = res.headers.get("content-type") ?? "";
      // The page's HTML and every module it loads (the console's page itself is another test's business).
      if (type.startsWith("text/javascript") || (type.startsWith("text/html") && url.pathname.startsWith("/docs/"))) {
        pending.push(...references(text).map((ref) => new URL(ref, url)));
      }
    }
    for (const expected of [
      "/console/console.css",
      "/console/dom.js",
      "/console/favicon.svg",
      "/console/",
      "/openapi.json",
      "/docs/docs.css",
    ]) {
      assert.ok(checked.has(new URL(expected, gw.url).href), `the page refers to ${expected}`);
    }
  });

  test("unknown files and paths out of web/docs/ are 404s", async () => {
    const missing = await fetch(`${gw.url}/docs/nope.js`);
    assert.equal(missing.status, 404);
    assert.equal(((await missing.json()) as { detail: string }).detail, "No such docs file.");
    assert.equal((await fetch(`${gw.url}/docs/readme.md`)).status, 404);
    for (const path of [
      "/docs/../package.json",
      "/docs/..%2fconsole.js",
      "/docs/%2e%2e/index.html",
      "/docs/.hidden.js",
      "/docs//etc/passwd",
    ]) {
      const res = await rawGet(gw.url, path);
      assert.ok(res.status === 404 || res.status === 400, `${path}: ${res.status}`);
      assert.ok(!res.body.includes("typed-decision-service") && !res.body.includes("root:"), path);
    }
  });

  test("the route is not in /openapi.json", async () => {
    const doc = (await (await fetch(`${gw.url}/openapi.json`)).json()) as { paths: Record<string, unknown> };
    const paths = Object.keys(doc.paths);
    assert.ok(paths.includes("/v1/systemone") && paths.includes("/admin/v1/audit"), "the document lists the API");
    assert.deepEqual(
      paths.filter((p) => p === "/docs" || p.startsWith("/docs/")),
      [],
    );
  });
});
