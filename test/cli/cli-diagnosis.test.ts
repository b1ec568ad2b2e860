/**
 * The `tds` CLI tells common mistakes apart: a --url with a path of the gateway's own (corrected, with a note), a URL
 * that is not a Typed Decision Service gateway (a model server, a web page, a server refusing every token), a gateway
 * whose admin API is off, a mistyped command ("did you mean"), and the secrets read from files (TDS_ADMIN_TOKEN_FILE,
 * TDS_DATABASE_URL_FILE). Every gateway and server here really listens on 127.0.0.1.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { runCli } from "../../src/cli/cli.ts";
import { chooseTransport } from "../../src/cli/connection.ts";
import { type FakeModelServer, startFakeModelServer } from "../fixtures/fake-model-server.ts";
import { type Gateway, startGateway } from "../support/gateway-harness.ts";

const TOKEN = "adm-Diag7Kq2Zx9Lw4Nv7Bc1Rt8Hs3Pd";
const dir = mkdtempSync(join(tmpdir(), "tds-cli-diagnosis-"));
after(() => rmSync(dir, { recursive: true, force: true }));

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

async function cli(args: string[], env: Record<string, string>): Promise<Run> {
  let stdout = "";
  let stderr = "";
  const code = await runCli(args, {
    stdout: { write: (t: string) => (stdout += t) },
    stderr: { write: (t: string) => (stderr += t) },
    env,
    operator: () => "ops-diag",
  });
  return { code, stdout, stderr };
}

function names(run: Run): string[] {
  assert.equal(run.code, 0, `exit 0 expected; stderr: ${run.stderr}`);
  return (JSON.parse(run.stdout) as { name: string }[]).map((o) => o.name);
}

/** A server that answers every request the same way (not a gateway), counting the requests by path. */
async function startOther(status: number, contentType: string, body: string): Promise<{ url: string; paths: string[]; server: Server }> {
  const paths: string[] = [];
  const server = createServer((req, res) => {
    paths.push(`${req.method} ${req.url}`);
    req.resume();
    res.writeHead(status, { "content-type": contentType }).end(body);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, paths, server };
}

/** A reverse proxy that serves `target` under the path prefix /tds, recording each request it forwards. */
async function startPrefixProxy(target: string): Promise<{ url: string; paths: string[]; server: Server }> {
  const paths: string[] = [];
  const server = createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const path = (req.url ?? "/").replace(/\?.*/, "");
    paths.push(`${req.method} ${path}`);
    if (!path.startsWith("/tds/")) return void res.writeHead(404, { "content-type": "text/plain" }).end("no such site");
    const headers = Object.fromEntries(
      Object.entries(req.headers).filter((e): e is [string, string] => typeof e[1] === "string" && e[0] !== "host"),
    );
    const answer = await fetch(`${target}${(req.url ?? "").slice("/tds".length)}`, {
      method: req.method ?? "GET",
      headers,
      ...(chunks.length > 0 ? { body: Buffer.concat(chunks) } : {}),
    });
    res.writeHead(answer.status, { "content-type": answer.headers.get("content-type") ?? "text/plain" });
    res.end(Buffer.from(await answer.arrayBuffer()));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/tds`, paths, server };
}

const literal = (text: string) => text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");

describe("tds --url: a URL with a path of the gateway's own is corrected to the gateway's URL", () => {
  let gw: Gateway;
  before(async () => {
    gw = await startGateway({ fake: false, env: { TDS_ADMIN_TOKEN: TOKEN } });
  });
  after(() => gw.close());

  it("drops /admin/v1, /v1 and other API paths with a one-line note on stderr, from --url and TDS_URL", async () => {
    for (const path of ["/admin/v1", "/admin/v1/", "/admin/v1/organizations", "/v1", "/v1/models", "/api/config", "/console/"]) {
      const dropped = path.replace(/\/+$/, "");
      const viaFlag = await cli(["--url", `${gw.url}${path}`, "org", "list", "--json"], { TDS_ADMIN_TOKEN: TOKEN });
      assert.deepEqual(names(viaFlag), ["test-org"], path);
      assert.equal(viaFlag.stderr, `Using the gateway at ${gw.url}: --url takes the gateway's URL, without ${dropped}.\n`);
      const viaEnv = await cli(["org", "list", "--json"], { TDS_URL: `${gw.url}${path}`, TDS_ADMIN_TOKEN: TOKEN });
      assert.deepEqual(names(viaEnv), ["test-org"], path);
      assert.equal(viaEnv.stderr, `Using the gateway at ${gw.url}: TDS_URL takes the gateway's URL, without ${dropped}.\n`);
    }
  });

  it("takes the gateway's URL and a trailing slash as they are, without a note", async () => {
    for (const url of [gw.url, `${gw.url}/`, `${gw.url}//`]) {
      const run = await cli(["--url", url, "org", "list", "--json"], { TDS_ADMIN_TOKEN: TOKEN });
      assert.deepEqual(names(run), ["test-org"], url);
      assert.equal(run.stderr, "", url);
    }
  });

  it("keeps a reverse proxy's path prefix; a command that succeeds makes one request, a failed one adds one probe", async () => {
    const proxy = await startPrefixProxy(gw.url);
    try {
      const run = await cli(["org", "list", "--json"], { TDS_URL: `${proxy.url}/admin/v1/`, TDS_ADMIN_TOKEN: TOKEN });
      assert.deepEqual(names(run), ["test-org"]);
      assert.equal(run.stderr, `Using the gateway at ${proxy.url}: TDS_URL takes the gateway's URL, without /admin/v1.\n`);
      assert.deepEqual(proxy.paths, ["GET /tds/admin/v1/organizations"]);
      const unknown = await cli(["org", "show", "Nobody"], { TDS_URL: proxy.url, TDS_ADMIN_TOKEN: TOKEN });
      assert.equal(unknown.stderr, 'tds: No organization with id or name "Nobody". See: tds org list\n');
      assert.deepEqual(proxy.paths.slice(1), ["GET /tds/admin/v1/organizations/Nobody", "GET /tds/api/config"]);
    } finally {
      proxy.server.closeAllConnections();
      proxy.server.close();
    }
  });

  it("keeps a reverse proxy's path prefix before the dropped path", () => {
    const env = { TDS_ADMIN_TOKEN: TOKEN };
    assert.deepEqual(chooseTransport({ url: "https://ops.example.com/tds/admin/v1/" }, env), {
      kind: "http",
      url: "https://ops.example.com/tds",
      token: TOKEN,
      via: "--url",
      droppedPath: "/admin/v1",
    });
    assert.deepEqual(chooseTransport({ url: "https://ops.example.com/tds/" }, env), {
      kind: "http",
      url: "https://ops.example.com/tds",
      token: TOKEN,
      via: "--url",
    });
    const kept = chooseTransport({ url: "https://ops.example.com/api/admin-panel" }, env);
    assert.equal(kept.kind === "http" && kept.url, "https://ops.example.com/api/admin-panel");
  });
});

