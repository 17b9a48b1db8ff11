// The Source tab: the lines of the user's code around the line that made the selected row (a call:
// the line calling it; an equation: the line computing it), that line highlighted. The kernel reads
// them (the `source` request, yax_widget/_payloads.py `source`); where it has none, its sentence
// saying why is shown instead, never lines made up here.
import { h } from "../dom.js";
import { createRowPane } from "./rowpane.js";

/** The pane's content for a `source` reply: a heading `file:line` (the whole path as its tooltip)
 * and the numbered lines, the node's own marked; or the reply's note. Pure: returns elements. */
export function sourceView(reply) {
  const lines = reply.lines || [];
  if (!lines.length) return [h("div", { class: "yax-hint yax-source-note" }, reply.note || "No source lines.")];
  const width = String(lines[lines.length - 1][0]).length;
  const head = h("div", { class: "yax-source-head", title: reply.path }, `${reply.file}:${reply.line}`);
  const body = h("pre", { class: "yax-source" }, lines.map(([n, text]) => h("div", {
    class: n === reply.line ? "yax-source-line yax-source-here" : "yax-source-line", dataset: { line: String(n) },
  }, h("span", { class: "yax-source-no" }, String(n).padStart(width)), ` ${text}`)));
  return [head, body];
}

/** The pane `el`: `show(id)` asks for the lines of row `id` (null: none selected) and shows them,
 * unless another row was asked for meanwhile (`createRowPane`). */
export function createSourcePane({ el, request }) {
  return createRowPane({ el, ask: (id) => request("source", { id }), view: sourceView,
    hint: "Select a row to see the lines of code that made it.", waiting: "reading…" });
}
