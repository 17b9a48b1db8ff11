// What the user does to the tree view with the pointer and the keyboard: clicks on rows and their
// buttons, keyboard navigation, palette items dropped onto rows. `inputMethods` are TreeView's
// (treeview.js mixes them in): `this` is the view.

export const inputMethods = {
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
  },

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
  },

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
  },

  /** A palette item dropped on row `id`: substituted, unless the row stands for several calls. */
  drop(id, name) {
    if (this.foldsOf(id).length) this.refuseFolded(id, false);
    else this.onSubstitute(id, name);
  },
};
