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

/** "2026-11-26 13:03:12 UTC" */
export function utcSeconds(date) {
  return `${date.toISOString().slice(0, 19).replace("T", " ")} UTC`;
}

/** Integer microUSD → an exact decimal USD string without trailing zeros: 12500000 → "12.5". */
export function microusdToUsd(micro) {
  if (typeof micro !== "number" || !Number.isSafeInteger(micro)) return "–";
  const sign = micro < 0 ? "-" : "";
  const abs = Math.abs(micro);
  const fraction = String(abs % 1_000_000)
    .padStart(6, "0")
    .replace(/0+$/, "");
  return `${sign}${Math.floor(abs / 1_000_000)}${fraction ? `.${fraction}` : ""}`;
}

/** A decimal USD amount as typed → the exact string the API takes ("012.50" → "12.50"), or the problem. */
export function parseAmount(raw) {
  const text = raw
    .trim()
    .replace(/^\$\s*/, "")
    .replace(/\s*(USD)?$/i, "");
  if (!text) return { problem: "Enter an amount in USD, such as 12.50." };
  if (/^\d+,\d+$/.test(text)) return { problem: "Use a dot for decimals, such as 12.50." };
  const m = /^(\d+)(?:\.(\d+))?$/.exec(text);
  if (!m) return { problem: "Enter the amount as a number of USD, such as 12.50 (digits and at most one dot)." };
  const whole = m[1].replace(/^0+(?=\d)/, "");
  const fraction = m[2] ?? "";
  if (fraction.length > 6) return { problem: "The amount can have at most 6 decimals (1 microUSD)." };
  if (whole.length > 9) return { problem: "The amount is too large (at most 999,999,999 USD)." };
  if (/^0*$/.test(whole + fraction)) return { problem: "The amount must be more than 0." };
  return { amount: fraction ? `${whole}.${fraction}` : whole };
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

/** An ISO-8601 time → the value of a datetime-local input in local time ("2026-11-26T14:03"). */
export function isoToLocalInput(iso) {
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return "";
  const pad = (n) => String(n).padStart(2, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}T${pad(date.getHours())}:${pad(date.getMinutes())}`;
}

/** How long ago `date` was, in words: "less than a minute ago", "5 min ago", "3 h ago", "2 days ago"; older: the local date. */
export function timeAgo(date, nowMs = Date.now()) {
  const seconds = Math.floor((nowMs - date.getTime()) / 1000);
  if (seconds < 60) return "less than a minute ago";
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min ago`;
  const hours = Math.floor(minutes / 60);
  if (hours < 24) return `${hours} h ago`;
  const days = Math.floor(hours / 24);
  if (days < 30) return `${days} day${days === 1 ? "" : "s"} ago`;
  return date.toLocaleDateString(undefined, { year: "numeric", month: "short", day: "numeric" });
}
