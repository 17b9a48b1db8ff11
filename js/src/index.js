// The yax explorer's front-end (anywidget): `render` builds the parts and connects them to
// the model. State comes from traits; requests go to Python as custom messages with a `rid`
// (requests.js). docs/widget.md has the protocol and the layout of these modules.
import { h } from "./dom.js";
import { keepKeys } from "./keys.js";
import { showCode } from "./panes/code.js";
import { renderCompare } from "./panes/compare.js";
import { renderDiff } from "./panes/diff.js";
import { createGraphPane } from "./panes/graph.js";
import { renderHistory } from "./panes/history.js";
import { createDetailsPane } from "./panes/details.js";
import { createSourcePane } from "./panes/source.js";
import { paletteItems } from "./panes/palette.js";
import { createTabs } from "./panes/tabs.js";
import { createValues } from "./panes/values.js";
import { layout, sidePanes, toolbarButtons, treeControls } from "./parts.js";
import { createQueryBox, partialOffer } from "./querybox.js";
import { createRequests, DEFAULT_TIMEOUT_MS } from "./requests.js";
import { restoreView, snapshotModel, viewState } from "./snapshot.js";
import { createStatus } from "./status.js";
import { buildTree, pathOf } from "./tree.js";
import { TreeView } from "./treeview.js";

// Python replies to a change (substitute, undo, redo) once the changed model is compiled,
// run and compared: those requests may take this many times longer.
const CHANGE_TIMEOUT_FACTOR = 10;

export { keepKeys }; // keys.js: still exported here, so the bundle exports what it did

function connectControls({ controls: c, view }) {
  c.search.addEventListener("input", () => view.setFilter(c.search.value));
  const step = (k) => {
    const at = view.stepMatch(k);
    c.at.textContent = at ? `${at[0]} of ${at[1]}` : "";
  };
  c.prev.addEventListener("click", () => step(-1));
  c.next.addEventListener("click", () => step(1));
  c.only.addEventListener("change", () => view.setOnlyMatches(c.only.checked));
  c.fold.addEventListener("change", () => view.setFolding(c.fold.checked));
  c.expand.addEventListener("click", () => view.expandAll());
  c.collapse.addEventListener("click", () => view.collapseAll());
  // keys reach the tree through `keepKeys`: F3 steps through the matches, the others move in the tree
  return (e) => {
    if (!view.el.contains(e.target)) return;
    if (e.key === "F3") {
      e.preventDefault();
      step(e.shiftKey ? -1 : 1);
    } else view.onKey(e);
  };
}

/** The selected call's id, or null (the whole model) when none or an equation is selected. */
function selectedCall(view) {
  return view.selected !== null && view.tree.byId.has(view.selected) ? view.selected : null;
}

function connectButtons({ buttons, request, failed, change, tabs, panes, view, code, graph, controls }) {
  buttons.undo.addEventListener("click", () => request("undo", {}, change).catch(failed));
  buttons.redo.addEventListener("click", () => request("redo", {}, change).catch(failed));
  buttons.copy.addEventListener("click", async () => {
    try {
      const reply = await request("code");
      code.shown = true; // before the tab shows: it would fetch the script again, without the copy
      tabs.show("Code");
      await showCode(panes.Code, reply.code, { copy: true });
    } catch (err) {
      failed(err);
    }
  });
  buttons.export.addEventListener("click", () => request("export", {}, change).catch(failed)); // _status says where
  // the view is the front-end's own state: the snapshot needs it to show the rows as they are
  buttons.save.addEventListener("click", () => request("snapshot", { view: viewState({ view, tabs, controls, panes }) },
    change).catch(failed));
  buttons.graph.addEventListener("click", () => {
    if (tabs.current() === "Graph") graph.show(selectedCall(view)); // drawn again on demand
    else tabs.show("Graph"); // which draws the selected call
  });
}

