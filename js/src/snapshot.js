// The explorer as a snapshot (`Explorer.save_html`, yax_widget/_snapshot.py): the page renders
// the same front-end from a read-only stand-in for the anywidget model, which serves the traits
// the kernel recorded and answers the requests it recorded (the equations of the calls, the
// selected row's values, its graph and source lines, the code) with the kernel's replies. Any other request is
// answered with a sentence saying the page is a snapshot and this needs the live kernel, and the
// controls that would send one are disabled, with that sentence as their tooltip. Also here: what
// the Save HTML button tells the kernel of the view (`viewState`), and how the page puts that view
// back (`restoreView`).
import { h } from "./dom.js";

/** What each request does, as the sentence refusing it in a snapshot says it. */
const DOES = {
  query: "run a query", expand: "list the equations of this call", fits: "say what fits this row",
  substitute: "make a change", undo: "undo a change", redo: "redo a change", goto: "go to another state of the history",
  compare_base: "compare with another state", export: "export the model", snapshot: "save another snapshot",
  equations: "list the equations of these calls", code: "write the code", graph: "draw this graph",
  values: "show the values of this row", source: "show the source lines of this row",
  details: "compute this tab for another row",
  overlay: "colour the rows by another statistic", batch: "use another batch", nonfinite: "search for NaN and Inf",
};

/** The sentence a snapshot answers with where it would need the kernel to `what`. */
export function kernelOnly(what) {
  return `This page is a snapshot saved by \`save_html\`, so it cannot ${what}: that needs the live kernel. `
    + "Run the notebook to do it.";
}

/** The kernel's controls, disabled in a snapshot: [selector, what it would do]. */
const LOCKED = [
  [".yax-query input", "run another query (the box shows the query that ran when it was saved)"],
  [".yax-undo", DOES.undo], [".yax-redo", DOES.redo], [".yax-export", DOES.export],
  [".yax-save-html", DOES.snapshot], [".yax-replace", DOES.fits],
  ["select.yax-batch", DOES.batch], ["select.yax-colour", DOES.overlay], [".yax-find-nan", DOES.nonfinite],
  ["select.yax-scalar", "take the gradient of another scalar"], [".yax-logit-index", "take the gradient of another logit"],
  [".yax-find-grad-nan", "search the gradient for NaN and Inf"],
  [".yax-compare-base", DOES.compare_base], [".yax-graph-depth", "draw the graph at another depth"],
  [".yax-palette-item", "replace a layer"], [".yax-history-item", DOES.goto],
];

/** Recorded values as the widget gets them: `{"$bytes": base64}` (how `_snapshot.py` writes a
 * binary buffer) becomes a DataView, as anywidget gives a buffer. */
export function decode(value) {
  if (Array.isArray(value)) return value.map(decode);
  if (!value || typeof value !== "object") return value;
  const keys = Object.keys(value);
  if (keys.length === 1 && keys[0] === "$bytes") {
    const raw = atob(value.$bytes);
    const bytes = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
    return new DataView(bytes.buffer);
  }
  return Object.fromEntries(keys.map((k) => [k, decode(value[k])]));
}

/** A request as a key: its fields in sorted order (without the `rid`), at every level. */
export function requestKey(request) {
  const sorted = (v) => (Array.isArray(v) ? v.map(sorted) : v && typeof v === "object"
    ? Object.fromEntries(Object.keys(v).filter((k) => k !== "rid").sort().map((k) => [k, sorted(v[k])])) : v);
  return JSON.stringify(sorted(request));
}

/**
 * The read-only stand-in for the anywidget model: `get(trait)` the recorded value, `on`/`off`
 * events, `save_changes` does nothing, `send(request)` answers (after the current task, as a
 * kernel would) with the recorded reply or with `kernelOnly`'s sentence. `emit(event)` runs
 * the listeners of an event (the page sends no trait changes but this one, to paint the colouring).
 * `data`: `{state: {trait: value}, replies: [{request, reply}]}`, as `_snapshot.py` writes it.
 */
export function snapshotModel({ state = {}, replies = [] }) {
  const traits = decode(state);
  const answers = new Map(replies.map(({ request, reply }) => [requestKey(request), decode(reply)]));
  const listeners = new Map(); // event -> Set of callbacks
  // "expand all" asks for the equations of many calls at once: answered from their recorded `expand`
  // replies when every one of them was recorded, else refused as a whole (never a call shown without them);
  // the reply names its columns as they did (one kernel wrote them all: the same `columns`)
  const several = (msg) => {
    if (msg.type !== "equations" || !Array.isArray(msg.ids)) return null;
    const each = msg.ids.map((id) => answers.get(requestKey({ type: "expand", id })));
    return each.every((r) => r && r.type === "ok")
      ? { type: "ok", columns: each.length ? each[0].columns : [], calls: msg.ids.map((id, i) => [id, each[i].rows]) }
      : null;
  };
  const emit = (event, ...args) => { for (const fn of [...(listeners.get(event) || [])]) fn(...args); };
  return {
    get: (name) => traits[name],
    on(event, fn) {
      if (!listeners.has(event)) listeners.set(event, new Set());
      listeners.get(event).add(fn);
    },
    off(event, fn) { listeners.get(event)?.delete(fn); },
    save_changes() {},
    send(msg) {
      const recorded = answers.get(requestKey(msg)) || several(msg);
      const reply = recorded ? { ...recorded, rid: msg.rid }
        : { type: "error", rid: msg.rid, message: kernelOnly(DOES[msg.type] || `answer \`${msg.type}\``) };
      setTimeout(() => emit("msg:custom", reply, []), 0);
    },
    emit,
  };
}

