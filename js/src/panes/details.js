// A row data provider's tab (yax_widget/_providers.py): what a Python analysis says of the selected
// row, as a heading, a table of text and a note. Every provider is painted by this one module: a new
// analysis is a Python class, not front-end code. Nothing is computed here: the text is Python's.
import { h } from "../dom.js";
import { createRowPane } from "./rowpane.js";

/** The pane's content for a `details` reply: heading, table, note. Pure: returns elements. A table
 * whose columns are unnamed is a list of `[label, value, explanation...]`: each explanation goes under
 * its value, so that a narrow side panel shows every word. */
export function detailsView(reply) {
  const head = h("div", { class: "yax-details-head" }, reply.heading || "");
  const named = (reply.columns || []).some(Boolean);
  const cells = (row) => (named ? row.map((cell, i) => (i === 0 ? h("th", { scope: "row" }, cell) : h("td", {}, cell)))
    : [h("th", { scope: "row" }, row[0]), h("td", {}, h("div", { class: "yax-details-value" }, row[1] ?? ""),
      ...row.slice(2).filter(Boolean).map((more) => h("div", { class: "yax-details-more" }, more)))]);
  const table = h("table", { class: named ? "yax-details" : "yax-details yax-details-list" },
    named ? h("thead", {}, h("tr", {}, reply.columns.map((c) => h("th", {}, c)))) : null,
    h("tbody", {}, (reply.rows || []).map((row) => h("tr", {}, cells(row)))));
  const note = reply.note ? h("div", { class: "yax-hint yax-details-note" }, reply.note) : null;
  return [head, table, note].filter(Boolean);
}

/** The pane `el` of the provider `provider` (`createRowPane` asking `details`). */
export function createDetailsPane({ el, request, provider }) {
  return createRowPane({ el, ask: (id) => request("details", { provider, id }), view: detailsView,
    hint: `Select a row to see its ${provider.toLowerCase()}.`, waiting: "computing…" });
}
