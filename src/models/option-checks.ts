/** The checks of a model service's or the router's options: each returns the value, or throws a TypeError naming the option. */

export function positiveInteger(name: string, value: number): number {
  if (!Number.isSafeInteger(value) || value < 1) throw new TypeError(`${name} must be an integer >= 1`);
  return value;
}

export function nonNegativeInteger(name: string, value: number): number {
  if (!Number.isSafeInteger(value) || value < 0) throw new TypeError(`${name} must be an integer >= 0`);
  return value;
}

export function positiveNumber(name: string, value: number): number {
  if (typeof value !== "number" || !Number.isFinite(value) || value <= 0) throw new TypeError(`${name} must be a finite number > 0`);
  return value;
}

export function nonNegativeNumber(name: string, value: number): number {
  if (typeof value !== "number" || !Number.isFinite(value) || value < 0) throw new TypeError(`${name} must be a finite number >= 0`);
  return value;
}
