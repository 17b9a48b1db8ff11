// The tree view: the rows of the current model (virtualised: only the rows in sight are in
// the DOM), the query's highlight, the diff marks and divergence colours, equations loaded
// on demand, keyboard navigation, palette drops, and the fits menu and refusal notice
// shown at their rows.
import { h } from "./dom.js";
import { compact, divergenceColor, divergenceLevel, num } from "./format.js";
import { fitsMenu } from "./panes/palette.js";
import {
  allExpandable, ancestorsOf, bothKept, buildTree, equationNodes, expandable, expandedByPath, filterKeep,
  foldsAround, initialExpanded, layout, matchKeep, nextIndex, ownerOf, pathOf, shownAs,
} from "./tree.js";

export const ROW_H = 22;
const OVERSCAN = 10;

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

/** Call row `id` of tree `prev` in tree `next` (ids change with every rewrite), or null: the row
 * of the same kind and path (a helper method's name holds its method), the k-th of those where
 * a module is called k times, as `xpath_for` (yax_widget/_code.py) names a node. */
export function sameRow(prev, id, next) {
  const node = prev.byId.get(id);
  if (!node) return null;
  const same = (n) => n.kind === node.kind && n.path === node.path;
  let k = 0;
  for (const n of prev.byId.values()) {
    if (n === node) break;
    if (same(n)) k += 1;
  }
  for (const n of next.byId.values()) if (same(n) && k-- === 0) return n.id;
  return null;
}

/** Where equation `id` is among the loaded equations `eqs` (call id -> equation nodes):
 * `{owner, primitive, k}`, the k-th equation of its primitive in its call; null when not loaded. */
export function equationPlace(eqs, id) {
  for (const [owner, nodes] of eqs) {
    const at = nodes.findIndex((e) => e.id === id);
    if (at >= 0) {
      const primitive = nodes[at].name;
      return { owner, primitive, k: nodes.slice(0, at).filter((e) => e.name === primitive).length };
    }
  }
  return null;
}

/** The legend of the rows' divergence colours. */
export function divergenceLegend() {
  return h("div", { class: "yax-legend" },
    h("span", {}, "divergence at module outputs:"),
    ...[0, 0.25, 0.5, 0.75, 1].map((l) => h("span", { class: "yax-swatch", style: { background: divergenceColor(l) },
      title: `relative error 1e${Math.round(-7 + 7 * l)}` })),
    h("span", {}, "1e-7 … 1"));
}

export class TreeView {
  /**
   * `request(type, payload)`: requests.js; `onFailure(err)`: show a failed request;
   * `onSubstitute(target, name)`: what a drop or a pick in the fits menu does;
   * `onMatchesShown(ids)`: the highlight of `showMatches` is on screen; `onSelect(id)`: a row
   * was selected (the graph pane follows the selection).
   */
  constructor({ model, request, onFailure, onSubstitute, onMatchesShown, onSelect = () => {} }) {
    Object.assign(this, { model, request, onFailure, onSubstitute, onMatchesShown, onSelect });
    this.tree = buildTree([]);
    this.expanded = new Set();
    this.eqs = new Map();      // call id -> equation nodes
    this.loading = new Map();  // call node -> its `expand` request in flight
    this.keep = null;          // the ids both filters keep, or null
    this.filterText = "";      // the name/path filter
    this.onlyMatches = false;  // keep only the query's matches (and their ancestors)
    this.owners = {};          // `_match_owners`
    this.selected = null;      // selected row id
    this.fits = null;          // {id, fits, refused}: the menu at a row
    this.notice = null;        // {id, message, action}: a refusal's reason at a row (and what it offers)
    this.visible = [];
    this.laidOut = null;       // the tree `visible` was laid out from
    this.stands = [];          // per visible row: null, or the offsets of the ids a folded row stands for (tree.js)
    this.folding = true;       // fold runs of FOLD_MIN or more calls alike into one ×N row
    this.openRuns = new Set(); // paths of the runs the user unfolded (paths survive a rewrite; ids do not)
    this.matchSet = new Set();
    this.matchVersion = 0;
    this.dragOver = null;
    this.overlay = null;       // row id -> {color, title}: the colouring by a statistic (panes/values.js)
    this.frame = 0;
    this.dirty = true;         // something but the scroll position changed since the last paint
    this.painted = new Map();  // position -> {node, el}: the rows the last paint put in the DOM
    this.overlays = [];        // the other elements it put there (the fits menu, the notice, a hint)
    this.spacer = h("div", { class: "yax-spacer" });
    this.el = h("div", { class: "yax-tree", tabindex: "0", role: "tree", "aria-label": "module tree" }, this.spacer);
    this.el.addEventListener("scroll", () => this.schedule(true));
    this.el.addEventListener("click", (e) => this.onClick(e));
    this.listenForDrops();
  }