/** What each trait's change updates: {trait: handler}. */
function traitHandlers({ model, view, query, status, panes, buttons, palette, root, controls, refreshCode, graph, tabs,
  values, rowPanes, request, failed, change }) {
  const matches = () => {
    controls.at.textContent = "";
    return view.showMatches(model.get("_matches") || [], model.get("_match_owners") || {});
  };
  const compare = () => {
    const color = getComputedStyle(root).getPropertyValue("--yax-accent") || "#1976d2";
    const { items = [], index = 0 } = model.get("_history") || {};
    renderCompare(panes.Compare, model.get("_comparison") || {},
      { color, busy: status.busy(), undone: items.length > 0 && index === 0,
        pathOf: (id) => pathOf(view.tree, id), onPick: (id) => view.reveal(id),
        base: model.get("_compare_base") || "original", references: model.get("_references") || [],
        onBase: (base) => request("compare_base", { base }, change).catch(failed) });
  };
  const diff = () => {
    const original = buildTree(view.readTree(model.get("_original_tree")));
    renderDiff(panes.Diff, original, view.tree, model.get("_diff") || {});
    view.schedule(); // the rows' marks
    graph.redraw();
  };
  return {
    _tree: () => {
      view.setRows(model.get("_tree"), controls.search.value); // keeps the selection where its row is
      matches();
      diff();
      if (tabs.current() === "Graph") graph.show(selectedCall(view)); // by the new model's ids
      for (const pane of Object.values(rowPanes)) pane.reset(); // ids change with the model: asked again
      rowPanes[tabs.current()]?.show(view.selected);
      values.rowsChanged();
    },
    _matches: matches,
    _match_owners: matches,
    _query: () => {
      query.syncText();
      view.dropOffer(); // an offer for the matches of the query before
    },
    _query_error: query.syncError,
    _query_result: query.syncResult,
    _palette: () => palette.replaceChildren(...paletteItems(model.get("_palette") || [])),
    _history: () => {
      const history = model.get("_history") || {};
      const { items = [], index = 0 } = history;
      buttons.undo.disabled = index === 0;
      buttons.redo.disabled = index >= items.length;
      renderHistory(panes.History, history, (index) => request("goto", { index }, change).catch(failed));
      compare();
      refreshCode();
    },
    _status: () => {
      status.update();
      root.classList.toggle("yax-busy", status.busy());
      compare(); // "compiling…" while a change is compared
    },
    _diff: diff,
    _batches: () => view.schedule(), // the top row shows the inputs of the batch in use
    _compare_base: compare,
    _references: compare,
    _comparison: () => {
      compare();
      view.relayout(); // the rows' divergence colours
      graph.redraw();
    },
  };
}

/** anywidget's entry point. `timeoutMs`: how long a request waits for its reply; `snapshot`: the
 * page `Explorer.save_html` wrote (`{view, meta}`), whose view is put back (snapshot.js). */
