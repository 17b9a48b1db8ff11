// The tree view across a new model (a rewrite, an undo, a redo): the selected row and the open calls'
// equations found again by kind and path, and the selected row kept where it was on screen.
// `followingMethods` are TreeView's (treeview.js mixes them in): `this` is the view.
import { ROW_H } from "./treerow.js";

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

export const followingMethods = {
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
  },

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
  },
};