  // -- painting --------------------------------------------------------------------------

  /** What decides the rows' marks, read once per paint. */
  look() {
    const c = this.model.get("_comparison") || {};
    return {
      matches: this.matchSet, selected: this.selected, expanded: this.expanded, dropping: this.dragOver,
      boundaries: c.boundaries || {}, firstDivergence: c.first_divergence_id,
      marks: (this.model.get("_diff") || {}).current || {}, overlay: this.overlay,
      // the model's inputs as the user passed them, shown on the top row when there is one
      inputs: this.tree.roots.length === 1 ? (this.model.get("_batches") || {}).inputs || null : null,
      pathOf: (id) => pathOf(this.tree, id),
    };
  }

  /** Put the rows in sight in the DOM. After a scroll alone, the rows still in sight keep their elements
   * and only those coming into sight are made: the browser styles and lays out those alone (a full repaint
   * of the ~45 rows each frame took most of a frame's time on a busy 2-core machine). */
  paint() {
    this.frame = 0;
    const reuse = !this.dirty;
    this.dirty = false;
    const { el, visible, spacer } = this;
    spacer.style.height = `${visible.length * ROW_H}px`;
    const from = Math.max(0, Math.floor(el.scrollTop / ROW_H) - OVERSCAN);
    const to = Math.min(visible.length, Math.ceil((el.scrollTop + el.clientHeight) / ROW_H) + OVERSCAN);
    const look = this.look();
    const rows = new Map();
    for (let i = from; i < to; i++) {
      const was = reuse ? this.painted.get(i) : undefined;
      rows.set(i, was && was.node === visible[i] ? was : { node: visible[i], el: null });
    }
    for (const [i, r] of this.painted) if (rows.get(i) !== r) r.el.remove();
    for (const o of this.overlays) o.remove();
    const added = [];
    for (const [i, r] of rows) {
      if (!r.el) added.push(r.el = rowElement(visible[i], i, look, this.stands[i]));
    }
    this.painted = rows;
    const out = [];
    if (!visible.length && this.keep) {
      out.push(h("div", { class: "yax-hint yax-empty" }, this.onlyMatches && !this.matchSet.size
        ? "Nothing to show: the query matches no row (untick “only matches”)."
        : `No row matches the filter “${this.filterText}” (it looks in names, types and paths).`));
    }
    const at = this.fits ? this.indexOf(this.fits.id) : -1;
    if (at >= 0) {
      const { id } = this.fits;
      out.push(this.near(at, fitsMenu(this.fits, {
        onPick: (name) => this.onSubstitute(id, name),
        onClose: () => { this.fits = null; this.schedule(); },
      })));
    }
    if (this.notice) out.push(this.near(this.indexOf(this.notice.id), this.noticeElement()));
    this.overlays = out;
    spacer.append(...added, ...out); // the overlays last: above the rows
  }

  /** Place an overlay at row `i` (at the top when -1): below it, or above it when the row is in
   * the lower half of the tree's view, so that the tree's bottom edge never cuts it off. */
  near(i, el) {
    const y = i * ROW_H - this.el.scrollTop;
    const above = i >= 0 && y > this.el.clientHeight / 2;
    el.classList.toggle("yax-above", above);
    el.style.top = `${above ? i * ROW_H : (i + 1) * ROW_H}px`;
    return el;
  }

