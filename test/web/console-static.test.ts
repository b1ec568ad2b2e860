/**
 * How the gateway serves the console's static files (no browser): redirects, content types,
 * caching, the Content-Security-Policy, no way out of web/, and that the files themselves need
 * nothing the policy forbids (inline scripts or styles, other hosts).
 */
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { request } from "node:http";
import { tmpdir } from "node:os";
import { extname, join } from "node:path";
import { describe, test } from "node:test";
import Fastify from "fastify";
import { consoleRoutes, DEFAULT_WEB_ROOT } from "../../src/http/routes/console.ts";
import { startGateway } from "../support/gateway-harness.ts";

/** A GET with the path sent exactly as written (fetch would normalise "..", "%2e"). */
function rawGet(
  url: string,
  path: string,
): Promise<{ status: number; body: string; headers: Record<string, string | string[] | undefined> }> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const req = request({ host: hostname, port, path, method: "GET" }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => (body += chunk));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body, headers: res.headers }));
    });
    req.on("error", reject);
    req.end();
  });
}

function webFiles(dir = DEFAULT_WEB_ROOT, prefix = ""): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? webFiles(join(dir, e.name), `${prefix}${e.name}/`) : [`${prefix}${e.name}`],
  );
}

describe("console static files", () => {
  test("GET / and /console redirect; files have their content type, an ETag, no-cache and the CSP", async () => {
    const gw = await startGateway();
    try {
      const root = await fetch(`${gw.url}/`, { redirect: "manual" });
      assert.equal(root.status, 302);
      assert.equal(new URL(root.headers.get("location")!, `${gw.url}/`).href, `${gw.url}/console/`);
      const bare = await fetch(`${gw.url}/console`, { redirect: "manual" });
      assert.equal(bare.status, 301);
      assert.equal(new URL(bare.headers.get("location")!, `${gw.url}/console`).href, `${gw.url}/console/`);
      assert.equal((await fetch(`${gw.url}/`)).url, `${gw.url}/console/`);

      const index = await fetch(`${gw.url}/console/`);
      assert.equal(index.status, 200);
      assert.equal(index.headers.get("content-type"), "text/html; charset=utf-8");
      const csp = index.headers.get("content-security-policy") ?? "";
      assert.match(csp, /^default-src 'self'; /);
      assert.match(csp, /script-src 'self'(;|$)/);
      assert.ok(!csp.includes("unsafe-inline") && !csp.includes("unsafe-eval") && !csp.includes("*"), csp);
      assert.match(csp, /frame-ancestors 'none'/);
      assert.equal(index.headers.get("x-content-type-options"), "nosniff");
      assert.equal(index.headers.get("cache-control"), "no-cache");
      const etag = index.headers.get("etag");
      assert.match(etag ?? "", /^"[A-Za-z0-9_-]+"$/);
      const html = await index.text();
      assert.equal(html, readFileSync(join(DEFAULT_WEB_ROOT, "index.html"), "utf8"));
      assert.equal((await fetch(`${gw.url}/console/index.html`)).headers.get("etag"), etag);

      const again = await fetch(`${gw.url}/console/`, { headers: { "if-none-match": etag! } });
      assert.equal(again.status, 304);
      assert.equal(await again.text(), "");
      assert.equal((await fetch(`${gw.url}/console/`, { headers: { "if-none-match": '"other"' } })).status, 200);
      const head = await fetch(`${gw.url}/console/console.js`, { method: "HEAD" });
      assert.equal(head.status, 200);
      assert.equal(head.headers.get("content-type"), "text/javascript; charset=utf-8");

      const types: Record<string, string> = {
        ".html": "text/html; charset=utf-8",
        ".js": "text/javascript; charset=utf-8",
        ".css": "text/css; charset=utf-8",
        ".svg": "image/svg+xml",
      };
      for (const file of webFiles()) {
        const res = await fetch(`${gw.url}/console/${file}`);
        assert.equal(res.status, 200, file);
        assert.equal(res.headers.get("content-type"), types[extname(file)], file);
        assert.ok(res.headers.get("content-security-policy"), file);
        await res.arrayBuffer();
      }
      const missing = await fetch(`${gw.url}/console/nope.js`);
      assert.equal(missing.status, 404);
      assert.equal(((await missing.json()) as { detail: string }).detail, "No such console file.");
    } finally {
      await gw.close();
    }
  });

  test("no path leads out of web/: dot segments, encoded or not, dot-files, other extensions, symlinks", async () => {
    const gw = await startGateway();
    const dir = mkdtempSync(join(tmpdir(), "tds-web-"));
    const app = Fastify({ logger: false });
    try {
      const attempts = [
        "/console/../package.json",
        "/console/..%2fpackage.json",
        "/console/%2e%2e/package.json",
        "/console/%2e%2e%2fpackage.json",
        "/console/%2E%2E%2F%2E%2E%2Fetc%2Fpasswd",
        "/console/..%5cpackage.json",
        "/console/sub/../../package.json",
        "/console//etc/passwd",
        "/console/%2fetc%2fpasswd",
        "/console/index.html%00.js",
        "/console/.gitignore",
        "/console/./index.html",
        "/console/../src/app.ts",
        "/console/..%2f..%2f..%2f..%2f..%2fetc%2fpasswd",
      ];
      for (const path of attempts) {
        const res = await rawGet(gw.url, path);
        assert.ok(res.status === 404 || res.status === 400, `${path}: ${res.status}`);
        assert.ok(!res.body.includes('"name": "typed-decision-service"') && !res.body.includes("root:"), path);
      }

      // A root of our own: a symlink out of it, a source file and a dot-file are not served.
      mkdirSync(join(dir, "web"));
      writeFileSync(join(dir, "web", "index.html"), "<!doctype html><title>t</title>");
      writeFileSync(join(dir, "secret.txt"), "secret");
      writeFileSync(join(dir, "web", "server.ts"), "export {}");
      writeFileSync(join(dir, "web", ".env.json"), "{}");
      symlinkSync(join(dir, "secret.txt"), join(dir, "web", "leak.txt"));
      consoleRoutes(app, { root: join(dir, "web") });
      await app.listen({ host: "127.0.0.1", port: 0 });
      const address = app.server.address();
      const url = `http://127.0.0.1:${typeof address === "object" && address ? address.port : 0}`;
      assert.equal((await rawGet(url, "/console/")).status, 200);
      for (const path of [
        "/console/leak.txt",
        "/console/server.ts",
        "/console/.env.json",
        "/console/../secret.txt",
        "/console/..%2fsecret.txt",
      ]) {
        const res = await rawGet(url, path);
        assert.equal(res.status, 404, path);
        assert.ok(!res.body.includes("secret"), path);
      }
    } finally {
      await app.close();
      await gw.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("the files need nothing the policy forbids: no inline scripts, styles or handlers, no other hosts", () => {
    for (const file of webFiles()) {
      const text = readFileSync(join(DEFAULT_WEB_ROOT, file), "utf8");
      if (file.endsWith(".html")) {
        for (const tag of text.match(/<script\b[^>]*>/g) ?? []) assert.match(tag, /\bsrc="[^"]+"/, `${file}: inline script ${tag}`);
        assert.doesNotMatch(text, /<style\b/i, `${file}: inline <style>`);
        assert.doesNotMatch(text, /\sstyle="/i, `${file}: style attribute`);
        assert.doesNotMatch(text, /\son[a-z]+="/i, `${file}: inline event handler`);
      }
      if (file.endsWith(".js")) {
        assert.doesNotMatch(
          text,
          /\binnerHTML\b|\bouterHTML\b|insertAdjacentHTML|document\.write|\beval\(|new Function\(/,
          `${file}: HTML or code from strings`,
        );
        assert.doesNotMatch(text, /setAttribute\(\s*["']style["']/, `${file}: style attribute`);
      }
      const urls = (text.match(/https?:\/\/[^\s"'`)<]+/g) ?? []).filter((u) => u !== "http://www.w3.org/2000/svg");
      assert.deepEqual(urls, [], `${file}: refers to another host`);
      assert.doesNotMatch(text, /@import|url\(\s*["']?(https?:)?\/\//, `${file}: external stylesheet or font`);
    }
  });
});
