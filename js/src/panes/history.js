// The history pane: the original, then each change; the current one bold, undone ones struck.
import { h } from "../dom.js";

/** Fill `pane` from `_history`: `{items: [description], index}` (items[:index] applied). */
export function renderHistory(pane, { items = [], index = 0 }) {
  pane.replaceChildren(items.length
    ? h("ol", { class: "yax-history" },
      h("li", { class: `yax-history-item${index === 0 ? " yax-current" : ""}` }, "original"),
      items.map((t, i) => h("li", {
        class: ["yax-history-item", i + 1 === index && "yax-current", i >= index && "yax-undone"].filter(Boolean).join(" "),
      }, t)))
    : h("div", { class: "yax-hint yax-history" }, "No changes yet."));
}