  noticeElement() {
    const { message, action } = this.notice;
    const close = () => { this.notice = null; this.schedule(); };
    return h("div", { class: "yax-notice", role: "alert" },
      h("button", { class: "yax-close", onclick: close }, "×"),
      message,
      action ? h("div", { class: "yax-offer" }, h("button", { class: "yax-offer-apply",
        onclick: () => { close(); action.run(); } }, action.label)) : null);
  }

  /** Paint at the next frame (once, however often asked); `scrolled`: only the scroll position changed. */
  schedule(scrolled = false) {
    if (!scrolled) this.dirty = true;
    if (!this.frame) this.frame = requestAnimationFrame(() => this.paint());
  }

  /** The visible rows changed (expansion, filter, equations, tree, folding). */
  relayout() {
    const { rows, stands } = layout(this.tree, this.expanded, this.eqs, this.keep, this.folds());
    this.laidOut = this.tree; // the tree these rows are of (`setRows` changes it without laying out)
    this.visible = rows;
    this.stands = stands;
    // the height now, not at the next paint: a `scrollTo` right after must not be clamped to the old one
    this.spacer.style.height = `${rows.length * ROW_H}px`;
    this.schedule();
  }

  /** What `layout` folds: null when folding is off, else the runs the user unfolded. */
  folds() {
    return this.folding ? { open: this.openRuns } : null;
  }

  /** Is visible row `i` highlighted: matched itself, or standing for a call that is? */
  matchedAt(i) {
    const node = this.visible[i];
    const offs = this.stands[i];
    return offs ? offs.some((o) => this.matchSet.has(node.id + o)) : this.matchSet.has(node.id);
  }

  indexOf(id) {
    return id === null || id === undefined ? -1 : this.visible.findIndex((n) => n.id === id);
  }

  scrollTo(i) {
    if (i < 0) return;
    const { el } = this;
    const y = i * ROW_H;
    if (y < el.scrollTop || y + ROW_H > el.scrollTop + el.clientHeight) {
      el.scrollTop = Math.max(0, y - el.clientHeight / 3);
    }
    this.schedule();
  }

  // -- state from Python -------------------------------------------------------------------

  /** New rows (`_tree`): what was expanded stays expanded, and the selected row selected, where the
   * rows still exist (an undo, a redo, a change elsewhere: `sameRow`). */
  setRows(rows, filterText) {
    const prev = this.tree;
    const prevEqs = this.eqs;
    const was = this.selected;
    // where the selected row is on screen: an undo or a redo keeps it there (its equations come back later)
    const i = was === null ? -1 : this.indexOf(was);
    const at = i >= 0 ? i * ROW_H - this.el.scrollTop : null;
    this.tree = buildTree(rows);
    this.expanded = prev.byId.size ? expandedByPath(prev, this.expanded, this.tree) : initialExpanded(this.tree);
    this.eqs = new Map();
    this.selected = null;
    this.fits = null;
    this.dropOffer();
    this.filterText = filterText;
    this.updateKeep();
    if (prev.byId.size) this.follow(prev, prevEqs, was, at);
    this.keepAt(at);
  }

  /** Scroll so that the selected row is `at` pixels below the top of the tree's view, as it was (a row
   * laid out elsewhere by a new model), or into view when that place is out of it. */
  keepAt(at) {
    if (at === null || this.selected === null) return;
    if (this.laidOut !== this.tree) this.relayout(); // the rows of the new tree, to find where the row is
    const i = this.indexOf(this.selected);
    if (i < 0) return;
    const fits = at >= 0 && at + ROW_H <= this.el.clientHeight;
    this.el.scrollTop = Math.max(0, i * ROW_H - (fits ? at : this.el.clientHeight / 3));
    this.schedule(true);
  }

