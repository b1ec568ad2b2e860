import { type Gateway, type GatewayOptions, startGateway } from "./gateway-harness.ts";
import { eventually } from "./timer-race.ts";

/**
 * Model deadlines for tests that must pass on a busy machine. A model call that must succeed (or fail in any way
 * other than by timing out) gets GENEROUS_MODEL_TIMEOUT_MS, which no busy machine outlasts. Only a call that must time
 * out goes to a gateway with SHORT_MODEL_TIMEOUT_MS, and the fake holds its answer far longer than that, or forever.
 */
export const GENEROUS_MODEL_TIMEOUT_MS = "20000";
export const SHORT_MODEL_TIMEOUT_MS = "300";

/** The fake's behaviours that hold the answer past SHORT_MODEL_TIMEOUT_MS: only these go to a short-deadline gateway. */
export const HELD_ANSWERS: ReadonlySet<string> = new Set(["delay:60000", "hang", "hang-mid-body"]);

/**
 * A gateway whose model calls time out after SHORT_MODEL_TIMEOUT_MS, for the calls that must time out. Its model list
 * is a model call too: it is read here until one arrives within that deadline, and the gateway keeps it when a later
 * refresh misses it, so that afterwards only the decision calls meet the short deadline.
 */
export async function startShortDeadlineGateway(options: GatewayOptions = {}): Promise<Gateway> {
  const gw = await startGateway({ ...options, env: { ...options.env, TDS_MODEL_TIMEOUT_MS: SHORT_MODEL_TIMEOUT_MS } });
  try {
    await eventually("a model list within the short deadline", async () => {
      const res = await gw.get("/v1/models");
      await res.arrayBuffer();
      return res.status === 200 ? true : undefined;
    });
    return gw;
  } catch (err) {
    await gw.close();
    throw err;
  }
}
