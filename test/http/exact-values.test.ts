import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import { after, before, describe, test } from "node:test";
import fc from "fast-check";
import { scanJson } from "../../src/contract/json-members.ts";

const memberTexts = (text: string, names: string[]) => scanJson(text, 256, names).members;

import { errorBody, json } from "../support/contract-check.ts";
import { type Gateway, sampleRequest, startGateway } from "../support/gateway-harness.ts";

/** A System One server that keeps the raw bytes of every request and answers one noul question "q". */
async function rawUpstream(): Promise<{ url: string; bodies: string[]; close(): Promise<void> }> {
  const bodies: string[] = [];
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      res.setHeader("content-type", "application/json");
      if (req.url === "/v1/models") return res.end(JSON.stringify({ models: [{ name: "raw" }] }));
      bodies.push(Buffer.concat(chunks).toString("utf8"));
      res.end(JSON.stringify({ answers: { q: { type: "noul", noul: 0.5 } }, usage: { input_tokens: 10, output_tokens: 1 } }));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address() as { port: number };
  return { url: `http://127.0.0.1:${address.port}`, bodies, close: () => new Promise((resolve) => server.close(() => resolve())) };
}

describe("values reach the model exactly as sent", () => {
  let upstream: Awaited<ReturnType<typeof rawUpstream>>;
  let gw: Gateway;
  before(async () => {
    upstream = await rawUpstream();
    gw = await startGateway({ fake: false, env: { TDS_MODEL_SERVICE_URL: upstream.url } });
  });
  after(async () => {
    await gw.close();
    await upstream.close();
  });

  test("numbers beyond 2^53 or the double range, and every other byte of state and questions, are forwarded as written", async () => {
    const state =
      '{"big": 12345678901234567890, "huge": 1e999999, "tiny": 1e-400, "pi": 3.14159265358979323846264338, "text": "caf\\u00e9 \\"x\\""}';
    const questions = '{"q": {"type": "noul", "instructions": {"threshold": 9007199254740993}}}';
    const res = await gw.decide(`{"questions": ${questions}, "model": null, "state": ${state}}`);
    assert.equal(res.status, 200, await res.clone().text());
    const sent = upstream.bodies.at(-1)!;
    assert.ok(sent.includes(`"state":${state}`), sent);
    assert.ok(sent.includes(`"questions":${questions}`), sent);
    assert.deepEqual(JSON.parse(sent).model, "raw");
  });

  test("a member named twice counts once, the last, as the body parser reads it", async () => {
    const res = await gw.decide('{"state": 1, "questions": {"q": {"type": "noul"}}, "state": 12345678901234567891}');
    assert.equal(res.status, 200);
    assert.ok(upstream.bodies.at(-1)!.startsWith('{"state":12345678901234567891,'), upstream.bodies.at(-1));
  });
});

describe("scanJson: member texts and depth", () => {
  test("finds the exact text of each member of any JSON object, whatever the spacing (property)", () => {
    const space = fc.constantFrom("", " ", "\n", "\t ", " \r\n ");
    fc.assert(
      fc.property(fc.dictionary(fc.string({ maxLength: 8 }), fc.jsonValue(), { maxKeys: 6 }), space, (object, ws) => {
        const entries = Object.entries(object);
        const texts = entries.map(([k, v]) => [k, JSON.stringify(v, null, ws.length > 2 ? 1 : 0)] as const);
        const text = `${ws}{${ws}${texts.map(([k, v]) => `${JSON.stringify(k)}${ws}:${ws}${v}`).join(`${ws},${ws}`)}${ws}}${ws}`;
        const found = memberTexts(
          text,
          entries.map(([k]) => k),
        );
        for (const [k, v] of texts) assert.equal(found.get(k), v);
      }),
    );
  });

  test("depth: deeper than the limit is found without parsing; brackets inside strings do not count", () => {
    assert.equal(scanJson(`${"[".repeat(256)}${"]".repeat(256)}`, 256, []).deeperThanLimit, false);
    assert.equal(scanJson(`${"[".repeat(257)}${"]".repeat(257)}`, 256, []).deeperThanLimit, true);
    assert.equal(scanJson(`{"a": "${"[".repeat(300)}", "b": [[{"c": "\\"{["}]]}`, 2, []).deeperThanLimit, true, "three levels");
    assert.equal(scanJson(`{"a": "${"[".repeat(300)}", "b": ["\\"{["]}`, 2, []).deeperThanLimit, false);
    assert.equal(scanJson('{"unterminated": "abc', 256, ["unterminated"]).deeperThanLimit, false, "invalid JSON ends the scan");
  });

  test("keys with escapes, strings with brackets and escaped quotes", () => {
    const text = '{"st\\u0061te": {"a": "}]\\\\", "b": ["\\"{", {"c": []}]}, "questions": "x"}';
    assert.deepEqual(
      [...memberTexts(text, ["state", "questions"])],
      [
        ["state", '{"a": "}]\\\\", "b": ["\\"{", {"c": []}]}'],
        ["questions", '"x"'],
      ],
    );
  });
});

describe("charsets", () => {
  let gw: Gateway;
  before(async () => {
    gw = await startGateway();
  });
  after(async () => gw.close());

  test("a declared charset other than UTF-8 is refused with 422; utf-8 in any spelling is accepted", async () => {
    for (const charset of ["utf-16", "latin1", "ISO-8859-1", "utf-16le"]) {
      const res = await gw.decide(sampleRequest(), { "content-type": `application/json; charset=${charset}` });
      assert.match((await errorBody(res, 422)).detail, new RegExp(`charset=${charset.toLowerCase()}`));
    }
    for (const charset of ["utf-8", "UTF-8", '"utf-8"', "utf8"]) {
      const res = await gw.decide(sampleRequest(), { "content-type": `application/json;charset=${charset}` });
      assert.equal(res.status, 200, `${charset}: ${JSON.stringify(await json(res))}`);
    }
  });
});
