/**
 * The baseline of bench/gateway.ts: the least a gateway in front of a System One server can do.
 * Fastify receives POST /v1/systemone (body read as raw bytes, no JSON parsing, no auth, no
 * validation, no accounting) and forwards it with an undici Pool (32 keep-alive connections, like
 * the gateway's model client) to the upstream; the upstream's status, content-type and body go back.
 *
 *   npx tsx bench/passthrough-proxy.ts --upstream http://127.0.0.1:9090 [--port 0] [--host 127.0.0.1]
 *
 * Prints `pass-through proxy listening on http://HOST:PORT` once it listens.
 */
import { parseArgs } from "node:util";
import Fastify from "fastify";
import { Pool } from "undici";

const { values } = parseArgs({
  options: {
    upstream: { type: "string" },
    port: { type: "string", default: "0" },
    host: { type: "string", default: "127.0.0.1" },
    connections: { type: "string", default: "32" },
  },
});
if (!values.upstream) {
  process.stderr.write("usage: bench/passthrough-proxy.ts --upstream http://127.0.0.1:9090 [--port 0]\n");
  process.exit(2);
}

const pool = new Pool(new URL(values.upstream).origin, { connections: Number(values.connections), pipelining: 1, keepAliveTimeout: 4_000 });
const app = Fastify({ logger: false, bodyLimit: 16 * 1024 * 1024 });
app.removeAllContentTypeParsers();
app.addContentTypeParser("*", { parseAs: "buffer" }, (_request, body, done) => done(null, body));

app.post("/v1/systemone", async (request, reply) => {
  const upstream = await pool.request({
    method: "POST",
    path: "/v1/systemone",
    headers: { "content-type": "application/json", accept: "application/json" },
    body: request.body as Buffer,
    headersTimeout: 30_000,
    bodyTimeout: 30_000,
  });
  const body = Buffer.from(await upstream.body.arrayBuffer());
  return reply
    .code(upstream.statusCode)
    .header("content-type", upstream.headers["content-type"] ?? "application/json")
    .send(body);
});

const address = await app.listen({ host: values.host, port: Number(values.port) });
process.stdout.write(`pass-through proxy listening on ${address}\n`);

const stop = async () => {
  await app.close();
  await pool.close();
  process.exit(0);
};
process.on("SIGTERM", () => void stop());
process.on("SIGINT", () => void stop());
