// The history pane: the original, then each change; the current one bold, undone ones struck.
// A click on an item goes to that state (`onGo(index)`: 0 is the original).
import { h } from "../dom.js";

/** Fill `pane` from `_history`: `{items: [description], index}` (items[:index] applied). */
export function renderHistory(pane, { items = [], index = 0 }, onGo = () => {}) {
  const item = (text, k) => h("li", {
    class: ["yax-history-item", k === index && "yax-current", k > index && "yax-undone"].filter(Boolean).join(" "),
    dataset: { index: String(k) }, title: k === index ? "the current model" : "go to this state",
    onclick: () => { if (k !== index) onGo(k); },
  }, text);
  pane.replaceChildren(items.length
    ? h("ol", { class: "yax-history" }, item("original", 0), items.map((t, i) => item(t, i + 1)))
    : h("div", { class: "yax-hint yax-history" }, "No changes yet."));
}