  /** After new rows: select again the row `was` of `prev` where it still exists (the caller updates the
   * panes), and load again the equations of the calls still open (`prevEqs`: those loaded in `prev`). An
   * equation is selected again once its call's equations are back, unless the user selected a row meanwhile. */
  follow(prev, prevEqs, was, at = null) {
    const eq = was !== null && !prev.byId.has(was) ? equationPlace(prevEqs, was) : null;
    if (!eq && was !== null) this.selected = sameRow(prev, was, this.tree);
    const open = [];
    let holder = null; // the call whose equation was selected
    for (const owner of prevEqs.keys()) {
      const node = this.tree.byId.get(sameRow(prev, owner, this.tree));
      if (!node || !this.expanded.has(node.id)) continue;
      open.push(node);
      if (eq && eq.owner === owner) holder = node;
    }
    if (!open.length) return;
    const loaded = this.loadMany(open).then(() => { // one request, however many
      this.relayout();
      this.keepAt(at);
    });
    if (holder) {
      loaded.then(() => {
        if (this.tree.byId.get(holder.id) !== holder || this.selected !== null) return;
        const again = (this.eqs.get(holder.id) || []).filter((e) => e.name === eq.primitive)[eq.k];
        if (!again) return;
        this.selected = again.id;
        this.schedule();
        this.onSelect(again.id);
      });
    }
  }

  /** The rows both filters keep (the name/path filter, "only matches"). */
  updateKeep() {
    this.keep = bothKept(filterKeep(this.tree, this.filterText),
      this.onlyMatches ? matchKeep(this.tree, [...this.matchSet], this.owners) : null);
  }

  setFilter(text) {
    this.filterText = text;
    this.updateKeep();
    this.relayout();
  }

  setOnlyMatches(on) {
    this.onlyMatches = on;
    this.updateKeep();
    this.relayout();
  }

  /** Expand every call, equations included: those not loaded yet come in one `equations` request.
   * Resolves once they are laid out. */
  expandAll() {
    this.expanded = allExpandable(this.tree);
    this.relayout();
    return this.loadMany([...this.tree.byId.values()]).then(() => this.relayout());
  }

  // -- folding ---------------------------------------------------------------------------------

  /** Fold runs of calls alike into one row each (`on`, the default), or show every call on its own row.
   * Folding again folds every run, but those hiding the selected row. */
  setFolding(on) {
    this.folding = on;
    this.openRuns = new Set();
    if (on && this.selected !== null) this.unhide(this.selected);
    this.relayout();
  }

  /** Unfold the run whose first member's path is `path` (its ×N button). */
  unfold(path) {
    this.openRuns.add(path);
    this.relayout();
  }

  /** The call row `id` belongs to: itself, or the call running equation `id`. */
  callOf(id) {
    const own = ownerOf(id, this.tree, this.owners);
    if (own !== undefined) return own;
    for (const [owner, nodes] of this.eqs) if (nodes.some((e) => e.id === id)) return owner;
    return undefined;
  }

  /** The folded runs row `id` is in (`foldsAround`): none when it is shown as itself. */
  foldsOf(id) {
    const call = this.callOf(id);
    return call === undefined ? [] : foldsAround(this.tree, call, this.eqs, this.folds());
  }

  /** Unfold the runs that hide row `id` (a later member of a folded run, or inside one); with `all`, also
   * those whose row stands for it and others, so that it is shown as itself. Returns whether any unfolded. */
  unhide(id, all = false) {
    const runs = this.foldsOf(id).filter((f) => all || f.k > 0);
    for (const { run } of runs) this.openRuns.add(run.path);
    if (runs.length) this.relayout();
    return runs.length > 0;
  }

