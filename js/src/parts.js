// The explorer's parts as elements, before index.js connects them: the toolbar's buttons, the bar
// above the tree, the holders of the side panes, and where each goes on the page.
import { h } from "./dom.js";
import { divergenceLegend } from "./treerow.js";

/** The toolbar's buttons: undo, redo, copy as code, graph, export, save as HTML. */
export function toolbarButtons() {
  return {
    undo: h("button", { class: "yax-undo", title: "Undo the last change" }, "↶ Undo"),
    redo: h("button", { class: "yax-redo", title: "Redo" }, "↷ Redo"),
    copy: h("button", { class: "yax-copy", title: "The yax.sub calls reproducing this model" }, "Copy as code"),
    graph: h("button", { class: "yax-graph-button", title: "Graph of the selected module (or the model)" }, "Graph"),
    export: h("button", { class: "yax-export", title: "Save the current model to run without yax, next to the "
      + "notebook: yax_model_stepK.jax_exported (jax.export) and yax_model_stepK.params.npz" }, "Export"),
    save: h("button", { class: "yax-save-html", title: "Save the explorer as it is (open rows, selection, comparison, "
      + "values, history) next to the notebook as <model>_snapshot.html: one file that opens without a kernel "
      + "or network" }, "Save HTML"),
  };
}

/** The holders of the side panes, by their tab's title (panes/tabs.js). */
export function sidePanes(providers = []) {
  const panes = {
    Compare: h("div", { class: "yax-compare" }),
    Values: h("div", { class: "yax-values" }),
    Diff: h("div", { class: "yax-diff" }),
    History: h("div", { class: "yax-history-pane" }),
    Graph: h("div", { class: "yax-graph" }),
    Code: h("div", { class: "yax-code-pane" }),
    Source: h("div", { class: "yax-source-pane" }),
  };
  // a row data provider's pane (panes/details.js), after the built-in ones (Python refuses their titles)
  for (const title of providers) if (!(title in panes)) panes[title] = h("div", { class: "yax-details-pane" });
  return panes;
}

/** The bar above the tree: the name/path filter, match navigation, expand/collapse all. */
export function treeControls() {
  return {
    search: h("input", { type: "search", placeholder: "filter by name or path", "aria-label": "filter rows" }),
    prev: h("button", { class: "yax-prev-match", title: "Previous match (Shift+F3)" }, "↑"),
    next: h("button", { class: "yax-next-match", title: "Next match (F3)" }, "↓"),
    at: h("span", { class: "yax-match-at" }),
    only: h("input", { type: "checkbox", class: "yax-only-matches" }),
    fold: h("input", { type: "checkbox", class: "yax-fold-repeats", checked: true }),
    expand: h("button", { class: "yax-expand-all", title: "Expand every call and list its equations" }, "expand all"),
    collapse: h("button", { class: "yax-collapse-all", title: "Collapse every call" }, "collapse all"),
  };
}

/** The explorer's root element: the toolbar, the tree with its bar and legend, the side panel. */
export function layout({ query, controls, buttons, status, view, palette, tabs, panes }) {
  const c = controls;
  const treeBar = h("div", { class: "yax-tree-bar" }, h("div", { class: "yax-search" }, c.search),
    h("span", { class: "yax-match-nav" }, "matches", c.prev, c.next, c.at),
    h("label", { class: "yax-only", title: "Show only the rows the query matches, and the calls around them" },
      c.only, "only matches"),
    // the tree's shape: kept together on one line when the bar wraps
    h("span", { class: "yax-tree-shape" }, h("label", { class: "yax-only", title: "Fold 3 or more consecutive "
      + "calls alike (the same structure, only their weights may differ, names differing only in their numbers: "
      + "80 decoder layers) into one row ×N, which opens onto the first's inside and shows the matches, diff marks "
      + "and divergence of all; its ×N unfolds it. Unticked: every call on its own row." }, c.fold, "fold ×N"),
    c.expand, c.collapse));
  const toolbar = h("div", { class: "yax-toolbar" }, query.el,
    buttons.undo, buttons.redo, buttons.copy, buttons.graph, buttons.export, buttons.save, status.el);
  const side = h("div", { class: "yax-side" },
    h("div", { class: "yax-section-title" }, "Replacements — drag onto a layer or the query box"),
    palette, tabs.bar, ...Object.values(panes));
  return h("div", { class: "yax-explorer" }, toolbar,
    h("div", { class: "yax-main" }, h("div", { class: "yax-left" }, treeBar, view.el, divergenceLegend()), side));
}
