// The graph pane: `yax.to_dot` of a call (a `graph` request), laid out by Graphviz compiled to
// WebAssembly in a Web Worker (layout.js), so the page stays responsive however large the graph.
// Repeated identical layers come folded (one box ×N, `fold`); a double-click opens a folded or
// closed box in place (`open`: those calls, whatever the depth). A graph too large to lay out in
// a few seconds is not started: the pane says how large it is and offers to fold it or to draw
// less. The drawing opens fitted to the pane, is moved by dragging and zoomed with the wheel; its
// boxes are coloured like the tree's rows (divergence, diff marks); a click selects a box's row.
import { h } from "../dom.js";
import { divergenceColor, divergenceLevel } from "../format.js";
import { createLayout, LayoutStopped } from "./layout.js";

const ZOOM_STEP = 1.25;
/** Above this weight (`graphSize`) a graph is laid out only on request: Graphviz's time grows with
 * the boxes, the edges and the ranks long edges cross (80 layers each fed the mask from the
 * inputs: 6,800, 15 s and more; a whole 12-layer Transformer: 700, 0.6 s). */
export const GUARD_WEIGHT = 2000;
export const LAYOUT_TIMEOUT_MS = 30_000;

/** The size of a `to_dot` graph before layout: `nodes` (boxes), `edges`, `spans` (the ranks
 * edges cross beyond the next one: Graphviz places a virtual node in each) and `weight`, their
 * sum, which predicts layout time. Ranks are longest paths from the inputs: `to_dot` names nodes
 * `nN` in the order it draws them, and every edge goes from an earlier node to a later one. */
