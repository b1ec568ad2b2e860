import { safeText } from "./output.ts";

/** What is at a URL: the gateway, something else (with what it answered), or unknown (no answer, or a server error). */
export type GatewayProbe = { kind: "gateway" } | { kind: "other"; seen: string } | { kind: "unknown" };

/** The path whose answer identifies the gateway: it needs no key, and its shape is the gateway's own. */
export const PROBE_PATH = "/api/config";
const PROBE_TIMEOUT_MS = 5000;
const SHOWN_CHARS = 80;

/** An answer in a few words for a message: `404 {"detail":"not found"}`, `200 text/html`, `405 (empty body)`. */
export function describeAnswer(status: number, contentType: string | null, text: string): string {
  let shown: string;
  try {
    shown = JSON.stringify(JSON.parse(text));
  } catch {
    shown = text.trim() === "" ? "(empty body)" : (contentType?.split(";")[0]?.trim() ?? "(no content type)");
  }
  if ([...shown].length > SHOWN_CHARS) shown = `${[...shown].slice(0, SHOWN_CHARS).join("")}…`;
  return `${status} ${safeText(shown)}`;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** The shape of GET /api/config that only the gateway answers with. */
function isGatewayConfig(body: unknown): boolean {
  return (
    isObject(body) &&
    typeof body.contract_version === "string" &&
    (body.service_mode === "preview" || body.service_mode === "paid") &&
    isObject(body.limits) &&
    isObject(body.pricing)
  );
}

/** Asks `url` whether it is a Typed Decision Service gateway: one GET of PROBE_PATH, only after a failed admin call. */
export async function probeGateway(url: string, fetchFn: typeof fetch): Promise<GatewayProbe> {
  let response: Response;
  let text: string;
  try {
    response = await fetchFn(`${url}${PROBE_PATH}`, {
      headers: { accept: "application/json" },
      signal: AbortSignal.timeout(PROBE_TIMEOUT_MS),
    });
    text = await response.text();
  } catch {
    return { kind: "unknown" };
  }
  if (response.ok) {
    try {
      if (isGatewayConfig(JSON.parse(text))) return { kind: "gateway" };
    } catch {
      // Not JSON: not the gateway's answer.
    }
  } else if (response.status >= 500) {
    return { kind: "unknown" };
  }
  return { kind: "other", seen: describeAnswer(response.status, response.headers.get("content-type"), text) };
}
