// The diff pane: the rows of the original and the current model that differ (`_diff`
// marks), with their ancestors for context.
import { h } from "../dom.js";
import { ancestorsOf } from "../tree.js";

const SIGN = { added: "+ ", removed: "− ", changed: "~ " };

function side(title, tree, marks) {
  const keep = new Set(Object.keys(marks).map(Number));
  for (const a of ancestorsOf([...keep], (i) => tree.byId.get(i)?.parent)) keep.add(a);
  const rows = [...tree.byId.values()].filter((n) => keep.has(n.id));
  return h("div", { class: "yax-diff-side" }, h("div", { class: "yax-section-title" }, title),
    rows.length ? rows.map((n) => {
      const mark = marks[String(n.id)];
      return h("div", {
        class: `yax-diff-row ${mark ? `yax-${mark}` : ""}`, dataset: { id: String(n.id) },
        style: { paddingLeft: `${4 + n.depth * 12}px` },
      }, h("span", { class: "yax-diff-name" }, `${SIGN[mark] || "  "}${n.name}`), n.type && n.type !== n.name ? h("span", { class: "yax-type" }, n.type) : null);
    }) : h("div", { class: "yax-hint" }, "no differences"));
}

/** Fill `pane`: `original` and `current` are trees (tree.js), `diff` the `_diff` value. */
export function renderDiff(pane, original, current, diff) {
  pane.replaceChildren(h("div", { class: "yax-diff-cols" },
    side("original", original, diff.original || {}), side("current", current, diff.current || {})));
}
