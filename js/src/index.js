// The yax explorer's front-end (anywidget). State comes from traits; requests
// go to Python as custom messages with a `rid` (see docs/widget.md).
import { instance as vizInstance } from "@viz-js/viz";
import {
  ancestorsOf, buildTree, equationNodes, expandable, filterKeep, initialExpanded, visibleRows,
} from "./tree.js";
import {
  compact, divergenceColor, divergenceLevel, extent, floats, histogramBars, num, ramp,
} from "./format.js";

const ROW_H = 22;
const OVERSCAN = 10;
const DEBOUNCE_MS = 40;

let vizPromise = null;
const viz = () => (vizPromise ??= vizInstance());

function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "style") Object.assign(el.style, v);
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined && c !== false) el.append(c);
  return el;
}

function render({ model, el }) {
  const t0 = performance.now();
  const off = [];
  const on = (name, fn) => { model.on(name, fn); off.push(() => model.off(name, fn)); };

  // -- requests ------------------------------------------------------------------
  let rid = 0;
  const pending = new Map();
  const request = (content) => new Promise((resolve) => {
    rid += 1;
    pending.set(rid, resolve);
    model.send({ ...content, rid });
  });
  on("msg:custom", (msg) => {
    if (!msg || typeof msg.rid !== "number") return;
    const resolve = pending.get(msg.rid);
    if (resolve) { pending.delete(msg.rid); resolve(msg); }
  });

  // -- view state -----------------------------------------------------------------
  let tree = buildTree(model.get("_tree").rows || []);
  let expanded = initialExpanded(tree);
  let eqs = new Map();      // call id -> equation nodes
  let keep = null;          // name filter
  let selected = null;      // selected row id
  let fits = null;          // {id, fits, refused}
  let notice = null;        // {id, message}
  let visible = [];
  let matchSet = new Set();
  let dragOver = null;

  // -- layout -----------------------------------------------------------------------
  const input = h("input", { type: "text", placeholder: "XPath, e.g. //module_call[@type=\"Dense\"]",
    spellcheck: "false", "aria-label": "XPath query" });
  const count = h("span", { class: "yax-count" });
  const qerr = h("div", { class: "yax-query-error", role: "alert" });
  const query = h("div", { class: "yax-query" }, h("div", { class: "yax-query-row" }, input, count), qerr);
  const search = h("input", { type: "search", placeholder: "filter by name", "aria-label": "filter rows" });
  const undoB = h("button", { class: "yax-undo", title: "Undo the last change" }, "↶ Undo");
  const redoB = h("button", { class: "yax-redo", title: "Redo" }, "↷ Redo");
  const copyB = h("button", { class: "yax-copy", title: "The yax.sub calls reproducing this model" }, "Copy as code");
  const graphB = h("button", { class: "yax-graph-button", title: "Graph of the selected module (or the model)" }, "Graph");
  const status = h("span", { class: "yax-status" });
  const toolbar = h("div", { class: "yax-toolbar" }, query, h("div", { class: "yax-search" }, search),
    undoB, redoB, copyB, graphB, status);

  const spacer = h("div", { class: "yax-spacer" });
  const treeEl = h("div", { class: "yax-tree", tabindex: "0", role: "tree", "aria-label": "module tree" }, spacer);
  const legend = h("div", { class: "yax-legend" },
    h("span", {}, "divergence at module outputs:"),
    ...[0, 0.25, 0.5, 0.75, 1].map((l) => h("span", { class: "yax-swatch", style: { background: divergenceColor(l) },
      title: `relative error 1e${Math.round(-7 + 7 * l)}` })),
    h("span", {}, "1e-7 … 1"));

  const palette = h("div", { class: "yax-palette" });
  const tabs = ["Compare", "Diff", "History", "Graph", "Code"];
  const panes = {
    Compare: h("div", { class: "yax-compare" }),
    Diff: h("div", { class: "yax-diff" }),
    History: h("div", { class: "yax-history-pane" }),
    Graph: h("div", { class: "yax-graph" }),
    Code: h("div", { class: "yax-code-pane" }),
  };
  let tab = "Compare";
  const tabBar = h("div", { class: "yax-tabs", role: "tablist" },
    tabs.map((t) => h("button", { class: "yax-tab", dataset: { tab: t }, role: "tab", onclick: () => showTab(t) }, t)));
  const side = h("div", { class: "yax-side" },
    h("div", { class: "yax-section-title" }, "Replacements — drag onto a layer or the query box"),
    palette, tabBar, ...Object.values(panes));
  const root = h("div", { class: "yax-explorer" }, toolbar,
    h("div", { class: "yax-main" }, h("div", { class: "yax-left" }, treeEl, legend), side));
  el.append(root);

  function showTab(t) {
    tab = t;
    for (const b of tabBar.children) b.classList.toggle("yax-active", b.dataset.tab === t);
    for (const [k, p] of Object.entries(panes)) p.style.display = k === t ? "" : "none";
  }

  // -- the tree -----------------------------------------------------------------------
  const boundaries = () => (model.get("_comparison") || {}).boundaries || {};
  const marks = () => (model.get("_diff") || {}).current || {};

  function rowEl(node, i) {
    const b = boundaries()[String(node.id)];
    const level = b ? divergenceLevel(b.rel) : null;
    const mark = marks()[String(node.id)];
    const first = (model.get("_comparison") || {}).first_divergence_id === node.id;
    const cls = ["yax-row", node.eq ? "yax-eq" : `yax-${node.kind}`,
      matchSet.has(node.id) && "yax-match", selected === node.id && "yax-selected",
      mark && `yax-${mark}`, dragOver === node.id && "yax-dropping"].filter(Boolean).join(" ");
    const toggle = expandable(node)
      ? h("span", { class: "yax-toggle", role: "button", "aria-label": "expand" }, expanded.has(node.id) ? "▾" : "▸")
      : h("span", { class: "yax-toggle yax-leaf" }, "");
    const title = [node.type && node.fields ? `${node.type}(${node.fields})` : node.fields,
      b && `relative error ${num(b.rel)}, max |Δ| ${num(b.max_abs)}`].filter(Boolean).join("\n") || undefined;
    return h("div", {
      class: cls, dataset: { id: String(node.id) }, role: "treeitem", title,
      style: { top: `${i * ROW_H}px`, paddingLeft: `${6 + node.depth * 14}px`,
        borderLeftColor: level === null ? "transparent" : divergenceColor(level) },
    },
    toggle,
    h("span", { class: "yax-name" }, node.name),
    node.type && node.type !== node.name ? h("span", { class: "yax-type" }, node.type) : null,
    node.attrs ? h("span", { class: "yax-attrs" }, node.attrs) : null,
    h("span", { class: "yax-shapes" }, `${node.ins} → ${node.outs}`),
    node.params ? h("span", { class: "yax-params" }, compact(node.params)) : null,
    first ? h("span", { class: "yax-first", title: "outputs start to differ here" }, "◆ first divergence") : null);
  }

  let frame = 0;
  function paint() {
    frame = 0;
    spacer.style.height = `${visible.length * ROW_H}px`;
    const top = treeEl.scrollTop;
    const from = Math.max(0, Math.floor(top / ROW_H) - OVERSCAN);
    const to = Math.min(visible.length, Math.ceil((top + treeEl.clientHeight) / ROW_H) + OVERSCAN);
    const out = [];
    for (let i = from; i < to; i++) out.push(rowEl(visible[i], i));
    const at = (id) => visible.findIndex((n) => n.id === id);
    if (fits) {
      const i = at(fits.id);
      if (i >= 0) out.push(fitsMenu(i));
    }
    if (notice) {
      const i = notice.id === null || notice.id === undefined ? -1 : at(notice.id);
      out.push(h("div", { class: "yax-notice", role: "alert", style: { top: `${(i + 1) * ROW_H}px` } },
        h("button", { class: "yax-close", onclick: () => { notice = null; schedule(); } }, "×"), notice.message));
    }
    spacer.replaceChildren(...out);
  }
  const schedule = () => { if (!frame) frame = requestAnimationFrame(paint); };

  function relayout() {
    visible = visibleRows(tree, expanded, eqs, keep);
    schedule();
  }

  function fitsMenu(i) {
    const items = fits.fits.map((name) => h("button", {
      class: "yax-fit", dataset: { name },
      onclick: (e) => { e.stopPropagation(); substitute(fits.id, name); },
    }, name));
    const refused = Object.entries(fits.refused).map(([name, why]) => h("button", {
      class: "yax-fit yax-refused", dataset: { name }, disabled: true, title: why,
    }, name));
    return h("div", { class: "yax-fits", style: { top: `${(i + 1) * ROW_H}px` } },
      h("div", { class: "yax-fits-title" }, fits.fits.length ? "Replace with:" : "Nothing registered fits this node:"),
      items, refused,
      h("button", { class: "yax-close", onclick: (e) => { e.stopPropagation(); fits = null; schedule(); } }, "×"));
  }

  async function toggle(id) {
    const node = tree.byId.get(id);
    if (!node || !expandable(node)) return;
    if (expanded.has(id)) expanded.delete(id);
    else {
      expanded.add(id);
      await loadEquations(node);
    }
    relayout();
  }

  async function loadEquations(node) {
    if (node.neq > 0 && !eqs.has(node.id)) {
      eqs.set(node.id, []);
      const reply = await request({ type: "expand", id: node.id });
      if (reply.type === "ok" && tree.byId.get(node.id) === node) eqs.set(node.id, equationNodes(node, reply.rows));
      else eqs.delete(node.id);
    }
  }

  async function select(id, openMenu) {
    selected = id;
    fits = null;
    if (notice && notice.id !== id) notice = null; // a refusal's reason goes once the user moves on
    schedule();
    if (!openMenu) return;
    const reply = await request({ type: "fits", id });
    if (reply.type === "ok" && selected === id) {
      fits = { id, fits: reply.fits, refused: reply.refused };
      schedule();
    }
  }

  async function substitute(target, name) {
    fits = null;
    notice = null;
    schedule();
    const before = tab;
    const reply = await request({ type: "substitute", target, name });
    if (reply.type === "error") {
      notice = { id: typeof target === "number" ? target : null, message: reply.message };
      schedule();
    } else if (tab === before) {
      showTab("Compare"); // unless the user moved to another tab meanwhile
    }
  }

  treeEl.addEventListener("scroll", schedule);
  treeEl.addEventListener("click", (e) => {
    const row = e.target.closest(".yax-row");
    if (!row) return;
    const id = Number(row.dataset.id);
    if (e.target.closest(".yax-toggle")) toggle(id);
    else select(id, true);
  });
  treeEl.addEventListener("keydown", (e) => {
    if (!visible.length) return;
    let i = visible.findIndex((n) => n.id === selected);
    const node = visible[i];
    if (e.key === "ArrowDown" || e.key === "ArrowUp") {
      i = Math.min(visible.length - 1, Math.max(0, i + (e.key === "ArrowDown" ? 1 : -1)));
      select(visible[i].id, false);
      scrollTo(i);
    } else if (e.key === "ArrowRight" && node && !expanded.has(node.id)) {
      toggle(node.id);
    } else if (e.key === "ArrowLeft" && node) {
      if (expanded.has(node.id)) toggle(node.id);
      else if (node.parent >= 0) { select(node.parent, false); scrollTo(visible.findIndex((n) => n.id === node.parent)); }
    } else if (e.key === "Enter" && node) {
      select(node.id, true);
    } else if (e.key === "Escape") {
      fits = null; notice = null; schedule();
    } else return;
    e.preventDefault();
  });
  function scrollTo(i) {
    if (i < 0) return;
    const y = i * ROW_H;
    if (y < treeEl.scrollTop || y + ROW_H > treeEl.scrollTop + treeEl.clientHeight) {
      treeEl.scrollTop = Math.max(0, y - treeEl.clientHeight / 3);
    }
    schedule();
  }

  // drag and drop: palette items onto rows or the query box
  const dropTarget = (e) => e.target.closest(".yax-row:not(.yax-eq), .yax-row.yax-eq");
  // The drop-target highlight is set on the row element itself: repainting
  // the rows under the pointer in the middle of a drag would detach its target.
  const markDrop = (id) => {
    dragOver = id;
    for (const r of spacer.querySelectorAll(".yax-dropping")) r.classList.remove("yax-dropping");
    if (id !== null) spacer.querySelector(`.yax-row[data-id="${id}"]`)?.classList.add("yax-dropping");
  };
  treeEl.addEventListener("dragover", (e) => {
    const row = dropTarget(e);
    if (!row) return;
    e.preventDefault();
    e.dataTransfer.dropEffect = "copy";
    const id = Number(row.dataset.id);
    if (dragOver !== id) markDrop(id);
  });
  treeEl.addEventListener("dragleave", (e) => {
    if (!treeEl.contains(e.relatedTarget)) markDrop(null);
  });
  treeEl.addEventListener("drop", (e) => {
    const row = dropTarget(e);
    markDrop(null);
    if (!row) return;
    e.preventDefault();
    const name = e.dataTransfer.getData("text/plain");
    if (name) substitute(Number(row.dataset.id), name);
  });
  query.addEventListener("dragover", (e) => { e.preventDefault(); query.classList.add("yax-dropping"); });
  query.addEventListener("dragleave", () => query.classList.remove("yax-dropping"));
  query.addEventListener("drop", (e) => {
    e.preventDefault();
    query.classList.remove("yax-dropping");
    const name = e.dataTransfer.getData("text/plain");
    if (name) substitute("query", name);
  });

  // -- query and filter -------------------------------------------------------------
  let timer = 0;
  input.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(runQuery, DEBOUNCE_MS);
  });
  async function runQuery() {
    const reply = await request({ type: "query", xpath: input.value });
    if (reply.type === "ok") count.textContent = input.value.trim() ? `${reply.count} match${reply.count === 1 ? "" : "es"}` : "";
  }
  search.addEventListener("input", () => { keep = filterKeep(tree, search.value); relayout(); });

  // -- toolbar ----------------------------------------------------------------------------
  undoB.addEventListener("click", () => request({ type: "undo" }));
  redoB.addEventListener("click", () => request({ type: "redo" }));
  copyB.addEventListener("click", async () => {
    const reply = await request({ type: "code" });
    if (reply.type !== "ok") return;
    panes.Code.replaceChildren(h("pre", { class: "yax-code" }, reply.code));
    showTab("Code");
    try {
      await navigator.clipboard?.writeText(reply.code);
    } catch {
      // the clipboard needs permission; the code is shown either way
    }
  });
  graphB.addEventListener("click", async () => {
    showTab("Graph");
    const id = selected !== null && tree.byId.has(selected) ? selected : null;
    panes.Graph.replaceChildren(h("div", { class: "yax-hint" }, "laying out the graph…"));
    const reply = await request({ type: "graph", id, depth: 1 });
    if (reply.type !== "ok") {
      panes.Graph.replaceChildren(h("div", { class: "yax-error" }, reply.message));
      return;
    }
    try {
      const svg = (await viz()).renderSVGElement(reply.dot);
      panes.Graph.replaceChildren(svg);
    } catch (err) {
      panes.Graph.replaceChildren(h("div", { class: "yax-error" }, `Graphviz could not lay out the graph: ${err}`));
    }
  });

  // -- state from Python ---------------------------------------------------------------------
  function onTree() {
    const prev = tree;
    tree = buildTree(model.get("_tree").rows || []);
    // keep the user's expansion where the rows still exist (ids change with a rewrite: by path)
    const pathOf = (t, id) => { const out = []; for (let n = t.byId.get(id); n; n = t.byId.get(n.parent)) out.push(n.name); return out.reverse().join("/"); };
    const open = new Set([...expanded].map((id) => pathOf(prev, id)));
    expanded = new Set();
    for (const n of tree.byId.values()) if (open.has(pathOf(tree, n.id))) expanded.add(n.id);
    if (!expanded.size) expanded = initialExpanded(tree);
    eqs = new Map();
    selected = null;
    fits = null;
    keep = filterKeep(tree, search.value);
    onMatches();
  }

  let matchVersion = 0;
  function onMatches() {
    const ids = model.get("_matches") || [];
    const owners = model.get("_match_owners") || {};
    const version = ++matchVersion;
    matchSet = new Set(ids);
    const calls = ids.map((id) => (tree.byId.has(id) ? id : owners[String(id)])).filter((x) => x !== undefined);
    for (const a of ancestorsOf(calls, (i) => tree.byId.get(i)?.parent)) expanded.add(a);
    const withEqs = [...new Set(ids.filter((id) => !tree.byId.has(id)).map((id) => owners[String(id)]))]
      .filter((o) => tree.byId.has(o));
    for (const o of withEqs) expanded.add(o);
    relayout();
    Promise.all(withEqs.map((o) => loadEquations(tree.byId.get(o)))).then(() => {
      if (version !== matchVersion) return;
      relayout();
      const i = visible.findIndex((n) => matchSet.has(n.id));
      if (i >= 0) scrollTo(i);
      // announce the highlight once it is on screen (the browser tests wait for this)
      requestAnimationFrame(() => {
        paint(); // the rows are in the DOM before the highlight is announced
        if (version === matchVersion) root.dataset.matchIds = ids.join(",");
      });
    });
  }

  function onQueryText() {
    const q = model.get("_query");
    if (q !== input.value && document.activeElement !== input) input.value = q;
  }

  function onQueryError() {
    const msg = model.get("_query_error");
    qerr.textContent = msg;
    qerr.style.display = msg ? "" : "none";
    input.classList.toggle("yax-invalid", !!msg);
    if (msg) count.textContent = "";
  }

  function onPalette() {
    palette.replaceChildren(...(model.get("_palette") || []).map((item) => {
      const div = h("div", {
        class: `yax-palette-item yax-kind-${item.kind}`, draggable: "true", dataset: { name: item.name },
        title: item.doc || item.kind,
      }, item.name);
      div.addEventListener("dragstart", (e) => {
        e.dataTransfer.setData("text/plain", item.name);
        e.dataTransfer.effectAllowed = "copy";
      });
      return div;
    }));
  }

  function onHistory() {
    const { items = [], index = 0 } = model.get("_history") || {};
    undoB.disabled = index === 0;
    redoB.disabled = index >= items.length;
    panes.History.replaceChildren(items.length
      ? h("ol", { class: "yax-history" }, h("li", { class: `yax-history-item${index === 0 ? " yax-current" : ""}` }, "original"),
        items.map((t, i) => h("li", { class: ["yax-history-item", i + 1 === index && "yax-current", i >= index && "yax-undone"].filter(Boolean).join(" ") }, t)))
      : h("div", { class: "yax-hint yax-history" }, "No changes yet."));
  }

  function onStatus() {
    const s = model.get("_status") || {};
    status.textContent = s.message || "";
    root.classList.toggle("yax-busy", !!s.busy);
  }

  function onNotice() {
    const n = model.get("_notice") || {};
    if (n.message) { notice = { id: n.id, message: n.message }; schedule(); }
  }

  function onDiff() {
    const d = model.get("_diff") || {};
    const side = (title, t, m) => {
      const keepIds = new Set(Object.keys(m).map(Number));
      for (const a of ancestorsOf([...keepIds], (i) => t.byId.get(i)?.parent)) keepIds.add(a);
      const rows = [...t.byId.values()].filter((n) => keepIds.has(n.id));
      return h("div", { class: "yax-diff-side" }, h("div", { class: "yax-section-title" }, title),
        rows.length ? rows.map((n) => h("div", {
          class: `yax-diff-row ${m[String(n.id)] ? `yax-${m[String(n.id)]}` : ""}`, dataset: { id: String(n.id) },
          style: { paddingLeft: `${4 + n.depth * 12}px` },
        }, `${m[String(n.id)] === "added" ? "+ " : m[String(n.id)] === "removed" ? "− " : m[String(n.id)] === "changed" ? "~ " : "  "}${n.name}`,
        n.type && n.type !== n.name ? h("span", { class: "yax-type" }, n.type) : null))
          : h("div", { class: "yax-hint" }, "no differences"));
    };
    const original = buildTree((model.get("_original_tree") || {}).rows || []);
    panes.Diff.replaceChildren(h("div", { class: "yax-diff-cols" },
      side("original", original, d.original || {}), side("current", tree, d.current || {})));
  }

  function heatCanvas(values, rows, cols, lo, hi, label) {
    // wide, flat outputs (a few rows of many columns) are stretched to at least 1:4 to stay visible
    const canvas = h("canvas", { class: "yax-heat", width: cols, height: rows, title: label,
      style: { aspectRatio: `${cols} / ${Math.max(rows, cols / 4)}` } });
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(cols, rows);
    for (let i = 0; i < rows * cols; i++) {
      const [r, g, b] = ramp((values[i] - lo) / (hi - lo));
      img.data.set([r, g, b, 255], i * 4);
    }
    ctx.putImageData(img, 0, 0);
    return h("figure", { class: "yax-heat-fig" }, canvas, h("figcaption", {}, label));
  }

  function histCanvas(hist) {
    const W = 280;
    const H = 80;
    const canvas = h("canvas", { class: "yax-hist", width: W, height: H });
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = getComputedStyle(root).getPropertyValue("--yax-accent") || "#1976d2";
    for (const b of histogramBars(hist.counts, W, H)) ctx.fillRect(b.x, b.y, b.w, b.h);
    return h("figure", { class: "yax-hist-fig" }, canvas,
      h("figcaption", {}, `modified − original, from ${num(hist.lo)} to ${num(hist.hi)}`));
  }

  function onComparison() {
    const c = model.get("_comparison") || {};
    const pane = panes.Compare;
    if (!c.outputs) {
      pane.replaceChildren(h("div", { class: "yax-hint" }, c.message || "Drag a replacement onto a layer to compare the modified model with the original."));
      relayout();
      return;
    }
    const verdict = h("div", { class: `yax-verdict ${c.allclose ? "yax-ok" : "yax-differs"}` },
      c.allclose ? "✓ outputs allclose to the original" : "✗ outputs differ from the original",
      c.first_divergence ? h("div", {}, "first divergence: ", h("code", {}, c.first_divergence)) : null,
      h("div", { class: "yax-hint" }, `compiled and compared in ${c.seconds} s`));
    const table = h("table", { class: "yax-stats" },
      h("tr", {}, ["output", "max|Δ|", "mean|Δ|", "rel", "cos", ""].map((t) => h("th", {}, t))),
      c.outputs.map((o) => h("tr", {}, h("td", {}, o.name), h("td", {}, num(o.max_abs)), h("td", {}, num(o.mean_abs)),
        h("td", {}, num(o.rel)), h("td", {}, num(o.cosine)), h("td", {}, o.allclose ? "✓" : "✗"))));
    const plots = c.outputs.map((o) => {
      const parts = [h("div", { class: "yax-section-title" }, `${o.name} [${o.shape.join(", ")}]`), histCanvas(o.hist)];
      if (o.heat) {
        const a = floats(o.heat.original);
        const b = floats(o.heat.modified);
        const d = floats(o.heat.diff);
        const [lo, hi] = extent([...extent(a), ...extent(b)]);
        const [dlo, dhi] = extent(d);
        parts.push(h("div", { class: "yax-heats" },
          heatCanvas(a, o.heat.rows, o.heat.cols, lo, hi, `original ${o.heat.label}`),
          heatCanvas(b, o.heat.rows, o.heat.cols, lo, hi, "modified"),
          heatCanvas(d, o.heat.rows, o.heat.cols, Math.min(0, dlo), dhi, `|difference| (max ${num(dhi)})`)));
      }
      return h("div", { class: "yax-output" }, parts);
    });
    pane.replaceChildren(verdict, table, ...plots);
    relayout();
  }

  on("change:_tree", () => { onTree(); onDiff(); });
  on("change:_matches", onMatches);
  on("change:_match_owners", onMatches);
  on("change:_query", onQueryText);
  on("change:_query_error", onQueryError);
  on("change:_palette", onPalette);
  on("change:_history", onHistory);
  on("change:_status", onStatus);
  on("change:_notice", onNotice);
  on("change:_diff", onDiff);
  on("change:_comparison", onComparison);

  onPalette();
  onHistory();
  onStatus();
  onQueryText();
  onQueryError();
  onComparison();
  onDiff();
  showTab("Compare");
  onMatches();
  paint();
  // first paint done: the browser tests and the bench wait for this
  requestAnimationFrame(() => {
    root.dataset.ready = "1";
    root.dataset.paintMs = String(Math.round(performance.now() - t0));
  });

  return () => {
    for (const f of off) f();
    clearTimeout(timer);
    if (frame) cancelAnimationFrame(frame);
  };
}

export default { render };
