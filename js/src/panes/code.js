// The code pane: the script reproducing the current model; "Copy as code" also puts it on the
// clipboard and says whether that worked.
import { h } from "../dom.js";

/** Show `code` in `pane`; with `copy`, put it on the clipboard and confirm (or say why not). */
export async function showCode(pane, code, { copy = false } = {}) {
  const note = h("div", { class: "yax-hint yax-copied" });
  pane.replaceChildren(note, h("pre", { class: "yax-code" }, code));
  if (!copy) {
    note.textContent = "The script reproducing the current model (Copy as code puts it on the clipboard).";
    return;
  }
  try {
    if (!navigator.clipboard) throw new Error("no clipboard in this page");
    await navigator.clipboard.writeText(code);
    note.textContent = "✓ Copied to the clipboard: paste it into a cell.";
  } catch {
    note.textContent = "The clipboard is not available here (it needs permission): select the code below and copy it.";
  }
}
