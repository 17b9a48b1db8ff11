// Where the keys typed in the explorer go: to the explorer alone (never to the notebook's shortcuts),
// Ctrl+Z / Ctrl+Shift+Z / Ctrl+Y to its undo and redo buttons.

/** Keys typed in the explorer stay in it. JupyterLab and Notebook 7 run their command-mode shortcuts
 * (`d d` deletes the cell, `m` makes it markdown, `a`/`b` insert cells) from keys that reach the page,
 * some listening before the key reaches its target (Notebook 7 on the document, capturing). So the
 * explorer takes its keys first, on the window as they start out: none goes further, and `onKey` handles
 * it as the explorer's own listeners would (the key's default action, typing in a field, still happens).
 * `data-lm-suppress-shortcuts` tells Lumino's command registry the same. Ctrl+Z / Ctrl+Shift+Z (⌘ on
 * macOS), and Ctrl+Y, undo and redo the explorer's changes, except in a text field, where they edit the
 * text. Returns the function that stops listening. */
export function keepKeys(root, { undo, redo }, onKey = () => {}) {
  root.setAttribute("data-lm-suppress-shortcuts", "true");
  const typing = (t) => typeof t?.closest === "function" && t.closest("input, textarea, select, [contenteditable]") !== null;
  const take = (e) => {
    if (!(e.target instanceof e.target.ownerDocument.defaultView.Node) || !root.contains(e.target)) return;
    e.stopPropagation();
    if (e.type !== "keydown") return;
    onKey(e);
    const mod = e.ctrlKey || e.metaKey;
    if (e.defaultPrevented || !mod || e.altKey || typing(e.target)) return;
    const k = e.key.toLowerCase();
    const button = k === "z" ? (e.shiftKey ? redo : undo) : k === "y" && !e.shiftKey ? redo : null;
    if (!button) return;
    e.preventDefault(); // the browser's own undo, or the notebook's undo of a cell operation
    if (!button.disabled) button.click();
  };
  const win = root.ownerDocument.defaultView;
  const types = ["keydown", "keyup", "keypress"];
  for (const type of types) win.addEventListener(type, take, true);
  return () => { for (const type of types) win.removeEventListener(type, take, true); };
}
