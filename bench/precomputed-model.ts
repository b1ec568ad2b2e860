/**
 * The model server of bench/gateway.ts: a System One server that costs next to nothing, so that its own cost does
 * not mask the gateway's. At start it computes ONE valid response for bench/support.ts `realisticRequest()` (answers
 * for its questions: choice probabilities over exactly the options, score probabilities over exactly the levels
 * "0".."n-1", noul; usage {input_tokens, output_tokens}) and then answers every POST /v1/systemone with those exact
 * bytes, draining the request body without parsing it; GET /v1/models answers a fixed list. Plain node:http.
 *
 *   npx tsx bench/precomputed-model.ts [--port 0] [--host 127.0.0.1]
 *
 * Prints `precomputed model server listening on http://HOST:PORT` once it listens.
 */
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import { parseArgs } from "node:util";
import { realisticRequest } from "./support.ts";

const PRECOMPUTED_MODEL_NAME = "bench-precomputed";

type Question = { type: "choice"; criteria: Record<string, unknown> } | { type: "score"; criteria: unknown[] } | { type: "noul" };

/** k probabilities, each half the one before (8/15, 4/15, 2/15, 1/15 for k = 4): valid, peaked, summing to 1. */
function distribution(k: number): number[] {
  const total = 2 ** k - 1;
  return Array.from({ length: k }, (_, i) => 2 ** (k - 1 - i) / total);
}

/** (max p − 1/k) / (1 − 1/k), as System One defines the confidence of a distribution. */
function confidence(ps: number[]): number {
  const k = ps.length;
  return k <= 1 ? 1 : (Math.max(...ps) - 1 / k) / (1 - 1 / k);
}

function answerFor(question: Question): Record<string, unknown> {
  switch (question.type) {
    case "choice": {
      const options = Object.keys(question.criteria);
      const ps = distribution(options.length);
      return {
        type: "choice",
        choice: options[0],
        probabilities: Object.fromEntries(options.map((o, i) => [o, ps[i]])),
        confidence: confidence(ps),
      };
    }
    case "score": {
      const ps = distribution(question.criteria.length);
      return {
        type: "score",
        score: ps.reduce((sum, p, i) => sum + i * p, 0),
        probabilities: Object.fromEntries(ps.map((p, i) => [String(i), p])),
        confidence: confidence(ps),
        legend: Object.fromEntries(question.criteria.map((level, i) => [String(i), level])),
      };
    }
    case "noul":
      return { type: "noul", noul: 0.8 };
  }
}

/** The one response body: answers to every question of realisticRequest(), with the usage a real server would count. */
function precomputedResponse(): Buffer {
  const { state, questions } = realisticRequest() as { state: unknown; questions: Record<string, Question> };
  const answers = Object.fromEntries(Object.entries(questions).map(([id, q]) => [id, answerFor(q)]));
  const inputTokens = Math.ceil(Buffer.byteLength(JSON.stringify({ state, questions }), "utf8") / 4);
  const usage = { input_tokens: inputTokens, output_tokens: Object.keys(questions).length };
  return Buffer.from(JSON.stringify({ model: PRECOMPUTED_MODEL_NAME, answers, usage, latency_ms: 0 }), "utf8");
}

const DECIDE_BODY = precomputedResponse();
const MODELS_BODY = Buffer.from(JSON.stringify({ models: [{ name: PRECOMPUTED_MODEL_NAME }] }), "utf8");

function send(res: ServerResponse, status: number, body: Buffer): void {
  res.writeHead(status, { "content-type": "application/json", "content-length": body.length });
  res.end(body);
}

function handle(req: IncomingMessage, res: ServerResponse): void {
  if (req.method === "POST" && req.url === "/v1/systemone") {
    req.on("end", () => send(res, 200, DECIDE_BODY));
    req.resume();
    return;
  }
  req.resume();
  if (req.method === "GET" && req.url === "/v1/models") {
    send(res, 200, MODELS_BODY);
    return;
  }
  send(res, 404, Buffer.from('{"detail":"not found"}'));
}

const { values } = parseArgs({ options: { port: { type: "string", default: "0" }, host: { type: "string", default: "127.0.0.1" } } });
const server = createServer(handle);
// Keeps idle upstream connections open between the bench's slices (clients still close theirs after their own timeout).
server.keepAliveTimeout = 65_000;
server.listen(Number(values.port), values.host, () => {
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("no TCP address");
  process.stdout.write(`precomputed model server listening on http://${values.host}:${address.port}\n`);
});
const stop = () => {
  server.close(() => process.exit(0));
  server.closeAllConnections();
};
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
