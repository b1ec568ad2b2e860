// The Playground's run bar sticks to the bottom of the window over the form. So that a field scrolled into view (by
// focus, Tab or scrollIntoView) is not hidden under it, the page's bottom scroll padding is the space the bar takes:
// its height and its offset from the bottom while it is sticky and shown, else nothing.

/** Keeps `--run-bar-space` on the root element (used by `scroll-padding-bottom` in console.css) equal to the bar's space. */
export function keepFieldsClearOfRunBar(bar) {
  const update = () => {
    const style = getComputedStyle(bar);
    const shown = bar.offsetHeight > 0;
    const space = shown && style.position === "sticky" ? bar.offsetHeight + (Number.parseFloat(style.bottom) || 0) * 2 : 0;
    document.documentElement.style.setProperty("--run-bar-space", `${Math.ceil(space)}px`);
  };
  new ResizeObserver(update).observe(bar);
  // A media query can make the bar sticky or not without changing its size.
  window.addEventListener("resize", update);
  update();
}
