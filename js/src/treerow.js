// One row of the tree view as an element: its marks, badges and tooltip, what a row of a folded
// run shows for the calls it stands for, and the legend of the rows' divergence colours.
import { h } from "./dom.js";
import { compact, divergenceColor, divergenceLevel, num } from "./format.js";
import { expandable } from "./tree.js";

/** The height of a row in pixels: rows are laid out at `i * ROW_H`. */
export const ROW_H = 22;

/** A compared call's tooltip: its errors (or why one is undefined) and, in a scanned stack, its steps. */
export function boundaryTitle(b) {
  const rel = b.undefined && b.undefined.rel ? `undefined (${b.undefined.rel})` : num(b.rel);
  const steps = b.steps ? `, over ${b.steps.join("×")} scan steps`
    + (b.first_step === null || b.first_step === undefined ? "" : ` (first differs at step ${b.first_step})`) : "";
  return `relative error ${rel}, max |Δ| ${num(b.max_abs)}${steps}`;
}

/** What the calls a row of a folded run stands for show together (`offs`: the offsets of their ids from the
 * row's, `layout`'s `stands`): how many match, their diff marks (`mark`: the strongest), the most diverging
 * boundary, which of them diverges first (-1: none), the colouring of the largest value. Nothing of any of
 * them is left out: a folded row never hides a match, a mark or a divergence. */
export function together(node, look, offs) {
  const out = { n: offs.length, matches: 0, marks: {}, mark: undefined, boundary: undefined, first: -1, overlay: null,
    nonfinite: 0 };
  let worst = -Infinity;
  offs.forEach((o, k) => {
    const id = node.id + o;
    if (look.matches.has(id)) out.matches += 1;
    const m = look.marks[String(id)];
    if (m) out.marks[m] = (out.marks[m] || 0) + 1;
    const b = look.boundaries[String(id)];
    const level = b ? divergenceLevel(b.rel) ?? -1 : null; // an undefined error below any measured one
    if (b && level > worst) [worst, out.boundary] = [level, b];
    if (look.firstDivergence === id) out.first = k;
    const v = look.overlay && look.overlay.get(id);
    if (v && (!out.overlay || v.x > out.overlay.x)) out.overlay = v;
    if (v && v.nonfinite) out.nonfinite += v.nonfinite;
  });
  out.mark = ["changed", "added", "removed"].find((m) => out.marks[m]);
  return out;
}

/** The badge of a row of a folded run: how many of the calls it stands for match, or carry a diff mark. */
function foldBadge(t) {
  const said = [t.matches && `${t.matches} of ${t.n} match`,
    ...Object.entries(t.marks).map(([m, k]) => `${m} in ${k} of ${t.n}`)].filter(Boolean);
  return said.length ? h("span", { class: "yax-fold-hits", title: said.join(", ") }, said.join(", ")) : null;
}

/** The tooltip of a folded row (`node.run`) or of a row inside one (`offs`): what it stands for and what a drop does. */
function foldTitle(node, offs) {
  const { run } = node;
  if (run) {
    const n = run.members.length;
    return `${n} calls alike, folded: ${run.members[0].path} … ${run.members[n - 1].path} (the same structure: `
      + `only their weights may differ). The row and what it opens show the first's inside; its marks are those `
      + `of all ${n}. Click ×${n} to unfold them (or untick “fold ×N” above the tree). A drop or a replacement changes one `
      + "call, so it is not taken here: unfold, or select them all with a query and drop on the query box.";
  }
  return `Stands for ${offs.length} calls, one in each of a folded run's calls alike: shows the first's; its `
    + "marks are those of all. A drop or a replacement is not taken here: unfold the run first.";
}

/** The element of `node` at position `i`; `look` holds what decides its marks (see `look()`); `offs`: the
 * offsets of the ids a folded row or a row inside one stands for (null: the row is itself). */