describe("tds --url: something that is not a Typed Decision Service gateway", () => {
  let gw: Gateway;
  let off: Gateway;
  let fake: FakeModelServer;
  before(async () => {
    [gw, off, fake] = await Promise.all([
      startGateway({ fake: false, env: { TDS_ADMIN_TOKEN: TOKEN } }),
      startGateway({ fake: false }),
      startFakeModelServer(),
    ]);
  });
  after(() => Promise.all([gw.close(), off.close(), fake.close()]));

  it("a model server: says it is not a gateway, with what it answered (not 'not found')", async () => {
    const seen = 'answered 404 {"detail":"not found"}';
    const cases: Array<[string[], string]> = [
      [["org", "list"], `GET /admin/v1/organizations ${seen}`],
      [["org", "show", "acme"], `GET /admin/v1/organizations/acme ${seen}`],
      [["org", "create", "acme"], `POST /admin/v1/organizations ${seen}`],
      [["key", "revoke", "abcdefabcdef"], `GET /admin/v1/keys/abcdefabcdef ${seen}`],
    ];
    for (const [args, request] of cases) {
      const run = await cli(["--url", fake.url, ...args], { TDS_ADMIN_TOKEN: TOKEN });
      assert.equal(run.code, 1, `tds ${args.join(" ")}: ${run.stderr}`);
      assert.equal(run.stdout, "");
      assert.equal(
        run.stderr,
        `tds: ${fake.url} is not a Typed Decision Service gateway (${request}; GET /api/config ${seen})\n`,
        `tds ${args.join(" ")}`,
      );
    }
    // The model server's own API URL: corrected first, then found not to be a gateway.
    const v1 = await cli(["--url", `${fake.url}/v1`, "org", "list"], { TDS_ADMIN_TOKEN: TOKEN });
    assert.equal(v1.code, 1);
    assert.match(
      v1.stderr,
      new RegExp(
        `^Using the gateway at ${literal(fake.url)}: --url takes the gateway's URL, without /v1\\.\\ntds: ${literal(fake.url)} is not a Typed Decision Service gateway \\(`,
      ),
    );
  });

  it("a web page answering 200 to everything, and a server refusing every token: not a gateway either", async () => {
    const page = await startOther(200, "text/html; charset=utf-8", "<!doctype html><title>Welcome</title>");
    const refusing = await startOther(401, "application/json", JSON.stringify({ detail: "invalid API key" }));
    try {
      const html = await cli(["--url", page.url, "org", "list"], { TDS_ADMIN_TOKEN: TOKEN });
      assert.equal(html.code, 1);
      assert.equal(
        html.stderr,
        `tds: ${page.url} is not a Typed Decision Service gateway (GET /admin/v1/organizations answered 200 text/html; GET /api/config answered 200 text/html)\n`,
      );
      assert.deepEqual(
        page.paths.map((p) => p.replace(/\?.*/, "")),
        ["GET /admin/v1/organizations", "GET /api/config"],
        "one admin call, then one probe",
      );
      const refused = await cli(["--url", refusing.url, "org", "list"], { TDS_ADMIN_TOKEN: TOKEN });
      assert.equal(refused.code, 1);
      assert.equal(
        refused.stderr,
        `tds: ${refusing.url} is not a Typed Decision Service gateway (GET /admin/v1/organizations answered 401 {"detail":"invalid API key"}; GET /api/config answered 401 {"detail":"invalid API key"})\n`,
      );
    } finally {
      page.server.closeAllConnections();
      page.server.close();
      refusing.server.closeAllConnections();
      refusing.server.close();
    }
  });

  it("a real gateway keeps its own messages: admin API off, unknown organization, wrong token", async () => {
    const disabled = await cli(["org", "list"], { TDS_URL: `${off.url}/admin/v1`, TDS_ADMIN_TOKEN: TOKEN });
    assert.equal(disabled.code, 1);
    assert.equal(
      disabled.stderr,
      `Using the gateway at ${off.url}: TDS_URL takes the gateway's URL, without /admin/v1.\n` +
        `tds: the gateway at ${off.url} has no admin API enabled (set TDS_ADMIN_TOKEN on the server)\n`,
    );
    const unknown = await cli(["org", "show", "Nobody"], { TDS_URL: gw.url, TDS_ADMIN_TOKEN: TOKEN });
    assert.equal(unknown.code, 1);
    assert.equal(unknown.stderr, 'tds: No organization with id or name "Nobody". See: tds org list\n');
    const wrong = await cli(["org", "list"], { TDS_URL: gw.url, TDS_ADMIN_TOKEN: `${TOKEN}x` });
    assert.equal(wrong.code, 1);
    assert.match(wrong.stderr, /refused the admin token/);
  });
});

