// Number, money and time formatting shared by the console's pages.

export function percent(p) {
  if (typeof p !== "number" || !Number.isFinite(p)) return "–";
  return `${(p * 100).toFixed(1)}%`;
}

export function integer(n) {
  return typeof n === "number" ? n.toLocaleString("en-US") : "–";
}

/** cost_usd strings are exact decimals ("0.000104"); shown as they are, with the unit. */
export function usd(text) {
  return text === null || text === undefined ? "–" : `${text} USD`;
}

export function ms(value) {
  if (typeof value !== "number" || !Number.isFinite(value)) return "–";
  return value >= 1000 ? `${(value / 1000).toFixed(2)} s` : `${value.toFixed(value < 10 ? 1 : 0)} ms`;
}

/** "2 h 5 min", "45 s": a duration in words for reset times. */
export function duration(totalMs) {
  const s = Math.max(0, Math.ceil(totalMs / 1000));
  if (s < 120) return `${s} s`;
  const m = Math.ceil(s / 60);
  if (m < 60) return `${m} min`;
  const hours = Math.floor(m / 60);
  const rest = m % 60;
  return rest ? `${hours} h ${rest} min` : `${hours} h`;
}

/** "2026-11-27 00:00 UTC" */
export function utcTime(date) {
  return `${date.toISOString().slice(0, 16).replace("T", " ")} UTC`;
}

/** Local date and time, short: "Nov 26, 14:03:12". */
export function localTime(date) {
  return date.toLocaleString(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

/** "2026-11-26T14:03" (a datetime-local input value) → ISO-8601 in UTC; "" → undefined. */
export function localInputToIso(value) {
  if (!value) return undefined;
  const date = new Date(value);
  return Number.isNaN(date.getTime()) ? undefined : date.toISOString();
}
