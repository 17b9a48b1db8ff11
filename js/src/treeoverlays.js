// The overlays the tree view shows at a row (the fits menu, a refusal's notice): where one goes, the
// notice's element, and closing them. `overlayMethods` are TreeView's (treeview.js mixes them in):
// `this` is the view.
import { h } from "./dom.js";
import { ROW_H } from "./treerow.js";

export const overlayMethods = {
  /** Place an overlay at row `i` (at the top when -1): below it, or above it when the row is in
   * the lower half of the tree's view, so that the tree's bottom edge never cuts it off. */
  near(i, el) {
    const y = i * ROW_H - this.el.scrollTop;
    const above = i >= 0 && y > this.el.clientHeight / 2;
    el.classList.toggle("yax-above", above);
    el.style.top = `${above ? i * ROW_H : (i + 1) * ROW_H}px`;
    return el;
  },

  noticeElement() {
    const { message, action } = this.notice;
    const close = () => { this.notice = null; this.schedule(); };
    return h("div", { class: "yax-notice", role: "alert" },
      h("button", { class: "yax-close", onclick: close }, "×"),
      message,
      action ? h("div", { class: "yax-offer" }, h("button", { class: "yax-offer-apply",
        onclick: () => { close(); action.run(); } }, action.label)) : null);
  },

  /** A refusal's reason at row `id` (null: the top); `action` `{label, run()}`: a button offering what
   * the refusal allows instead (a drop on the query box that fits some of the matches: just those). */
  showNotice(id, message, action = null) {
    this.notice = { id, message, action };
    this.schedule();
  },

  /** Close the notice: the user's next action (a press or a key anywhere in the explorer but on the notice). */
  dropNotice() {
    if (!this.notice) return;
    this.notice = null;
    this.schedule(true); // the overlays only: the row being pressed keeps its element, so its click lands
  },

  /** Close a notice that offers an action: it was made for rows that are gone or a query that changed. */
  dropOffer() {
    if (!this.notice || !this.notice.action) return;
    this.notice = null;
    this.schedule();
  },

  /** Close the fits menu and the notice. */
  closeOverlays() {
    this.fits = null;
    this.notice = null;
    this.schedule();
  },
};
