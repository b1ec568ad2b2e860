/**
 * Objects keyed by names the client chose (question ids, option names). A null prototype makes
 * `__proto__` and `constructor` ordinary keys; JSON.stringify prints them like any other.
 */
export function dictionary<V>(entries?: Iterable<readonly [string, V]>): Record<string, V> {
  const out = Object.create(null) as Record<string, V>;
  if (entries) for (const [k, v] of entries) out[k] = v;
  return out;
}