export function render({ model, el, timeoutMs = DEFAULT_TIMEOUT_MS, snapshot = null }) {
  const t0 = performance.now();
  const off = [];
  const on = (name, fn) => { model.on(name, fn); off.push(() => model.off(name, fn)); };

  // every request's failure is shown: in the status area unless it has a place of its own
  const requests = createRequests(model, { timeoutMs });
  const status = createStatus(model);
  const failed = (err) => status.fail(err);
  const request = async (type, payload, options) => {
    const reply = await requests.request(type, payload, options);
    status.ok();
    return reply;
  };
  const change = { timeoutMs: timeoutMs * CHANGE_TIMEOUT_FACTOR };

  // the built-in panes, then one a row data provider (Python's `_panes`: yax_widget/_providers.py)
  const providers = model.get("_panes") || [];
  const panes = sidePanes(providers);
  const code = { shown: false, version: 0 }; // has the code pane been filled; its latest request
  // the code pane, once shown, follows the history (undo, redo, a new change): never a stale script
  const refreshCode = async () => {
    if (!code.shown) return;
    const version = ++code.version;
    try {
      const reply = await request("code");
      if (version === code.version) await showCode(panes.Code, reply.code, { copy: false });
    } catch (err) {
      panes.Code.replaceChildren(h("div", { class: "yax-error" }, err.message));
    }
  };
  // no tab is blank: the graph and the code fill themselves when their tab is shown
  const onShow = (title) => {
    if (title === "Graph" && (graph.current() !== selectedCall(view) || !panes.Graph.querySelector("svg"))) {
      graph.show(selectedCall(view));
    }
    if (title === "Values") values.shown();
    rowPanes[title]?.show(view.selected);
    if (title === "Code" && !code.shown) {
      code.shown = true;
      refreshCode();
    }
  };
  const tabs = createTabs(panes, onShow);
  const view = new TreeView({ model, request, onFailure: failed, onSubstitute: substitute,
    onMatchesShown: (ids) => { root.dataset.matchIds = ids.join(","); },
    onSelect: () => {
      if (tabs.current() === "Graph") graph.show(selectedCall(view));
      rowPanes[tabs.current()]?.show(view.selected);
      values.select(view.selected);
    } });
  const look = () => {
    const c = model.get("_comparison") || {};
    return { boundaries: c.boundaries || {}, firstDivergence: c.first_divergence_id,
      marks: (model.get("_diff") || {}).current || {} };
  };
  const graph = createGraphPane({ el: panes.Graph, request, look,
    onPick: (id) => view.reveal(id) });
  // the panes that show what the kernel says of the selected row, by tab title
  const rowPanes = { Source: createSourcePane({ el: panes.Source, request }),
    ...Object.fromEntries(providers.map((provider) => [provider, createDetailsPane({ el: panes[provider], request, provider })])) };
  const query = createQueryBox({ model, request, onFailure: failed, onDrop: (name) => substitute("query", name) });
  const controls = treeControls();
  const buttons = toolbarButtons();
  const palette = h("div", { class: "yax-palette" });
  const root = layout({ query, controls, buttons, status, view, palette, tabs, panes });
  el.append(root);
  const values = createValues({ model, request, view, tabs, pane: panes.Values, failed, on, change,
    color: () => getComputedStyle(root).getPropertyValue("--yax-accent") || "#1976d2" });
  view.el.before(values.bar);

  /** A drop (or a pick in the fits menu) of `name` on row `target` or on the query box ("query");
   * `ids`: on the query box, only those matches (the offer of a drop that fits some of them). */
  async function substitute(target, name, ids = null) {
    view.closeOverlays();
    const before = tabs.current();
    try {
      // a drop on the query box names the text it shows: Python refuses it unless that query ran
      const payload = target === "query" ? { target, name, xpath: query.input.value, ...(ids ? { ids } : {}) }
        : { target, name };
      await request("substitute", payload, change);
      if (tabs.current() === before) tabs.show("Compare"); // unless the user moved to another tab meanwhile
    } catch (err) {
      if (err.timedOut) return failed(err);
      // a refusal: at its row; on the query box, fitting some of the matches, it offers to replace just those
      const offer = target === "query" && !ids ? partialOffer(err.reply) : null;
      view.showNotice(typeof target === "number" ? target : null, err.message,
        offer && { label: offer.label, run: () => substitute("query", name, offer.ids) });
    }
  }

  // a refusal's notice goes at the user's next action, wherever it is (its own buttons aside)
  const next = (e) => { if (!e.target.closest?.(".yax-notice")) view.dropNotice(); };
  for (const type of ["pointerdown", "dragstart"]) root.addEventListener(type, next, true);
  const treeKeys = connectControls({ controls, view });
  off.push(keepKeys(root, buttons, (e) => {
    next(e);
    treeKeys(e);
  }));
  connectButtons({ buttons, request, failed, change, tabs, panes, view, code, graph, controls });
  const sync = traitHandlers({ model, view, query, status, tabs, panes, buttons, palette, root, controls, refreshCode, graph,
    values, rowPanes, request, failed, change });
  for (const [trait, f] of Object.entries(sync)) on(`change:${trait}`, f);
  on("change:_overlay", () => { // a colouring by compiled cost compiled the model: the tabs may say more
    for (const p of providers) rowPanes[p].reset();
    rowPanes[tabs.current()]?.show(view.selected);
  });

  view.setRows(model.get("_tree"), "");
  for (const t of ["_palette", "_history", "_status", "_query", "_query_error", "_comparison", "_diff"]) sync[t]();
  tabs.show("Compare");
  const shown = sync._matches();
  if (snapshot) restoreView({ model, root, view, tabs, controls, panes, shown }, snapshot.view, snapshot.meta);
  view.paint();
  // first paint done: the browser tests and the bench wait for this
  requestAnimationFrame(() => {
    root.dataset.ready = "1";
    root.dataset.paintMs = String(Math.round(performance.now() - t0));
  });

  return () => {
    for (const f of off) f();
    requests.dispose();
    query.dispose();
    view.dispose();
    graph.dispose(); // its layout worker
  };
}

/** The page `Explorer.save_html` wrote: `data` holds the recorded traits and replies, the view and
 * what the banner says (yax_widget/_snapshot.py). */
export function renderSnapshot({ el, data }) {
  return render({ model: snapshotModel(data), el, snapshot: data });
}

export default { render };