/** What the Save HTML button tells the kernel of the view, which Python does not hold
 * (`_snapshot.View`): the open calls, those whose equations are listed, the selection, the tab,
 * the filters, the graph's depth. */
export function viewState({ view, tabs, controls, panes }) {
  const depth = panes.Graph.querySelector(".yax-graph-depth");
  return {
    expanded: [...view.expanded].filter((id) => view.tree.byId.has(id)),
    equations: [...view.eqs].filter(([id, eqs]) => eqs.length && view.tree.byId.has(id)).map(([id]) => id),
    selected: view.selected ?? null, tab: tabs.current() || "Compare",
    filter: controls.search.value, only: controls.only.checked, fold: controls.fold ? controls.fold.checked : true,
    depth: depth ? Number(depth.value) : 1, scroll: Math.max(0, Math.round(view.el.scrollTop)),
  };
}

/** The banner saying what the page is. */
function banner({ model = "the model", version = "", saved = "", step = 0, steps = 0 }) {
  return h("div", { class: "yax-snapshot-banner", role: "note" },
    h("strong", {}, "Snapshot"), ` of ${model}, saved by yax ${version} on ${saved}`,
    steps ? ` at step ${step} of ${steps}` : "",
    ". It is read-only: it shows what the kernel computed then, and what needs the kernel is disabled.");
}

/** Disable the kernel's controls in `root`, now and as they are drawn again (the tree's
 * rows, the compare pane), each with `kernelOnly`'s sentence as its tooltip. */
function lockControls(root) {
  const lock = (el) => {
    for (const [selector, what] of LOCKED) {
      for (const x of [el, ...el.querySelectorAll(selector)]) {
        if (!x.matches?.(selector) || x.classList.contains("yax-locked")) continue;
        x.classList.add("yax-locked");
        x.title = kernelOnly(what);
        if ("disabled" in x) x.disabled = true;
        if (x.draggable) x.draggable = false;
      }
    }
  };
  lock(root);
  new MutationObserver((records) => {
    for (const r of records) for (const n of r.addedNodes) if (n.nodeType === 1) lock(n);
  }).observe(root, { childList: true, subtree: true });
  // a history item is a list item (no `disabled`): its click, which would go to that state, stops here
  root.addEventListener("click", (e) => {
    if (e.target.closest?.(".yax-locked")) { e.stopPropagation(); e.preventDefault(); }
  }, true);
}

/** Put the recorded view back once the page has rendered: the open calls, the equations listed,
 * the filters, the selection, the tab, the colouring, the scroll; then the banner, the locks and
 * `data-snapshot="ready"` on the root (the browser tests wait for it). `shown`: the query's
 * highlight, which opens the calls around the matches first. */
export async function restoreView({ model, root, view, tabs, controls, panes, shown }, v = {}, meta = {}) {
  root.classList.add("yax-snapshot");
  root.prepend(banner(meta));
  await shown;
  if (Array.isArray(v.expanded)) view.expanded = new Set(v.expanded.filter((id) => view.tree.byId.has(id)));
  const listed = (v.equations || []).map((id) => view.tree.byId.get(id)).filter(Boolean);
  await Promise.all(listed.map((node) => view.loadEquations(node)));
  controls.search.value = v.filter || "";
  controls.only.checked = !!v.only;
  view.setFilter(controls.search.value);
  view.setOnlyMatches(controls.only.checked);
  if (controls.fold && v.fold === false && view.setFolding) { // "fold repeats" unticked when it was saved
    controls.fold.checked = false;
    view.setFolding(false);
  }
  const depth = panes.Graph.querySelector(".yax-graph-depth");
  if (depth && v.depth !== undefined) depth.value = String(v.depth);
  const overlay = model.get("_overlay") || {};
  const colour = root.querySelector("select.yax-colour");
  if (overlay.stat && colour) {
    colour.value = overlay.stat;
    const scalar = root.querySelector("select.yax-scalar");
    const index = root.querySelector(".yax-logit-index");
    if (overlay.scalar && scalar && index) { // the scalar a gradient colouring took, as chosen then
      scalar.value = overlay.scalar.name;
      index.value = overlay.scalar.index ?? "";
      index.hidden = overlay.scalar.name !== "logit";
    }
    model.emit("change:_overlay"); // painted as when the kernel sent it
  }
  if (v.selected !== null && v.selected !== undefined) view.select(v.selected, false);
  if (v.tab) tabs.show(v.tab);
  lockControls(root);
  requestAnimationFrame(() => {
    view.el.scrollTop = v.scroll || 0;
    view.paint();
    root.dataset.snapshot = "ready";
  });
}
