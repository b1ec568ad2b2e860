/** Edits (insert, delete, replace, swap two neighbours) that turn `a` into `b`: the optimal string alignment distance. */
export function editDistance(a: string, b: string): number {
  const rows = a.length + 1;
  const cols = b.length + 1;
  const d: number[][] = Array.from({ length: rows }, (_, i) => Array.from({ length: cols }, (_, j) => (i === 0 ? j : j === 0 ? i : 0)));
  for (let i = 1; i < rows; i++) {
    for (let j = 1; j < cols; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let best = Math.min(d[i - 1]![j]! + 1, d[i]![j - 1]! + 1, d[i - 1]![j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) best = Math.min(best, d[i - 2]![j - 2]! + 1);
      d[i]![j] = best;
    }
  }
  return d[a.length]![b.length]!;
}

/**
 * The candidate the user most likely meant by `word`: the nearest within 1 edit (2 for names longer than 3 letters),
 * else the only candidate that starts with it (2 letters or more); null when none is close or two are equally close.
 */
export function closest(word: string, candidates: readonly string[]): string | null {
  const typed = word.toLowerCase();
  let best: string | null = null;
  let bestDistance = Number.POSITIVE_INFINITY;
  let tie = false;
  for (const candidate of candidates) {
    const distance = editDistance(typed, candidate.toLowerCase());
    if (distance > (candidate.length > 3 ? 2 : 1) || distance > bestDistance) continue;
    tie = distance === bestDistance;
    if (distance < bestDistance) [best, bestDistance] = [candidate, distance];
  }
  if (best !== null && !tie) return best;
  if (best !== null) return null;
  const prefixed = typed.length >= 2 ? candidates.filter((c) => c.toLowerCase().startsWith(typed)) : [];
  return prefixed.length === 1 ? prefixed[0]! : null;
}