  /** Refuse a drop or a pick on a row that stands for several calls, at the row, saying why and
   * offering to unfold (then, with `thenFits`, what fits the one call). */
  refuseFolded(id, thenFits) {
    const runs = this.foldsOf(id);
    const { run } = runs[runs.length - 1];
    const n = runs.reduce((k, f) => k * f.run.members.length, 1);
    const what = this.tree.byId.get(id) === run.members[0] ? `the ${n} calls alike ${run.row.name}`
      : `one call in each of the ${n} calls alike ${run.row.name}`;
    this.showNotice(id, `This row is folded: it stands for ${what} (${run.members[0].path} … `
      + `${run.members[run.members.length - 1].path}), and a replacement changes one call, so it is not taken `
      + "here. Unfold to change one of them, or select them all with a query and drop on the query box.",
    { label: thenFits ? "Unfold, then choose" : "Unfold", run: () => {
      this.unhide(id, true);
      this.select(id, thenFits);
      this.scrollTo(this.indexOf(id));
    } });
  }

  /** A palette item dropped on row `id`: substituted, unless the row stands for several calls. */
  drop(id, name) {
    if (this.foldsOf(id).length) this.refuseFolded(id, false);
    else this.onSubstitute(id, name);
  }

  collapseAll() {
    this.expanded = new Set();
    this.relayout();
  }

  /** Select the next (`step` 1) or previous (-1) highlighted row and scroll to it; returns
   * its position among the visible matches as `[k, n]` (1-based), or null when none is visible. */
  stepMatch(step) {
    const hits = new Set(this.visible.filter((n, i) => this.matchedAt(i)).map((n) => n.id));
    let i = nextIndex(this.visible, hits, this.indexOf(this.selected), step);
    if (i < 0) return null;
    const offs = this.stands[i];
    if (offs) {
      // a folded row standing for matches: unfold it and go to the first of them (the last, going up)
      const ids = offs.map((o) => this.visible[i].id + o).filter((id) => this.matchSet.has(id));
      const id = step < 0 ? ids[ids.length - 1] : ids[0];
      this.unhide(id, true);
      i = this.indexOf(id);
      if (i < 0) return null;
    }
    this.select(this.visible[i].id, false);
    this.scrollTo(i);
    const shown = this.visible.filter((n, k) => this.matchedAt(k));
    return [shown.indexOf(this.visible[i]) + 1, shown.length];
  }

  /** Highlight `ids` (`_matches`): expand their ancestors, load the equations of calls whose
   * equations match (`owners`: `_match_owners`), scroll to the first; then `onMatchesShown`. */
  showMatches(ids, owners) {
    const version = ++this.matchVersion;
    const { byId } = this.tree;
    this.matchSet = new Set(ids);
    this.owners = owners;
    const opened = this.expanded.size;
    if (this.onlyMatches) this.updateKeep();
    const calls = ids.map((id) => ownerOf(id, this.tree, owners)).filter((x) => x !== undefined);
    // a match in a folded run's later member is shown on the row standing for it: open that row's way too
    const folds = this.folds();
    const shown = (id) => (folds ? shownAs(this.tree, id, this.eqs, folds) : id);
    const standing = folds ? calls.map(shown).filter((id, k) => id !== calls[k]) : [];
    for (const a of ancestorsOf([...calls, ...standing], (i) => byId.get(i)?.parent)) this.expanded.add(a);
    const owning = [...new Set(ids.filter((id) => !byId.has(id)).map((id) => owners[String(id)]))]
      .filter((o) => byId.has(o));
    const withEqs = [...new Set([...owning, ...owning.map(shown)])];
    for (const o of withEqs) this.expanded.add(o);
    // laying out 11,000 rows takes a few ms: only when the rows change, not for a highlight alone
    const fetching = withEqs.some((o) => !this.eqs.has(o) || this.loading.has(byId.get(o)));
    if (this.onlyMatches || this.expanded.size !== opened || this.laidOut !== this.tree) this.relayout();
    else this.schedule();
    return this.loadMany(withEqs.map((o) => byId.get(o))).then(() => {
      if (version !== this.matchVersion) return;
      if (fetching) this.relayout();
      this.scrollTo(this.visible.findIndex((n, i) => this.matchedAt(i)));
      // announce the highlight once it is on screen (the browser tests wait for this)
      requestAnimationFrame(() => {
        this.paint(); // the rows are in the DOM before the highlight is announced
        if (version === this.matchVersion) this.onMatchesShown(ids);
      });
    });
  }