describe("tds: a mistyped command gets a suggestion and a short usage line (exit 2)", () => {
  const cases: Array<[string[], string]> = [
    [["org", "lst"], 'tds: unknown command "tds org lst"; did you mean `tds org list`?\nUsage: tds org list [options]\n'],
    [["ogr", "list"], 'tds: unknown command group "ogr"; did you mean `tds org list`?\nUsage: tds org list [options]\n'],
    [
      ["kye", "creat", "--org", "acme"],
      'tds: unknown command group "kye"; did you mean `tds key create`?\nUsage: tds key create --org ORG [--name NAME] [limit options] [options]\n',
    ],
    [
      ["crdits", "show"],
      'tds: unknown command group "crdits"; did you mean `tds credits show`?\nUsage: tds credits show --org ORG [options]\n',
    ],
    [["audits"], 'tds: unknown command group "audits"; did you mean `tds audit`?\nUsage: tds audit [--org ORG] [--limit N] [options]\n'],
    [
      ["org", "destroy"],
      'tds: unknown command "tds org destroy"\nUsage: tds org <command> [arguments] [options]; commands: create, list, show, pause, resume; more: tds org --help\n',
    ],
    [
      ["bogus"],
      'tds: unknown command group "bogus"\nUsage: tds <group> <command> [arguments] [options]; groups: init, org, key, credits, usage, batch, audit, migrate; more: tds --help\n',
    ],
  ];
  it("prints did you mean and one usage line, nothing on stdout, and touches no database", async () => {
    for (const [args, expected] of cases) {
      const run = await cli(args, { TDS_DATABASE_URL: `sqlite:${join(dir, "never", "tds.sqlite")}` });
      assert.equal(run.code, 2, `tds ${args.join(" ")}`);
      assert.equal(run.stdout, "");
      assert.equal(run.stderr, expected);
    }
  });

  it("names the option meant by a mistyped one", async () => {
    const run = await cli(["org", "list", "--jsn"], {});
    assert.equal(run.code, 2);
    assert.match(run.stderr, /^tds: unknown option --jsn; did you mean --json\?\n/);
  });
});

