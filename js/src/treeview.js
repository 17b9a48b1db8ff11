// The tree view: the rows of the current model (virtualised: only the rows in sight are in
// the DOM), the query's highlight, equations loaded on demand, and the selection. Its other
// concerns are methods in modules of their own, mixed into `TreeView` below: one row's element
// (treerow.js), folding (treefold.js), following the rows across a new model (treefollow.js),
// clicks, keys and palette drops (treeinput.js), the fits menu and refusal notice at their rows
// (treeoverlays.js).
import { h } from "./dom.js";
import { fitsMenu } from "./panes/palette.js";
import { treeRecords } from "./rows.js";
import {
  allExpandable, ancestorsOf, bothKept, buildTree, equationNodes, expandable, expandedByPath, filterKeep,
  initialExpanded, layout, matchKeep, nextIndex, ownerOf, pathOf, shownAs,
} from "./tree.js";
import { foldingMethods } from "./treefold.js";
import { followingMethods } from "./treefollow.js";
import { inputMethods } from "./treeinput.js";
import { overlayMethods } from "./treeoverlays.js";
import { ROW_H, rowElement } from "./treerow.js";

const OVERSCAN = 10;

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
    this.unreadable = "";      // why the `_tree` rows could not be read (rows.js), or ""
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
    if (!visible.length && this.unreadable) out.push(h("div", { class: "yax-empty yax-error" }, this.unreadable));
    else if (!visible.length && this.keep) {
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

  /** The call records of a `_tree`-like trait value (rows.js). One rows.js refuses (no `columns`)
   * reads as no rows, its sentence shown as a failure and given to `why`. */
  readTree(trait, why = () => {}) {
    try {
      return treeRecords(trait);
    } catch (err) {
      this.onFailure(err);
      why(err.message);
      return [];
    }
  }

  /** New rows (the `_tree` trait's value): what was expanded stays expanded, and the selected row
   * selected, where the rows still exist (an undo, a redo, a change elsewhere: `sameRow`). */
  setRows(trait, filterText) {
    const prev = this.tree;
    const prevEqs = this.eqs;
    const was = this.selected;
    // where the selected row is on screen: an undo or a redo keeps it there (its equations come back later)
    const i = was === null ? -1 : this.indexOf(was);
    const at = i >= 0 ? i * ROW_H - this.el.scrollTop : null;
    this.unreadable = "";
    this.tree = buildTree(this.readTree(trait, (why) => { this.unreadable = why; }));
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

  collapseAll() {
    this.expanded = new Set();
    this.relayout();
  }

  // -- the query's matches -------------------------------------------------------------------

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
        if (current()) this.eqs.set(node.id, equationNodes(node, reply, reply.rows));
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
        for (const n of todo) this.eqs.set(n.id, equationNodes(n, reply, rows.get(n.id) || []));
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

  dispose() {
    if (this.frame) cancelAnimationFrame(this.frame);
    this.frame = 0;
  }
}

// the view's concerns kept in modules of their own: their methods are the view's
Object.assign(TreeView.prototype, foldingMethods, followingMethods, inputMethods, overlayMethods);
