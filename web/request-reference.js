// Which request ids of failed Playground runs can be found in Usage. A request refused before it was accepted
// (authentication, a paused organization, a body too large or invalid, a limit or missing credits) leaves no usage
// record: its id is shown only as a reference for support. Accepted requests that failed later (the model's error,
// a rejected context, an expired reservation) are recorded, and so are findable by their id.

import { h } from "./dom.js";

/** Statuses of POST /v1/systemone that are always answered before the request is accepted. */
const NEVER_RECORDED = new Set([400, 401, 402, 403, 404, 405, 408, 413, 414, 429, 431]);

/**
 * Whether Usage has a record of a failed request: false for a refusal before acceptance (by its status, or a 422 with
 * field errors); otherwise asked of GET /v1/usage/{id}: true or false, or null when that could not be checked.
 * @param {{ status: number, errors: unknown[] }} err
 * @param {(requestId: string) => Promise<unknown>} lookup
 */
export async function isRecorded(err, requestId, lookup) {
  if (NEVER_RECORDED.has(err.status) || (err.status === 422 && err.errors.length > 0)) return false;
  try {
    await lookup(requestId);
    return true;
  } catch (e) {
    return e?.status === 404 ? false : null;
  }
}

/** The line under a failed run's error: a findable request id, or a reference for support that Usage does not know. */
export function referenceLine(requestId, recorded) {
  const id = h("code", { class: "request-id", text: requestId });
  if (recorded === true) return h("p", { class: "error-meta", dataset: { recorded: "true" } }, "Request id ", id, " · recorded in Usage");
  return h(
    "p",
    { class: "error-meta", dataset: { recorded: recorded === false ? "false" : "unknown" } },
    "Reference for support: ",
    id,
    recorded === false
      ? ". The request was refused before it was accepted, so Usage has no record of it."
      : ". Whether Usage has a record of it could not be checked.",
  );
}
