// A side pane showing what the kernel says of the selected row, asked once per row (the Source
// tab, every row data provider's tab).
import { h } from "../dom.js";

/** A pane showing what the kernel says of the selected row: `show(id)` asks `ask(id)` for row `id`
 * (null: none selected, `hint` shown) and shows `view(reply)`, unless another row was asked for
 * meanwhile; a failure shows the kernel's message, and the row is asked again next time. `reset()`:
 * ask again at the next `show` (the model changed). The Source tab and every provider's tab. */
export function createRowPane({ el, ask, view, hint, waiting }) {
  let asked = 0;
  let shown;
  async function show(id) {
    if (id === shown) return;
    shown = id;
    const n = ++asked;
    if (id === null || id === undefined) {
      el.replaceChildren(h("div", { class: "yax-hint" }, hint));
      return;
    }
    el.replaceChildren(h("div", { class: "yax-hint" }, waiting));
    try {
      const reply = await ask(id);
      if (n === asked) el.replaceChildren(...view(reply));
    } catch (err) {
      if (n === asked) {
        shown = undefined; // asked again next time
        el.replaceChildren(h("div", { class: "yax-error" }, err.message));
      }
    }
  }
  return { show, reset: () => { shown = undefined; } };
}
