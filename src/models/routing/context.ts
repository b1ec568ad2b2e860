import type { ModelContext } from "../../contract/models.ts";

/**
 * The context limits every deployment can honour: `max_state` and `max_branch` are the smallest of those given (a
 * deployment that publishes none does not limit), `strict` is true when any deployment is strict. Undefined when
 * no deployment publishes anything.
 */
export function smallestContext(contexts: ReadonlyArray<ModelContext | undefined>): ModelContext | undefined {
  let maxState: number | undefined;
  let maxBranch: number | undefined;
  let strict: boolean | undefined;
  for (const c of contexts) {
    if (c === undefined) continue;
    if (c.max_state !== undefined) maxState = maxState === undefined ? c.max_state : Math.min(maxState, c.max_state);
    if (c.max_branch !== undefined) maxBranch = maxBranch === undefined ? c.max_branch : Math.min(maxBranch, c.max_branch);
    if (c.strict !== undefined) strict = (strict ?? false) || c.strict;
  }
  const out: ModelContext = {};
  if (maxState !== undefined) out.max_state = maxState;
  if (maxBranch !== undefined) out.max_branch = maxBranch;
  if (strict !== undefined) out.strict = strict;
  return Object.keys(out).length > 0 ? out : undefined;
}
