// The compare pane: the verdict, per-output statistics, the histogram of the differences and
// the heatmaps of original, modified and |difference| (from `_comparison`, docs/widget.md).
import { h } from "../dom.js";
import { bounds, diffCaption, extent, floats, heatPart, histCaption, histogramBars, num, ramp } from "../format.js";

const HIST_W = 280;
const HIST_H = 80;

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

function histCanvas(hist, color) {
  const canvas = h("canvas", { class: "yax-hist", width: HIST_W, height: HIST_H });
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = color;
  // one value everywhere has no range to spread over: a single bar in the middle, and the caption says so
  const counts = hist.lo === hist.hi ? [0, hist.counts.reduce((a, b) => a + b, 0), 0] : hist.counts;
  for (const b of histogramBars(counts, HIST_W, HIST_H)) ctx.fillRect(b.x, b.y, b.w, b.h);
  return h("figure", { class: "yax-hist-fig" }, canvas, h("figcaption", {}, histCaption(hist)));
}

function heatmaps(heat, outputMax) {
  const a = floats(heat.original);
  const b = floats(heat.modified);
  const d = floats(heat.diff);
  const [lo, hi] = extent([...extent(a), ...extent(b)]);
  const [dlo, dhi] = extent(d);
  const dmax = (bounds(d) || [])[1]; // the caption says the real maximum, not the widened one
  const whole = heat.whole ?? true;
  return h("div", {},
    h("div", { class: "yax-hint yax-heat-part" }, `heatmaps of ${heatPart({ ...heat, whole })}`),
    h("div", { class: "yax-heats" },
      heatCanvas(a, heat.rows, heat.cols, lo, hi, "original"),
      heatCanvas(b, heat.rows, heat.cols, lo, hi, "modified"),
      heatCanvas(d, heat.rows, heat.cols, Math.min(0, dlo), dhi === dlo ? dlo + 1 : dhi,
        diffCaption(dmax, outputMax, whole))));
}

function statsTable(outputs) {
  return h("table", { class: "yax-stats" },
    h("tr", {}, ["output", "max|Δ|", "mean|Δ|", "rel", "cos", ""].map((t) => h("th", {}, t))),
    outputs.map((o) => h("tr", {}, h("td", {}, o.name), h("td", {}, num(o.max_abs)), h("td", {}, num(o.mean_abs)),
      h("td", {}, num(o.rel)), h("td", {}, num(o.cosine)), h("td", {}, o.allclose ? "✓" : "✗"))));
}

const HINT = "Drag a replacement onto a layer (or the query box) to compare the modified model with the original.";

/** What the pane says when there is no comparison to show: `busy`: a change is being
 * compiled and compared; `undone`: changes exist but the model is back at the original. */
function emptyHint(c, { busy, undone }) {
  if (busy) return "Compiling and comparing the modified model…";
  if (c.message) return c.message;
  if (undone) return "Back at the original model: nothing to compare. Redo, or drag a replacement onto a layer.";
  return HINT;
}

/** Fill `pane` from a `_comparison` value; `color` draws the histogram's bars; `busy`: a
 * newer change is being compared (what is shown is the previous one); `undone`: see above. */
export function renderCompare(pane, c, { color = "#1976d2", busy = false, undone = false } = {}) {
  pane.classList.toggle("yax-stale", !!(busy && c.outputs));
  if (!c.outputs) {
    pane.replaceChildren(h("div", { class: `yax-hint${busy ? " yax-comparing" : ""}` }, emptyHint(c, { busy, undone })));
    return;
  }
  const verdict = h("div", { class: `yax-verdict ${c.allclose ? "yax-ok" : "yax-differs"}` },
    c.allclose ? "✓ outputs allclose to the original" : "✗ outputs differ from the original",
    c.first_divergence ? h("div", {}, "first divergence: ", h("code", {}, c.first_divergence)) : null,
    h("div", { class: "yax-hint" }, `compiled and compared in ${c.seconds} s`
      + (c.rtol !== undefined ? ` · allclose: |Δ| ≤ ${num(c.atol)} + ${num(c.rtol)}·|original|` : "")));
  const plots = c.outputs.map((o) => h("div", { class: "yax-output" },
    h("div", { class: "yax-section-title" }, `${o.name} [${o.shape.join(", ")}]`),
    histCanvas(o.hist, color),
    o.heat ? heatmaps(o.heat, o.max_abs) : null));
  const comparing = busy ? h("div", { class: "yax-hint yax-comparing" },
    "Compiling and comparing the modified model… (below: the previous comparison)") : null;
  pane.replaceChildren(...[comparing, verdict, statsTable(c.outputs), ...plots].filter(Boolean));
}