  /** Select call `id`, opening its ancestors and the folded runs hiding it, and scroll to it (from the graph
   * or the compare pane). */
  reveal(id) {
    const { byId } = this.tree;
    if (!byId.has(id)) return;
    this.unhide(id); // hidden in a folded run: unfolded (the first of a run is its folded row, which stays)
    for (const a of ancestorsOf([id], (i) => byId.get(i)?.parent)) this.expanded.add(a);
    this.relayout();
    this.select(id, false);
    this.scrollTo(this.indexOf(id));
  }

  /** A refusal's reason at row `id` (null: the top); `action` `{label, run()}`: a button offering what
   * the refusal allows instead (a drop on the query box that fits some of the matches: just those). */
  showNotice(id, message, action = null) {
    this.notice = { id, message, action };
    this.schedule();
  }

  /** Close the notice: the user's next action (a press or a key anywhere in the explorer but on the notice). */
  dropNotice() {
    if (!this.notice) return;
    this.notice = null;
    this.schedule(true); // the overlays only: the row being pressed keeps its element, so its click lands
  }

  /** Close a notice that offers an action: it was made for rows that are gone or a query that changed. */
  dropOffer() {
    if (!this.notice || !this.notice.action) return;
    this.notice = null;
    this.schedule();
  }

  /** Close the fits menu and the notice. */
  closeOverlays() {
    this.fits = null;
    this.notice = null;
    this.schedule();
  }

  // -- user actions -------------------------------------------------------------------------

  async toggle(id) {
    const node = this.tree.byId.get(id);
    if (!node || !expandable(node)) return;
    if (this.expanded.has(id)) this.expanded.delete(id);
    else {
      this.expanded.add(id);
      await this.loadEquations(node);
    }
    this.relayout();
  }

  /** Fetch the equations of a call once (an `expand` request). A second call while the first
   * is in flight gets the same promise: it resolves when the rows are there (two trait changes in
   * one message show the matches twice in one tick). */
  loadEquations(node) {
    if (!(node.neq > 0)) return Promise.resolve();
    const pending = this.loading.get(node);
    if (pending) return pending;
    if (this.eqs.has(node.id)) return Promise.resolve();
    this.eqs.set(node.id, []);
    const current = () => this.tree.byId.get(node.id) === node; // not rebuilt meanwhile
    const done = (async () => {
      try {
        const reply = await this.request("expand", { id: node.id });
        if (current()) this.eqs.set(node.id, equationNodes(node, reply.rows));
      } catch (err) {
        if (current()) this.eqs.delete(node.id);
        this.onFailure(err);
      } finally {
        this.loading.delete(node);
      }
    })();
    this.loading.set(node, done);
    return done;
  }

  /** Fetch the equations of the calls `nodes` not loaded yet: one `equations` request for all of them (one
   * `expand` for a single call), so that "expand all" on a 70B model is one round trip, not 1,300. Resolves
   * when every one of them is loaded (or failed: the failure is shown). */
  loadMany(nodes) {
    const todo = nodes.filter((n) => n.neq > 0 && !this.eqs.has(n.id) && !this.loading.has(n));
    const pending = [...new Set(nodes.map((n) => this.loading.get(n)).filter(Boolean))];
    if (todo.length <= 1) return Promise.all([...pending, ...todo.map((n) => this.loadEquations(n))]);
    const { tree } = this;
    for (const n of todo) this.eqs.set(n.id, []);
    const done = (async () => {
      try {
        const reply = await this.request("equations", { ids: todo.map((n) => n.id) });
        if (this.tree !== tree) return; // rebuilt meanwhile
        const rows = new Map(reply.calls);
        for (const n of todo) this.eqs.set(n.id, equationNodes(n, rows.get(n.id) || []));
      } catch (err) {
        if (this.tree === tree) for (const n of todo) this.eqs.delete(n.id);
        this.onFailure(err);
      } finally {
        for (const n of todo) this.loading.delete(n);
      }
    })();
    for (const n of todo) this.loading.set(n, done);
    return Promise.all([...pending, done]);
  }