export function graphSize(dot) {
  const nodes = (dot.match(/^\s*n\d+ \[/gm) || []).length;
  const edges = [...dot.matchAll(/^\s*n(\d+) -> n(\d+)/gm)].map((m) => [Number(m[1]), Number(m[2])]);
  edges.sort((a, b) => a[1] - b[1]);
  const rank = new Map();
  for (const [s, d] of edges) rank.set(d, Math.max(rank.get(d) || 0, (rank.get(s) || 0) + 1));
  let spans = 0;
  for (const [s, d] of edges) spans += Math.max(0, (rank.get(d) || 0) - (rank.get(s) || 0) - 1);
  return { nodes, edges: edges.length, spans, weight: nodes + edges.length + spans };
}

/** The transform `{x, y, s}` showing a `w`×`h` drawing whole in a `vw`×`vh` pane: as large as fits,
 * never above its actual size, centred across, at the top. */
export function fitView(vw, vh, w, h, pad = 8) {
  if (!w || !h) return { x: pad, y: pad, s: 1 };
  const s = Math.max(0.02, Math.min(1, (vw - 2 * pad) / w, (vh - 2 * pad) / h));
  return { x: Math.max(pad, (vw - w * s) / 2), y: pad, s };
}

/** The size of Graphviz's SVG in CSS pixels (its width/height are in points). */
function naturalSize(svg) {
  const px = (v) => {
    const n = parseFloat(v || "0");
    return String(v || "").endsWith("pt") ? (n * 4) / 3 : n;
  };
  return [px(svg.getAttribute("width")), px(svg.getAttribute("height"))];
}

/** Fit every label of `svg` (in the page) inside its box. Graphviz sizes the boxes by its own estimate
 * of Helvetica's widths; the browser draws with whatever font stands for Helvetica here (often a wider
 * one), so a label could run past its box: one that would is drawn condensed to the box's width.
 * Returns how many were. */
export function fitLabels(svg) {
  let fitted = 0;
  for (const g of svg.querySelectorAll("g.node, g.cluster")) {
    const shape = g.querySelector(":scope > polygon, :scope > ellipse, :scope > path");
    if (!shape || typeof shape.getBBox !== "function") continue;
    const room = shape.getBBox().width - 8; // Graphviz's own margin around a label, about 4 points a side
    for (const text of g.querySelectorAll(":scope > text")) {
      if (room > 0 && text.getComputedTextLength() > room) {
        text.setAttribute("textLength", String(room));
        text.setAttribute("lengthAdjust", "spacingAndGlyphs");
        fitted += 1;
      }
    }
  }
  return fitted;
}

const XLINK = "http://www.w3.org/1999/xlink";

/** Colour the boxes of `svg` (ids `yax-N`, the rows' ids): a border in the divergence colour of
 * the comparison's boundary `N`, the diff's mark as a class. Each box's hover text says what it
 * is: a fold's tooltip (Graphviz wraps the shapes of an element with a tooltip in a link; they are
 * taken out of it, so box > shape holds for every box) and what a double-click does. */
export function decorate(svg, { boundaries = {}, marks = {}, firstDivergence = null } = {}, opened = new Set()) {
  for (const g of svg.querySelectorAll("g.node, g.cluster")) {
    const id = ((g.getAttribute("id") || "").match(/^yax-(\d+)$/) || [])[1]; // the row's id (to_dot names it)
    if (!id) continue;
    const link = g.querySelector(":scope > g > a");
    const tip = link?.getAttributeNS(XLINK, "title") || link?.getAttribute("xlink:title") || "";
    if (link) link.parentNode.replaceWith(...link.childNodes);
    const title = g.querySelector(":scope > title");
    if (title) {
      const what = [...g.querySelectorAll(":scope > text")].map((t) => t.textContent).join("\n");
      const act = g.classList.contains("yax-more") ? "double-click to open it"
        : opened.has(Number(id)) && g.classList.contains("cluster") ? "double-click to close it" : "";
      title.textContent = [tip || what, act].filter(Boolean).join("\n");
    }
    const b = boundaries[id];
    const shape = g.querySelector("polygon, path, ellipse");
    if (b && shape && divergenceLevel(b.rel) !== null) {
      shape.setAttribute("stroke", divergenceColor(divergenceLevel(b.rel)));
      shape.style.strokeWidth = String(String(firstDivergence) === id ? 4 : 2.5); // above the CSS of folds
    }
    g.classList.remove("yax-added", "yax-changed", "yax-removed");
    if (marks[id]) g.classList.add(`yax-${marks[id]}`);
    g.dataset.row = id;
  }
}

/** The pane: `request` sends requests; `look()` returns `{boundaries, marks, firstDivergence}`
 * for the colours; `onPick(id)` selects a row. Returns `{el, show(id), redraw(), current()}`. */
export function createGraphPane({ el, request, look = () => ({}), onPick = () => {} }) {
  const depth = h("select", { class: "yax-graph-depth", title: "How many levels of calls to open" },
    [0, 1, 2, 3, 4].map((d) => h("option", { value: String(d) }, `depth ${d}`)));
  depth.value = "1";
  const foldBox = h("input", { type: "checkbox", class: "yax-graph-fold", checked: true });
  const fold = h("label", { class: "yax-graph-fold-label", title: "Draw a stack of identical layers once, marked ×N" },
    foldBox, "fold ×N");
  const zoomIn = h("button", { class: "yax-zoom-in", title: "Zoom in (wheel)" }, "+");
  const zoomOut = h("button", { class: "yax-zoom-out", title: "Zoom out (wheel)" }, "−");
  const fit = h("button", { class: "yax-zoom-fit", title: "Show the whole graph" }, "fit");
  const one = h("button", { class: "yax-zoom-one", title: "Actual size" }, "1:1");
  const stop = h("button", { class: "yax-graph-stop", title: "Stop laying out", hidden: true }, "stop");
  const what = h("span", { class: "yax-hint yax-graph-what" });
  const state = h("span", { class: "yax-graph-state" });
  const stage = h("div", { class: "yax-graph-stage" });
  const status = h("div", { class: "yax-graph-status", hidden: true }, state, stop); // over the drawing while busy
  const view = h("div", { class: "yax-graph-view",
    title: "Drag to move, wheel to zoom; click a box to select its row, double-click to open it" }, stage, status);
  el.replaceChildren(h("div", { class: "yax-graph-bar" }, depth, fold, zoomOut, zoomIn, fit, one, what), view);

  const layout = createLayout({ timeoutMs: LAYOUT_TIMEOUT_MS });
  let id = null; // the call drawn (null: the whole model)
  let version = 0;
  let svg = null;
  let size = [0, 0];
  let opened = new Set(); // calls opened by a double-click, whatever the depth
  let anyway = false; // lay out past the guard
  let picking = false; // a click here is selecting a row: the selection is drawn already
  let picked = null; // the row last selected here (in the drawing: the Graph tab has it shown)
  let fitted = true; // the drawing is as `fit` put it: a resize fits it again
  let drawn = 0; // how many times the pane came to rest (a drawing, the guard, an error): data-drawn
  const t = { x: 0, y: 0, s: 1 };
  const rest = (st) => Object.assign(view.dataset, { state: st, drawn: String(++drawn) });
  const apply = () => {
    stage.style.transform = `translate(${t.x}px, ${t.y}px) scale(${t.s})`;
    view.dataset.scale = t.s.toFixed(3);
  };
  const fitAll = () => {
    Object.assign(t, fitView(view.clientWidth || 400, view.clientHeight || 300, size[0], size[1]));
    fitted = true;
    apply();
  };
  const zoom = (k, cx = view.clientWidth / 2, cy = view.clientHeight / 2) => {
    const s = Math.min(4, Math.max(0.02, t.s * k));
    t.x = cx - ((cx - t.x) * s) / t.s;
    t.y = cy - ((cy - t.y) * s) / t.s;
    t.s = s;
    fitted = false;
    apply();
  };
  zoomIn.addEventListener("click", () => zoom(ZOOM_STEP));
  zoomOut.addEventListener("click", () => zoom(1 / ZOOM_STEP));
  fit.addEventListener("click", fitAll);
  one.addEventListener("click", () => {
    Object.assign(t, { s: 1, x: 4, y: 4 });
    fitted = false;
    apply();
  });
  depth.addEventListener("change", () => {
    opened = new Set();
    anyway = false;
    draw();
  });
  foldBox.addEventListener("change", () => {
    anyway = false;
    draw();
  });
  stop.addEventListener("click", () => layout.stop());
  const resized = typeof ResizeObserver === "undefined" ? null : new ResizeObserver(() => { if (svg && fitted) fitAll(); });
  resized?.observe(view);
  view.addEventListener("wheel", (e) => {
    e.preventDefault();
    const r = view.getBoundingClientRect();
    zoom(e.deltaY < 0 ? 1.1 : 1 / 1.1, e.clientX - r.left, e.clientY - r.top);
  }, { passive: false });
  let drag = null;
  view.addEventListener("pointerdown", (e) => {
    drag = { x: e.clientX, y: e.clientY, tx: t.x, ty: t.y, moved: false };
  });
  view.addEventListener("pointermove", (e) => {
    if (!drag) return;
    const dx = e.clientX - drag.x;
    const dy = e.clientY - drag.y;
    if (!drag.moved && Math.abs(dx) + Math.abs(dy) < 4) return;
    if (!drag.moved) view.setPointerCapture?.(e.pointerId);
    drag.moved = true;
    fitted = false;
    t.x = drag.tx + dx;
    t.y = drag.ty + dy;
    apply();
  });
  let dragged = false; // the last press moved the drawing: its click is no pick
  view.addEventListener("pointerup", () => { dragged = !!drag?.moved; drag = null; });
  view.addEventListener("pointercancel", () => { drag = null; });
  view.addEventListener("click", (e) => {
    const box = e.target.closest?.("g.node[data-row]");
    if (box && !dragged) pick(Number(box.dataset.row));
    dragged = false;
  });
  view.addEventListener("dblclick", (e) => {
    const box = e.target.closest?.("g.node[data-row], g.cluster[data-row]");
    if (!box) return;
    const row = Number(box.dataset.row);
    if (box.classList.contains("yax-more")) opened.add(row);
    else if (box.classList.contains("cluster") && opened.has(row)) opened.delete(row);
    else return;
    draw();
  });

  /** Select the row of a box; the graph stays (the selection it causes draws nothing new). */
  function pick(row) {
    for (const g of stage.querySelectorAll("g.yax-picked")) g.classList.remove("yax-picked");
    stage.querySelector(`g.node[data-row="${row}"]`)?.classList.add("yax-picked");
    picked = row;
    picking = true;
    try {
      onPick(row);
    } finally {
      picking = false;
    }
  }

  /** Colour the drawing from the current comparison and diff. */
  function redraw() {
    if (svg) decorate(svg, look(), opened);
  }

  const busy = (text) => {
    view.dataset.state = "busy";
    view.classList.add("yax-graph-busy");
    state.textContent = text;
    state.classList.remove("yax-error");
    status.hidden = false;
    if (!svg) stage.replaceChildren();
  };
  const idle = () => {
    view.classList.remove("yax-graph-busy");
    status.hidden = true;
    stop.hidden = true;
  };
  /** In place of the drawing: `message`, and what would make the graph smaller (or lay it out). */
  const offer = (message, { again = false } = {}) => {
    svg = null;
    idle();
    const d = Number(depth.value);
    stage.replaceChildren(h("div", { class: "yax-graph-guard" },
      h("div", {}, message),
      h("div", { class: "yax-graph-offers" },
        !foldBox.checked ? h("button", { class: "yax-guard-fold", onclick: () => { foldBox.checked = true; draw(); } },
          "fold repeated layers") : null,
        d > 0 ? h("button", { class: "yax-guard-depth", onclick: () => { depth.value = String(d - 1); opened = new Set(); draw(); } },
          `depth ${d - 1}`) : null,
        opened.size ? h("button", { class: "yax-guard-close", onclick: () => { opened = new Set(); draw(); } },
          "close the boxes opened") : null,
        again ? h("button", { class: "yax-guard-anyway", onclick: () => { anyway = true; draw(); } },
          "lay it out anyway") : null)));
    Object.assign(t, { x: 0, y: 0, s: 1 });
    apply();
    rest("guard");
  };

  /** Draw call `callId` (null: the whole model), from the depth chosen, with none of its boxes
   * opened. A failed request or layout is shown in the pane. */
  function show(callId) {
    if (picking) return; // a box's row, selected from here
    id = callId;
    picked = null;
    opened = new Set();
    anyway = false;
    svg = null;
    return draw();
  }

  async function draw() {
    const mine = ++version;
    layout.stop(); // a layout under way is for an older request
    const t0 = performance.now();
    busy("asking the kernel…");
    let reply;
    try {
      reply = await request("graph", { id, depth: Number(depth.value), ...(foldBox.checked ? {} : { fold: false }),
        ...(opened.size ? { open: [...opened] } : {}) });
    } catch (err) {
      if (mine === version) fail(err.message);
      return;
    }
    if (mine !== version) return;
    const n = graphSize(reply.dot);
    Object.assign(view.dataset, { nodes: n.nodes, edges: n.edges, weight: n.weight });
    const count = `${n.nodes.toLocaleString("en")} boxes and ${n.edges.toLocaleString("en")} edges`;
    if (n.weight > GUARD_WEIGHT && !anyway) {
      offer(`This graph has ${count}: Graphviz could take minutes to lay it out.`, { again: true });
      return;
    }
    busy(`laying out ${n.nodes.toLocaleString("en")} boxes…`);
    stop.hidden = false;
    let done;
    try {
      done = await layout.run(reply.dot);
    } catch (err) {
      if (mine !== version) return;
      if (err instanceof LayoutStopped) offer(`${err.message} This graph has ${count}.`, { again: err.reason !== "timeout" });
      else fail(`Graphviz could not lay out the graph: ${err.message}`);
      return;
    }
    if (mine !== version) return;
    svg = new DOMParser().parseFromString(done.svg, "image/svg+xml").documentElement;
    size = naturalSize(svg);
    stage.replaceChildren(svg);
    stage.dataset.condensed = String(fitLabels(svg)); // in the page: the browser's own text widths
    what.textContent = id === null ? "the whole model" : "the selected call";
    redraw();
    fitAll();
    idle();
    // drawn: the browser tests and the bench read how long it took (request to the frame with it)
    requestAnimationFrame(() => {
      if (mine !== version) return;
      Object.assign(view.dataset, { layoutMs: String(Math.round(performance.now() - t0)),
        graphvizMs: String(Math.round(done.ms)), worker: done.worker ? "1" : "0" });
      rest("ready");
    });
  }

  /** A failed request or layout: in place of the drawing, or, opening a box of one (a refusal from
   * a page without the kernel), above it, the drawing kept. */
  function fail(message) {
    idle();
    if (svg) {
      state.textContent = message;
      state.classList.add("yax-error");
      status.hidden = false;
    } else {
      stage.replaceChildren(h("div", { class: "yax-error" }, message));
    }
    rest("error");
  }

  function dispose() {
    resized?.disconnect();
    layout.dispose();
  }

  // current(): the call the pane shows: the one drawn, or the row picked in its drawing
  return { el, show, redraw, current: () => picked ?? id, dispose };
}
