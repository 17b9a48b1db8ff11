// The tree view: the rows of the current model (virtualised: only the rows in sight are in
// the DOM), the query's highlight, the diff marks and divergence colours, equations loaded
// on demand, keyboard navigation, palette drops, and the fits menu and refusal notice
// shown at their rows.
import { h } from "./dom.js";
import { compact, divergenceColor, divergenceLevel, num } from "./format.js";
import { fitsMenu } from "./panes/palette.js";
import {
  allExpandable, ancestorsOf, bothKept, buildTree, equationNodes, expandable, expandedByPath, filterKeep,
  initialExpanded, matchKeep, nextIndex, ownerOf, visibleRows,
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

/** The element of `node` at position `i`; `look` holds what decides its marks (see `look()`). */
export function rowElement(node, i, look) {
  const key = String(node.id);
  const b = look.boundaries[key];
  const level = b ? divergenceLevel(b.rel) : null;
  const mark = look.marks[key];
  const ov = look.overlay && look.overlay.get(node.id); // the colouring by a statistic (panes/values.js)
  const cls = ["yax-row", node.eq ? "yax-eq" : `yax-${node.kind}`,
    look.matches.has(node.id) && "yax-match", look.selected === node.id && "yax-selected",
    mark && `yax-${mark}`, look.dropping === node.id && "yax-dropping"].filter(Boolean).join(" ");
  const toggle = expandable(node)
    ? h("span", { class: "yax-toggle", role: "button", "aria-label": "expand" }, look.expanded.has(node.id) ? "▾" : "▸")
    : h("span", { class: "yax-toggle yax-leaf" }, "");
  const title = [node.type && node.fields ? `${node.type}(${node.fields})` : node.fields,
    b && boundaryTitle(b)].filter(Boolean).join("\n") || undefined;
  return h("div", {
    class: cls, dataset: { id: key }, role: "treeitem", title,
    style: { top: `${i * ROW_H}px`, paddingLeft: `${6 + node.depth * 14}px`,
      borderLeftColor: level === null ? "transparent" : divergenceColor(level) },
  },
  toggle,
  ov ? h("span", { class: "yax-ov", style: { background: ov.color }, title: ov.title }) : null,
  h("span", { class: "yax-name" }, node.name),
  node.type && node.type !== node.name ? h("span", { class: "yax-type" }, node.type) : null,
  h("span", { class: "yax-attrs" }, node.attrs || ""), // always there: it takes the room left, the shapes line up
  h("span", { class: "yax-shapes" }, `${node.ins} → ${node.outs}`),
  node.policy ? h("span", { class: "yax-policy", title: "dtypes of its parameters / computation / outputs" },
    node.policy) : null,
  node.params ? h("span", { class: "yax-params", title: node.copies > 1
    ? `${node.params.toLocaleString("en")} parameters in each of ${node.copies} layers `
      + `(${(node.params * node.copies).toLocaleString("en")} in all)` : undefined },
  compact(node.params) + (node.copies > 1 ? ` ×${node.copies}` : "")) : null,
  look.firstDivergence === node.id
    ? h("span", { class: "yax-first", title: "outputs start to differ here" }, "◆ first divergence") : null,
  look.selected === node.id && !node.eq
    ? h("button", { class: "yax-replace", title: "What fits here (Enter, or double-click the row)" }, "replace…") : null);
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
    this.matchSet = new Set();
    this.matchVersion = 0;
    this.dragOver = null;
    this.overlay = null;       // row id -> {color, title}: the colouring by a statistic (panes/values.js)
    this.frame = 0;
    this.spacer = h("div", { class: "yax-spacer" });
    this.el = h("div", { class: "yax-tree", tabindex: "0", role: "tree", "aria-label": "module tree" }, this.spacer);
    this.el.addEventListener("scroll", () => this.schedule());
    this.el.addEventListener("click", (e) => this.onClick(e));
    this.el.addEventListener("keydown", (e) => this.onKey(e));
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
    };
  }

  paint() {
    this.frame = 0;
    const { el, visible } = this;
    this.spacer.style.height = `${visible.length * ROW_H}px`;
    const from = Math.max(0, Math.floor(el.scrollTop / ROW_H) - OVERSCAN);
    const to = Math.min(visible.length, Math.ceil((el.scrollTop + el.clientHeight) / ROW_H) + OVERSCAN);
    const look = this.look();
    const out = [];
    if (!visible.length && this.keep) {
      out.push(h("div", { class: "yax-hint yax-empty" }, this.onlyMatches && !this.matchSet.size
        ? "Nothing to show: the query matches no row (untick “only matches”)."
        : `No row matches the filter “${this.filterText}” (it looks in names, types and paths).`));
    }
    for (let i = from; i < to; i++) out.push(rowElement(visible[i], i, look));
    const at = this.fits ? this.indexOf(this.fits.id) : -1;
    if (at >= 0) {
      const { id } = this.fits;
      out.push(this.near(at, fitsMenu(this.fits, {
        onPick: (name) => this.onSubstitute(id, name),
        onClose: () => { this.fits = null; this.schedule(); },
      })));
    }
    if (this.notice) out.push(this.near(this.indexOf(this.notice.id), this.noticeElement()));
    this.spacer.replaceChildren(...out);
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

  /** Paint at the next frame (once, however often asked). */
  schedule() {
    if (!this.frame) this.frame = requestAnimationFrame(() => this.paint());
  }

  /** The visible rows changed (expansion, filter, equations, tree). */
  relayout() {
    this.visible = visibleRows(this.tree, this.expanded, this.eqs, this.keep);
    this.schedule();
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
    this.tree = buildTree(rows);
    this.expanded = prev.byId.size ? expandedByPath(prev, this.expanded, this.tree) : initialExpanded(this.tree);
    this.eqs = new Map();
    this.selected = null;
    this.fits = null;
    this.dropOffer();
    this.filterText = filterText;
    this.updateKeep();
    if (prev.byId.size) this.follow(prev, prevEqs, was);
  }

  /** After new rows: select again the row `was` of `prev` where it still exists (the caller updates the
   * panes), and load again the equations of the calls still open (`prevEqs`: those loaded in `prev`). An
   * equation is selected again once its call's equations are back, unless the user selected a row meanwhile. */
  follow(prev, prevEqs, was) {
    const eq = was !== null && !prev.byId.has(was) ? equationPlace(prevEqs, was) : null;
    if (!eq && was !== null) this.selected = sameRow(prev, was, this.tree);
    for (const owner of prevEqs.keys()) {
      const id = sameRow(prev, owner, this.tree);
      const node = this.tree.byId.get(id);
      if (!node || !this.expanded.has(id)) continue;
      const loaded = this.loadEquations(node).then(() => this.relayout());
      if (eq && eq.owner === owner) {
        loaded.then(() => {
          if (this.tree.byId.get(id) !== node || this.selected !== null) return;
          const again = (this.eqs.get(id) || []).filter((e) => e.name === eq.primitive)[eq.k];
          if (!again) return;
          this.selected = again.id;
          this.schedule();
          this.onSelect(again.id);
        });
      }
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

  /** Expand every call (equations load when a call is opened by hand or matched). */
  expandAll() {
    this.expanded = allExpandable(this.tree);
    this.relayout();
  }

  collapseAll() {
    this.expanded = new Set();
    this.relayout();
  }

  /** Select the next (`step` 1) or previous (-1) highlighted row and scroll to it; returns
   * its position among the visible matches as `[k, n]` (1-based), or null when none is visible. */
  stepMatch(step) {
    const i = nextIndex(this.visible, this.matchSet, this.indexOf(this.selected), step);
    if (i < 0) return null;
    this.select(this.visible[i].id, false);
    this.scrollTo(i);
    const shown = this.visible.filter((n) => this.matchSet.has(n.id));
    return [shown.indexOf(this.visible[i]) + 1, shown.length];
  }

  /** Highlight `ids` (`_matches`): expand their ancestors, load the equations of calls whose
   * equations match (`owners`: `_match_owners`), scroll to the first; then `onMatchesShown`. */
  showMatches(ids, owners) {
    const version = ++this.matchVersion;
    const { byId } = this.tree;
    this.matchSet = new Set(ids);
    this.owners = owners;
    if (this.onlyMatches) this.updateKeep();
    const calls = ids.map((id) => ownerOf(id, this.tree, owners)).filter((x) => x !== undefined);
    for (const a of ancestorsOf(calls, (i) => byId.get(i)?.parent)) this.expanded.add(a);
    const withEqs = [...new Set(ids.filter((id) => !byId.has(id)).map((id) => owners[String(id)]))]
      .filter((o) => byId.has(o));
    for (const o of withEqs) this.expanded.add(o);
    this.relayout();
    return Promise.all(withEqs.map((o) => this.loadEquations(byId.get(o)))).then(() => {
      if (version !== this.matchVersion) return;
      this.relayout();
      this.scrollTo(this.visible.findIndex((n) => this.matchSet.has(n.id)));
      // announce the highlight once it is on screen (the browser tests wait for this)
      requestAnimationFrame(() => {
        this.paint(); // the rows are in the DOM before the highlight is announced
        if (version === this.matchVersion) this.onMatchesShown(ids);
      });
    });
  }

  /** Select call `id`, opening its ancestors, and scroll to it (from the graph or the compare pane). */
  reveal(id) {
    const { byId } = this.tree;
    if (!byId.has(id)) return;
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

  /** Select a row; with `openMenu`, offer what fits it (a `fits` request). */
  async select(id, openMenu) {
    const moved = this.selected !== id;
    this.selected = id;
    this.fits = null;
    if (this.notice && this.notice.id !== id) this.notice = null; // a refusal's reason goes once the user moves on
    this.schedule();
    if (moved) this.onSelect(id);
    if (!openMenu) return;
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
    if (e.target.closest(".yax-toggle")) this.toggle(id);
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
      if (name) this.onSubstitute(Number(row.dataset.id), name);
    });
  }

  dispose() {
    if (this.frame) cancelAnimationFrame(this.frame);
    this.frame = 0;
  }
}
