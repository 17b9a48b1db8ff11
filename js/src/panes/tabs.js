// The side panel's tabs: one pane shown at a time.
import { h } from "../dom.js";

/** `panes`: {title: element}, in tab order; `onShow(title)`: a pane was shown (it fills itself
 * then, so that no tab is blank). Returns `{bar, show(title), current()}`. */
export function createTabs(panes, onShow = () => {}) {
  let current = null;
  const bar = h("div", { class: "yax-tabs", role: "tablist" },
    Object.keys(panes).map((t) => h("button", { class: "yax-tab", dataset: { tab: t }, role: "tab", onclick: () => show(t) }, t)));
  function show(title) {
    const changed = current !== title;
    current = title;
    for (const b of bar.children) b.classList.toggle("yax-active", b.dataset.tab === title);
    for (const [k, p] of Object.entries(panes)) p.style.display = k === title ? "" : "none";
    if (changed) onShow(title);
  }
  return { bar, show, current: () => current };
}
