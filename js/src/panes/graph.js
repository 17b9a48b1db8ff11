// The graph pane: `yax.to_dot` of a call (a `graph` request), laid out in the browser by
// Graphviz compiled to WebAssembly (@viz-js/viz, loaded on first use).
import { instance as vizInstance } from "@viz-js/viz";
import { h } from "../dom.js";

let vizPromise = null;
const viz = () => (vizPromise ??= vizInstance());

/** Show the graph of call `id` (null: the whole model) in `pane`. A failed request or
 * layout is shown in the pane. */
export async function showGraph(pane, request, id) {
  pane.replaceChildren(h("div", { class: "yax-hint" }, "laying out the graph…"));
  let reply;
  try {
    reply = await request("graph", { id, depth: 1 });
  } catch (err) {
    pane.replaceChildren(h("div", { class: "yax-error" }, err.message));
    return;
  }
  try {
    pane.replaceChildren((await viz()).renderSVGElement(reply.dot));
  } catch (err) {
    pane.replaceChildren(h("div", { class: "yax-error" }, `Graphviz could not lay out the graph: ${err}`));
  }
}
