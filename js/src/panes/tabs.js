// The side panel's tabs: one pane shown at a time.
import { h } from "../dom.js";

/** `panes`: {title: element}, in tab order. Returns `{bar, show(title), current()}`. */
export function createTabs(panes) {
  let current = null;
  const bar = h("div", { class: "yax-tabs", role: "tablist" },
    Object.keys(panes).map((t) => h("button", { class: "yax-tab", dataset: { tab: t }, role: "tab", onclick: () => show(t) }, t)));
  function show(title) {
    current = title;
    for (const b of bar.children) b.classList.toggle("yax-active", b.dataset.tab === title);
    for (const [k, p] of Object.entries(panes)) p.style.display = k === title ? "" : "none";
  }
  return { bar, show, current: () => current };
}
