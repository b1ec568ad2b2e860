/** What the balancer needs to know of a candidate. */
export interface Balanced {
  readonly weight: number;
  readonly outstanding: number;
}

/** One candidate drawn with probability ∝ weight, leaving out `except`. Undefined when nothing is left. */
export function drawByWeight<T extends Balanced>(candidates: readonly T[], random: () => number, except?: T): T | undefined {
  let total = 0;
  for (const c of candidates) if (c !== except) total += c.weight;
  if (total <= 0) return undefined;
  let r = clampUnit(random()) * total;
  let last: T | undefined;
  for (const c of candidates) {
    if (c === except) continue;
    last = c;
    r -= c.weight;
    if (r < 0) return c;
  }
  return last; // rounding at the top end
}

/**
 * Weighted power of two choices: draws two distinct candidates with probability ∝ weight and takes the one with
 * the lower outstanding/weight (the first drawn on a tie, so idle candidates get traffic exactly ∝ weight). Under
 * load, a heavier deployment is allowed proportionally more calls in flight before a lighter one is preferred.
 */
export function pickPowerOfTwo<T extends Balanced>(candidates: readonly T[], random: () => number): T {
  if (candidates.length === 0) throw new RangeError("pickPowerOfTwo: no candidates");
  if (candidates.length === 1) return candidates[0] as T;
  const a = drawByWeight(candidates, random) as T;
  const b = drawByWeight(candidates, random, a) as T;
  return b.outstanding / b.weight < a.outstanding / a.weight ? b : a;
}

function clampUnit(x: number): number {
  return Number.isFinite(x) ? Math.min(Math.max(x, 0), 1 - Number.EPSILON) : 0;
}
