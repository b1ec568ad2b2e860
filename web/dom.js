// Tiny DOM helpers: elements are built with createElement (never parsed from HTML strings), so text from the
// API or the user is always inserted as text. Styles are set through the CSSOM only (allowed by
// the console's Content-Security-Policy, unlike style attributes).

const SVG_NS = "http://www.w3.org/2000/svg";

/**
 * h("div", { class: "x", text: "hi", onclick: fn }, child, [children], null)
 * Props: class, text, dataset {…}, style {prop: value} (CSSOM), on<event>: handler, anything
 * else as an attribute (true → "", false/null/undefined → omitted).
 */
export function h(tag, props, ...children) {
  const svg = tag.startsWith("svg:");
  const el = svg ? document.createElementNS(SVG_NS, tag.slice(4)) : document.createElement(tag);
  for (const [key, value] of Object.entries(props ?? {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.setAttribute("class", Array.isArray(value) ? value.filter(Boolean).join(" ") : value);
    else if (key === "text") el.textContent = String(value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "style") for (const [prop, v] of Object.entries(value)) el.style.setProperty(prop, String(v));
    else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key === "value" && !svg) el.value = String(value);
    else if (key === "checked" && !svg) el.checked = Boolean(value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

/**
 * el.append(...children) for children built with conditions: null, undefined and false are skipped and
 * arrays flattened (Element.append would insert the text "null").
 */
export function appendChildren(el, ...children) {
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Shows `message` under a field (or clears it), marking the field invalid and pointing aria-describedby at it. */
export function setFieldError(input, errorEl, message) {
  errorEl.hidden = !message;
  errorEl.textContent = message ?? "";
  const ids = (input.getAttribute("aria-describedby") ?? "").split(" ").filter((id) => id && id !== errorEl.id);
  if (message) {
    input.setAttribute("aria-invalid", "true");
    ids.push(errorEl.id);
  } else {
    input.removeAttribute("aria-invalid");
  }
  if (ids.length) input.setAttribute("aria-describedby", ids.join(" "));
  else input.removeAttribute("aria-describedby");
}

let counter = 0;
/** A document-unique id for label/for and aria-describedby pairs. */
export function uid(prefix = "f") {
  counter += 1;
  return `${prefix}-${counter}`;
}

export function $(selector, root = document) {
  const el = root.querySelector(selector);
  if (!el) throw new Error(`missing element ${selector}`);
  return el;
}

export function clear(el) {
  el.replaceChildren();
  return el;
}

/** Speaks a message through the page's polite live region (screen readers). */
export function announce(text) {
  const region = document.getElementById("announcer");
  if (!region) return;
  region.textContent = "";
  // A fresh text node after a tick makes repeated identical messages be read again.
  setTimeout(() => {
    region.textContent = text;
  }, 30);
}

/** Copies with the clipboard API; falls back to selecting the text of `element`. Returns whether it copied. */
export async function copyText(text, element) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    const range = document.createRange();
    range.selectNodeContents(element);
    const selection = getSelection();
    selection?.removeAllRanges();
    selection?.addRange(range);
    return false;
  }
}
