// The graph pane: `yax.to_dot` of a call (a `graph` request), laid out in the browser by
// Graphviz compiled to WebAssembly (@viz-js/viz, loaded on first use). The pane has its own
// bar (depth, zoom, fit); the drawing is shown at a readable size and moved by dragging, zoomed
// with the wheel; its boxes are coloured like the tree's rows (divergence, diff marks) and a
// click on one selects its row.
import { instance as vizInstance } from "@viz-js/viz";
import { h } from "../dom.js";
import { divergenceColor, divergenceLevel } from "../format.js";

let vizPromise = null;
const viz = () => (vizPromise ??= vizInstance());

const MIN_FIT = 0.75; // "fit" never shrinks text below 3/4 of its size: larger graphs are panned
const ZOOM_STEP = 1.25;

/** The size of Graphviz's SVG in CSS pixels (its width/height are in points). */
function naturalSize(svg) {
  const px = (v) => {
    const n = parseFloat(v || "0");
    return String(v || "").endsWith("pt") ? (n * 4) / 3 : n;
  };
  return [px(svg.getAttribute("width")), px(svg.getAttribute("height"))];
}

/** Colour the boxes of `svg` (ids `yax-N`, the rows' ids): a border in the divergence colour of
 * the comparison's boundary `N`, the diff's mark as a class. */
export function decorate(svg, { boundaries = {}, marks = {}, firstDivergence = null } = {}) {
  for (const g of svg.querySelectorAll("g.node, g.cluster")) {
    const id = ((g.getAttribute("id") || "").match(/^yax-(\d+)$/) || [])[1]; // the row's id (to_dot names it)
    if (!id) continue;
    const b = boundaries[id];
    const shape = g.querySelector("polygon, path, ellipse");
    if (b && shape && divergenceLevel(b.rel) !== null) {
      shape.setAttribute("stroke", divergenceColor(divergenceLevel(b.rel)));
      shape.setAttribute("stroke-width", String(String(firstDivergence) === id ? 4 : 2.5));
    }
    if (marks[id]) g.classList.add(`yax-${marks[id]}`);
    g.dataset.row = id;
  }
}

/** The pane: `request` sends requests; `look()` returns `{boundaries, marks, firstDivergence}`
 * for the colours; `onPick(id)` selects a row. Returns `{el, show(id), redraw()}`. */
export function createGraphPane({ el, request, look = () => ({}), onPick = () => {} }) {
  const depth = h("select", { class: "yax-graph-depth", title: "How many levels of calls to open" },
    [0, 1, 2, 3, 4].map((d) => h("option", { value: String(d) }, `depth ${d}`)));
  depth.value = "1";
  const zoomIn = h("button", { class: "yax-zoom-in", title: "Zoom in (wheel)" }, "+");
  const zoomOut = h("button", { class: "yax-zoom-out", title: "Zoom out (wheel)" }, "−");
  const fit = h("button", { class: "yax-zoom-fit", title: "Fit the width (text stays readable)" }, "fit");
  const one = h("button", { class: "yax-zoom-one", title: "Actual size" }, "1:1");
  const what = h("span", { class: "yax-hint yax-graph-what" });
  const stage = h("div", { class: "yax-graph-stage" });
  const view = h("div", { class: "yax-graph-view", title: "Drag to move, wheel to zoom, click a box to select its row" },
    stage);
  el.replaceChildren(h("div", { class: "yax-graph-bar" }, depth, zoomOut, zoomIn, fit, one, what), view);

  let id = null;
  let version = 0;
  let svg = null;
  let size = [0, 0];
  const t = { x: 0, y: 0, s: 1 };
  const apply = () => {
    stage.style.transform = `translate(${t.x}px, ${t.y}px) scale(${t.s})`;
    view.dataset.scale = t.s.toFixed(3);
  };
  const fitWidth = () => {
    const w = view.clientWidth || 400;
    t.s = size[0] ? Math.max(MIN_FIT, Math.min(1, (w - 8) / size[0])) : 1;
    t.x = Math.max(4, (w - size[0] * t.s) / 2);
    t.y = 4;
    apply();
  };
  const zoom = (k, cx = view.clientWidth / 2, cy = view.clientHeight / 2) => {
    const s = Math.min(4, Math.max(0.1, t.s * k));
    t.x = cx - ((cx - t.x) * s) / t.s;
    t.y = cy - ((cy - t.y) * s) / t.s;
    t.s = s;
    apply();
  };
  zoomIn.addEventListener("click", () => zoom(ZOOM_STEP));
  zoomOut.addEventListener("click", () => zoom(1 / ZOOM_STEP));
  fit.addEventListener("click", fitWidth);
  one.addEventListener("click", () => { t.s = 1; t.x = 4; t.y = 4; apply(); });
  depth.addEventListener("change", () => show(id));
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
    t.x = drag.tx + dx;
    t.y = drag.ty + dy;
    apply();
  });
  let dragged = false; // the last press moved the drawing: its click is no pick
  view.addEventListener("pointerup", () => { dragged = !!drag?.moved; drag = null; });
  view.addEventListener("pointercancel", () => { drag = null; });
  view.addEventListener("click", (e) => {
    const box = e.target.closest?.("g.node[data-row]");
    if (box && !dragged) onPick(Number(box.dataset.row));
    dragged = false;
  });

  /** Colour the drawing from the current comparison and diff. */
  function redraw() {
    if (svg) decorate(svg, look());
  }

  /** Draw call `callId` (null: the whole model). A failed request or layout is shown in the pane. */
  async function show(callId) {
    id = callId;
    const mine = ++version;
    stage.replaceChildren(h("div", { class: "yax-hint" }, "laying out the graph…"));
    let reply;
    try {
      reply = await request("graph", { id: callId, depth: Number(depth.value) });
    } catch (err) {
      if (mine === version) stage.replaceChildren(h("div", { class: "yax-error" }, err.message));
      return;
    }
    let drawn;
    try {
      drawn = (await viz()).renderSVGElement(reply.dot);
    } catch (err) {
      if (mine === version) stage.replaceChildren(h("div", { class: "yax-error" }, `Graphviz could not lay out the graph: ${err}`));
      return;
    }
    if (mine !== version) return;
    svg = drawn;
    size = naturalSize(svg);
    stage.replaceChildren(svg);
    what.textContent = callId === null ? "the whole model" : "the selected call";
    redraw();
    fitWidth();
  }

  return { el, show, redraw, current: () => id };
}
