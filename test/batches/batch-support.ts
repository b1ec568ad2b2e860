import type { Batch } from "../../src/contract/batches.ts";

/** A batch line with the custom_id `r<i>`: a small choice question about ticket i (`state` adds to its state). */
export function batchLine(i: number, state: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    custom_id: `r${i}`,
    state: { ticket: `ticket ${i}`, ...state },
    questions: {
      topic: { type: "choice", instructions: "What is the ticket about?", criteria: { billing: "Payments", bug: "Broken", other: null } },
    },
  };
}

export const ndjson = (lines: readonly unknown[]) => `${lines.map((l) => JSON.stringify(l)).join("\n")}\n`;

export interface BatchClient {
  url: string;
  key: string;
}

export async function submitBatch(
  gw: BatchClient,
  body: string,
  options: { model?: string; headers?: Record<string, string> } = {},
): Promise<Response> {
  const query = options.model ? `?model=${encodeURIComponent(options.model)}` : "";
  return fetch(`${gw.url}/v1/batches${query}`, {
    method: "POST",
    headers: { authorization: `Bearer ${gw.key}`, "content-type": "application/x-ndjson", ...options.headers },
    body,
  });
}

export async function getBatch(gw: BatchClient, id: string): Promise<Batch> {
  const res = await fetch(`${gw.url}/v1/batches/${id}`, { headers: { authorization: `Bearer ${gw.key}` } });
  if (res.status !== 200) throw new Error(`GET batch ${id}: ${res.status} ${await res.text()}`);
  return (await res.json()) as Batch;
}

const ENDED = new Set(["completed", "cancelled", "expired"]);

/** Polls the batch until it has ended (generous deadline: the machine may be busy). */
export async function waitForEnd(gw: BatchClient, id: string, deadlineMs = 120_000): Promise<Batch> {
  const until = Date.now() + deadlineMs;
  for (;;) {
    const batch = await getBatch(gw, id);
    if (ENDED.has(batch.status)) return batch;
    if (Date.now() > until)
      throw new Error(`batch ${id} still ${batch.status} after ${deadlineMs} ms: ${JSON.stringify(batch.request_counts)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Polls until `done(batch)` holds. */
export async function waitForBatch(gw: BatchClient, id: string, done: (b: Batch) => boolean, deadlineMs = 120_000): Promise<Batch> {
  const until = Date.now() + deadlineMs;
  for (;;) {
    const batch = await getBatch(gw, id);
    if (done(batch)) return batch;
    if (Date.now() > until) throw new Error(`batch ${id}: condition not met after ${deadlineMs} ms: ${JSON.stringify(batch)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export interface ResultLine {
  custom_id: string;
  request_id: string | null;
  status: number;
  body: Record<string, unknown>;
}

export async function batchResults(gw: BatchClient, id: string): Promise<ResultLine[]> {
  const res = await fetch(`${gw.url}/v1/batches/${id}/results`, { headers: { authorization: `Bearer ${gw.key}` } });
  if (res.status !== 200) throw new Error(`results ${id}: ${res.status} ${await res.text()}`);
  const text = await res.text();
  return text
    .split("\n")
    .filter((l) => l.length > 0)
    .map((l) => JSON.parse(l) as ResultLine);
}
