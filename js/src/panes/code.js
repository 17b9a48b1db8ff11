// The code pane: the `yax.sub` calls reproducing the current model, also put on the clipboard.
import { h } from "../dom.js";

export async function showCode(pane, code) {
  pane.replaceChildren(h("pre", { class: "yax-code" }, code));
  try {
    await navigator.clipboard?.writeText(code);
  } catch {
    // the clipboard needs permission; the code is shown either way
  }
}
