// The palette of replacements (`_palette`, dragged onto rows or the query box) and the menu of
// those that fit a node (a `fits` reply, offered at its row).
import { h } from "../dom.js";

/** The palette's items, draggable (the drag carries the item's name as text/plain). */
export function paletteItems(items) {
  return items.map((item) => {
    const div = h("div", {
      class: `yax-palette-item yax-kind-${item.kind}`, draggable: "true", dataset: { name: item.name },
      title: item.doc || item.kind,
    }, item.name);
    div.addEventListener("dragstart", (e) => {
      e.dataTransfer.setData("text/plain", item.name);
      e.dataTransfer.effectAllowed = "copy";
    });
    return div;
  });
}

/** The menu for a `fits` reply: a button per fitting name (`onPick(name)`), the refused ones
 * disabled with their reason as the tooltip, and a close button (`onClose()`). */
export function fitsMenu({ fits, refused }, { onPick, onClose }) {
  const stop = (f) => (e) => { e.stopPropagation(); f(); };
  return h("div", { class: "yax-fits" },
    h("div", { class: "yax-fits-title" }, fits.length ? "Replace with:" : "Nothing registered fits this node:"),
    fits.map((name) => h("button", { class: "yax-fit", dataset: { name }, onclick: stop(() => onPick(name)) }, name)),
    Object.entries(refused).map(([name, why]) => h("button", {
      class: "yax-fit yax-refused", dataset: { name }, disabled: true, title: why,
    }, name)),
    h("button", { class: "yax-close", onclick: stop(onClose) }, "×"));
}
