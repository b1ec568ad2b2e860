// A small inline SVG chart of requests (bars) and cost (line) per UTC day, drawn to the width of
// its container and redrawn when that changes.

import { clear, h } from "./dom.js";
import { integer } from "./format.js";

const HEIGHT = 190;

/** An even round number ≥ value (2, 4, 6, 10, 20, 40, …) so the middle grid line is a whole count. */
function niceCount(value) {
  if (value <= 2) return 2;
  for (let magnitude = 1; ; magnitude *= 10) {
    for (const step of [2, 4, 6, 10]) if (step * magnitude >= value) return step * magnitude;
  }
}

function niceMax(value) {
  if (value <= 0) return 1;
  const magnitude = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) if (step * magnitude >= value) return step * magnitude;
  return 10 * magnitude;
}

/** microUSD → a short USD label ("0.0012"). */
function usdLabel(micro) {
  return (micro / 1e6).toFixed(6).replace(/\.?0+$/, "") || "0";
}

/** `days`: [{date, requests, cost_microusd, cost_usd, …}], oldest first. */
export function drawChart(container, days) {
  const width = Math.max(280, Math.floor(container.clientWidth || 600));
  const hasCost = days.some((d) => d.cost_microusd > 0);
  const m = { top: 14, right: hasCost ? 58 : 12, bottom: 28, left: 40 };
  const plotW = width - m.left - m.right;
  const plotH = HEIGHT - m.top - m.bottom;
  const maxReq = niceCount(Math.max(...days.map((d) => d.requests)));
  const maxCost = niceMax(Math.max(...days.map((d) => d.cost_microusd)));
  const slot = plotW / Math.max(1, days.length);
  const barW = Math.max(3, Math.min(36, slot * 0.62));
  const x = (i) => m.left + slot * i + slot / 2;
  const yReq = (v) => m.top + plotH - (v / maxReq) * plotH;
  const yCost = (v) => m.top + plotH - (v / maxCost) * plotH;
  const labelEvery = Math.max(1, Math.ceil((days.length * 44) / plotW));

  const total = days.reduce((s, d) => s + d.requests, 0);
  const busiest = days.reduce((best, d) => (d.requests > best.requests ? d : best), days[0] ?? { requests: 0, date: "" });
  const summary =
    total === 0
      ? `No requests in the last ${days.length} days.`
      : `${integer(total)} requests in the last ${days.length} days; the busiest day was ${busiest.date} with ${integer(busiest.requests)}.`;

  const grid = [0, 0.5, 1].map((f) =>
    h(
      "svg:g",
      { class: "chart-grid" },
      h("svg:line", { x1: m.left, x2: width - m.right, y1: yReq(maxReq * f), y2: yReq(maxReq * f) }),
      h("svg:text", { x: m.left - 6, y: yReq(maxReq * f) + 4, "text-anchor": "end", class: "chart-axis", text: integer(maxReq * f) }),
      hasCost
        ? h("svg:text", {
            x: width - m.right + 6,
            y: yCost(maxCost * f) + 4,
            "text-anchor": "start",
            class: "chart-axis chart-axis-cost",
            text: `$${usdLabel(maxCost * f)}`,
          })
        : null,
    ),
  );

  const bars = days.map((d, i) =>
    h(
      "svg:rect",
      {
        class: "chart-bar",
        x: (x(i) - barW / 2).toFixed(1),
        y: yReq(d.requests).toFixed(1),
        width: barW.toFixed(1),
        height: Math.max(0, m.top + plotH - yReq(d.requests)).toFixed(1),
        rx: 2,
      },
      h("svg:title", { text: `${d.date}: ${integer(d.requests)} requests, ${d.cost_usd} USD` }),
    ),
  );

  const labels = days.map((d, i) =>
    (days.length - 1 - i) % labelEvery === 0
      ? h("svg:text", { x: x(i), y: HEIGHT - 8, "text-anchor": "middle", class: "chart-axis", text: d.date.slice(5) })
      : null,
  );

  const costLine = hasCost
    ? [
        h("svg:polyline", {
          class: "chart-cost",
          points: days.map((d, i) => `${x(i).toFixed(1)},${yCost(d.cost_microusd).toFixed(1)}`).join(" "),
        }),
        days.map((d, i) =>
          h(
            "svg:circle",
            { class: "chart-cost-dot", cx: x(i).toFixed(1), cy: yCost(d.cost_microusd).toFixed(1), r: 3 },
            h("svg:title", { text: `${d.date}: ${d.cost_usd} USD` }),
          ),
        ),
      ]
    : null;

  const titleId = `chart-title-${Math.random().toString(36).slice(2)}`;
  const svg = h(
    "svg:svg",
    { class: "chart", width, height: HEIGHT, viewBox: `0 0 ${width} ${HEIGHT}`, role: "img", "aria-labelledby": titleId },
    h("svg:title", { id: titleId, text: `Requests${hasCost ? " and cost" : ""} per day. ${summary}` }),
    grid,
    bars,
    costLine,
    labels,
  );

  clear(container).append(
    svg,
    h(
      "p",
      { class: "chart-legend" },
      h("span", { class: "legend-item" }, h("span", { class: "legend-swatch legend-requests", "aria-hidden": "true" }), "Requests"),
      hasCost
        ? h("span", { class: "legend-item" }, h("span", { class: "legend-swatch legend-cost", "aria-hidden": "true" }), "Cost (USD)")
        : h("span", { class: "legend-note", text: "No cost in this period (preview requests are free)." }),
    ),
  );
}

/** Draws now and again whenever the container's width changes; returns a function that stops it. */
export function drawResponsive(container, days) {
  let lastWidth = -1;
  const draw = () => {
    const w = Math.floor(container.clientWidth);
    if (w === lastWidth) return;
    lastWidth = w;
    drawChart(container, days);
  };
  draw();
  if (typeof ResizeObserver === "undefined") return () => {};
  let frame = 0;
  const observer = new ResizeObserver(() => {
    cancelAnimationFrame(frame);
    frame = requestAnimationFrame(draw);
  });
  observer.observe(container);
  return () => observer.disconnect();
}