  /** Select a row; with `openMenu`, offer what fits it (a `fits` request). */
  async select(id, openMenu) {
    this.unhide(id); // hidden in a folded run (selected from the values pane, a NaN search): unfold it
    const moved = this.selected !== id;
    this.selected = id;
    this.fits = null;
    if (this.notice && this.notice.id !== id) this.notice = null; // a refusal's reason goes once the user moves on
    this.schedule();
    if (moved) this.onSelect(id);
    if (!openMenu) return;
    if (this.foldsOf(id).length) {
      this.refuseFolded(id, true); // the menu offers what a drop takes, and a drop is not taken here
      return;
    }
    try {
      const reply = await this.request("fits", { id });
      if (this.selected === id) {
        this.fits = { id, fits: reply.fits, refused: reply.refused };
        this.schedule();
      }
    } catch (err) {
      this.onFailure(err);
    }
  }

  /** A click selects a row (the graph follows it); its "replace…" button, a double-click or
   * Enter offer what fits. */
  onClick(e) {
    const row = e.target.closest(".yax-row");
    if (!row) return;
    const id = Number(row.dataset.id);
    const fold = e.target.closest(".yax-fold");
    if (fold) this.unfold(fold.dataset.path);
    else if (e.target.closest(".yax-toggle")) this.toggle(id);
    else this.select(id, !!e.target.closest(".yax-replace") || e.detail === 2);
  }

  /** Arrows move the selection, right/left expand and collapse (left again goes to the
   * parent), Enter offers what fits, Escape closes the menu and the notice. */
  onKey(e) {
    const { visible } = this;
    if (!visible.length) return;
    let i = this.indexOf(this.selected);
    const node = visible[i];
    if (e.key === "ArrowDown" || e.key === "ArrowUp") {
      i = Math.min(visible.length - 1, Math.max(0, i + (e.key === "ArrowDown" ? 1 : -1)));
      this.select(visible[i].id, false);
      this.scrollTo(i);
    } else if (e.key === "ArrowRight" && node && !this.expanded.has(node.id)) {
      this.toggle(node.id);
    } else if (e.key === "ArrowLeft" && node) {
      if (this.expanded.has(node.id)) this.toggle(node.id);
      else if (node.parent >= 0) {
        this.select(node.parent, false);
        this.scrollTo(this.indexOf(node.parent));
      }
    } else if (e.key === "Enter" && node) {
      this.select(node.id, true);
    } else if (e.key === "Escape") {
      this.closeOverlays();
    } else return;
    e.preventDefault();
  }

  /** Palette items dropped onto rows. The drop-target highlight is set on the row element
   * itself: repainting the rows under the pointer in the middle of a drag would detach its target. */
  listenForDrops() {
    const { el, spacer } = this;
    const rowOf = (e) => e.target.closest(".yax-row");
    const mark = (id) => {
      this.dragOver = id;
      for (const r of spacer.querySelectorAll(".yax-dropping")) r.classList.remove("yax-dropping");
      if (id !== null) spacer.querySelector(`.yax-row[data-id="${id}"]`)?.classList.add("yax-dropping");
    };
    el.addEventListener("dragover", (e) => {
      const row = rowOf(e);
      if (!row) return;
      e.preventDefault();
      e.dataTransfer.dropEffect = "copy";
      const id = Number(row.dataset.id);
      if (this.dragOver !== id) mark(id);
    });
    el.addEventListener("dragleave", (e) => {
      if (!el.contains(e.relatedTarget)) mark(null);
    });
    el.addEventListener("drop", (e) => {
      const row = rowOf(e);
      mark(null);
      if (!row) return;
      e.preventDefault();
      const name = e.dataTransfer.getData("text/plain");
      if (name) this.drop(Number(row.dataset.id), name);
    });
  }

  dispose() {
    if (this.frame) cancelAnimationFrame(this.frame);
    this.frame = 0;
  }
}