describe("tds reads its secrets from files too", () => {
  let gw: Gateway;
  before(async () => {
    gw = await startGateway({ fake: false, env: { TDS_ADMIN_TOKEN: TOKEN } });
  });
  after(() => gw.close());

  it("TDS_ADMIN_TOKEN_FILE: the admin token over HTTP, read as the server reads it", async () => {
    const tokenFile = join(dir, "admin_token");
    writeFileSync(tokenFile, `${TOKEN}\n`, { mode: 0o600 });
    assert.deepEqual(names(await cli(["org", "list", "--json"], { TDS_URL: gw.url, TDS_ADMIN_TOKEN_FILE: tokenFile })), ["test-org"]);

    const both = await cli(["org", "list"], { TDS_URL: gw.url, TDS_ADMIN_TOKEN: TOKEN, TDS_ADMIN_TOKEN_FILE: tokenFile });
    assert.equal(both.code, 1);
    assert.equal(both.stderr, "tds: TDS_ADMIN_TOKEN and TDS_ADMIN_TOKEN_FILE are both set: set only one of them\n");

    const missingFile = join(dir, "no_such_token");
    const missing = await cli(["org", "list"], { TDS_URL: gw.url, TDS_ADMIN_TOKEN_FILE: missingFile });
    assert.equal(missing.code, 1);
    assert.equal(missing.stderr, `tds: TDS_ADMIN_TOKEN_FILE: the file ${JSON.stringify(missingFile)} cannot be read (no such file)\n`);

    const wrongFile = join(dir, "wrong_token");
    writeFileSync(wrongFile, `${TOKEN}x\n`, { mode: 0o600 });
    const wrong = await cli(["org", "list"], { TDS_URL: gw.url, TDS_ADMIN_TOKEN_FILE: wrongFile });
    assert.equal(wrong.code, 1);
    assert.match(wrong.stderr, /refused the admin token/);
    assert.doesNotMatch(wrong.stderr, new RegExp(literal(TOKEN)), "the token is never printed");
  });

  it("TDS_DATABASE_URL_FILE: the database it names is chosen, so no 'Using … (the default)' notice", async () => {
    const database = join(dir, "from-file", "tds.sqlite");
    const urlFile = join(dir, "database_url");
    writeFileSync(urlFile, `sqlite:${database}\n`, { mode: 0o600 });
    const env = { TDS_DATABASE_URL_FILE: urlFile };

    const missing = await cli(["org", "list"], env);
    assert.equal(missing.code, 1);
    assert.match(missing.stderr, new RegExp(`^tds: No database at ${literal(database)} \\(TDS_DATABASE_URL_FILE\\);`));

    const init = await cli(["init", "--json"], env);
    assert.equal(init.code, 0, init.stderr);
    assert.equal(init.stderr, "");
    assert.equal((JSON.parse(init.stdout) as { database: string }).database, `SQLite database ${database}`);
    const created = await cli(["org", "create", "From File", "--json"], env);
    assert.equal(created.code, 0, created.stderr);
    const list = await cli(["org", "list", "--json"], env);
    assert.deepEqual(names(list), ["From File"]);
    assert.equal(list.stderr, "");
  });
});