export function rowElement(node, i, look, offs = null) {
  const key = String(node.id);
  const t = offs ? together(node, look, offs) : null;
  const b = t ? t.boundary : look.boundaries[key];
  const level = b ? divergenceLevel(b.rel) : null;
  const mark = t ? t.mark : look.marks[key];
  // the colouring by a statistic (panes/values.js); a folded row's, that of the largest value it stands for
  const ov = t ? t.overlay && { ...t.overlay, title: `the largest of ${t.n}: ${t.overlay.title}`, nonfinite: t.nonfinite }
    : look.overlay && look.overlay.get(node.id);
  const first = t ? t.first >= 0 : look.firstDivergence === node.id;
  const cls = ["yax-row", node.eq ? "yax-eq" : `yax-${node.kind}`, node.run && "yax-folded",
    (t ? t.matches > 0 : look.matches.has(node.id)) && "yax-match", look.selected === node.id && "yax-selected",
    mark && `yax-${mark}`, look.dropping === node.id && "yax-dropping"].filter(Boolean).join(" ");
  const toggle = expandable(node)
    ? h("span", { class: "yax-toggle", role: "button", "aria-label": "expand" }, look.expanded.has(node.id) ? "▾" : "▸")
    : h("span", { class: "yax-toggle yax-leaf" }, "");
  const given = node.parent === -1 && !node.eq && look.inputs ? look.inputs : null; // the top row: the inputs as passed
  const ins = given ? given.map((x) => x.type).join(" ") : node.ins;
  const inSpecs = given ? given.filter((x) => x.sharding).map((x) => `${x.name}=${x.sharding}`).join(" ") : "";
  const title = [node.type && node.fields ? `${node.type}(${node.fields})` : node.fields,
    given && `inputs as passed: ${given.map((x) => `${x.name} ${x.type}${x.sharding ? ` ${x.sharding}` : ""}`).join(", ")}`
      + (ins !== node.ins ? `; the call receives ${node.ins} (the wrapper's doing)` : ""),
    node.sharding && `sharding: ${node.sharding}`,  // its parameters' PartitionSpecs (a sharded model)
    node.source && `source: ${node.source}`,  // the user's line calling it (an equation: making it)
    b && boundaryTitle(b) + (t && t.n > 1 ? ` (the most diverging of ${t.n})` : ""),
    t && foldTitle(node, offs)].filter(Boolean).join("\n") || undefined;
  return h("div", {
    class: cls, dataset: { id: key }, role: "treeitem", title,
    style: { top: `${i * ROW_H}px`, paddingLeft: `${6 + node.depth * 14}px`,
      borderLeftColor: level === null ? "transparent" : divergenceColor(level) },
  },
  toggle,
  ov ? h("span", { class: ov.color === "transparent" ? "yax-ov yax-ov-none" : "yax-ov", style: { background: ov.color },
    title: ov.title }) : null,
  ov && ov.nonfinite ? h("span", { class: "yax-ov-nan", title: `${ov.nonfinite.toLocaleString("en")} NaN or Inf in `
    + (t && t.n > 1 ? `the gradients of the ${t.n} calls it stands for` : "its gradient") },
  "NaN") : null,
  h("span", { class: "yax-name" }, node.name),
  node.run ? h("button", { class: "yax-fold", title: `Unfold these ${node.run.members.length} calls alike`,
    dataset: { path: node.run.path } }, `×${node.run.members.length}`) : null,
  t ? foldBadge(t) : null,
  node.type && node.type !== node.name ? h("span", { class: "yax-type" }, node.type) : null,
  h("span", { class: "yax-attrs" }, node.attrs || ""), // always there: it takes the room left, the shapes line up
  h("span", { class: "yax-shapes" }, `${ins} → ${node.outs}`),
  /['"]/.test(node.sharding) || inSpecs ? h("span", { class: "yax-sharding", title: [inSpecs && `inputs: ${inSpecs}`,
    node.sharding && `parameters: ${node.sharding}`].filter(Boolean).join("\n") },
  specsShown(inSpecs, node.sharding)) : null,
  node.policy ? h("span", { class: "yax-policy", title: "dtypes of its parameters / computation / outputs" },
    node.policy) : null,
  node.params ? h("span", { class: "yax-params", title: [node.copies > 1
    ? `${node.params.toLocaleString("en")} parameters in each of ${node.copies} layers `
      + `(${(node.params * node.copies).toLocaleString("en")} in all)` : "",
  t ? `${(node.params * node.copies).toLocaleString("en")} in each of the ${t.n} calls it stands for `
    + `(${(node.params * node.copies * t.n).toLocaleString("en")} in all)` : ""].filter(Boolean).join("; ") || undefined },
  compact(node.params) + (node.copies > 1 ? ` ×${node.copies}` : "") + (t ? " each" : "")) : null,
  first ? h("span", { class: "yax-first", title: t && t.n > 1
    ? `outputs start to differ in ${look.pathOf(node.id + offs[t.first])}, one of the ${t.n} calls this row stands for`
    : "outputs start to differ here" }, "◆ first divergence") : null,
  look.selected === node.id && !node.eq && !t
    ? h("button", { class: "yax-replace", title: "What fits here (Enter, or double-click the row)" }, "replace…") : null);
}

/** The sharding badge's text: the inputs' specs, then the distinct specs of the parameters that split
 * an axis (`kernel=P(None,'model') bias=P()` -> `P(None,'model')`; the tooltip has them all). */
function specsShown(inputs, params) {
  const specs = (text) => [...new Set((text || "").split(" ").filter(Boolean).map((kv) => kv.slice(kv.indexOf("=") + 1))
    .filter((spec) => /['"]/.test(spec)))];
  return [inputs && `in ${specs(inputs).join(" ")}`, params && specs(params).join(" ")].filter(Boolean).join(" · ");
}

/** The legend of the rows' divergence colours. */
export function divergenceLegend() {
  return h("div", { class: "yax-legend" },
    h("span", {}, "divergence at module outputs:"),
    ...[0, 0.25, 0.5, 0.75, 1].map((l) => h("span", { class: "yax-swatch", style: { background: divergenceColor(l) },
      title: `relative error 1e${Math.round(-7 + 7 * l)}` })),
    h("span", {}, "1e-7 … 1"));
}
