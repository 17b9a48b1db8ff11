// Folding in the tree view: runs of calls alike shown as one ×N row, unfolded by its button or where a
// selection or a match needs a call shown as itself, and a drop or a pick refused on a row standing for
// several calls. `foldingMethods` are TreeView's (treeview.js mixes them in): `this` is the view.
import { foldsAround, ownerOf } from "./tree.js";

export const foldingMethods = {
  /** What `layout` folds: null when folding is off, else the runs the user unfolded. */
  folds() {
    return this.folding ? { open: this.openRuns } : null;
  },

  /** Fold runs of calls alike into one row each (`on`, the default), or show every call on its own row.
   * Folding again folds every run, but those hiding the selected row. */
  setFolding(on) {
    this.folding = on;
    this.openRuns = new Set();
    if (on && this.selected !== null) this.unhide(this.selected);
    this.relayout();
  },

  /** Unfold the run whose first member's path is `path` (its ×N button). */
  unfold(path) {
    this.openRuns.add(path);
    this.relayout();
  },

  /** The call row `id` belongs to: itself, or the call running equation `id`. */
  callOf(id) {
    const own = ownerOf(id, this.tree, this.owners);
    if (own !== undefined) return own;
    for (const [owner, nodes] of this.eqs) if (nodes.some((e) => e.id === id)) return owner;
    return undefined;
  },

  /** The folded runs row `id` is in (`foldsAround`): none when it is shown as itself. */
  foldsOf(id) {
    const call = this.callOf(id);
    return call === undefined ? [] : foldsAround(this.tree, call, this.eqs, this.folds());
  },

  /** Unfold the runs that hide row `id` (a later member of a folded run, or inside one); with `all`, also
   * those whose row stands for it and others, so that it is shown as itself. Returns whether any unfolded. */
  unhide(id, all = false) {
    const runs = this.foldsOf(id).filter((f) => all || f.k > 0);
    for (const { run } of runs) this.openRuns.add(run.path);
    if (runs.length) this.relayout();
    return runs.length > 0;
  },

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
  },
};
