// Inside the model (issue 13): the selected row's values on a chosen input batch (the
// Values tab), the tree painted by a statistic with its legend, the batch chooser and the
// "find first NaN" action; the colouring by the gradient of a scalar of the output (issue 27), its
// choice of scalar, the gradient in the Values tab and the search for the first NaN or Inf of the
// backward pass. State comes from `_values`, `_overlay`, `_batches` and `_scalars`
// (yax_widget/_values.py; docs/widget.md, "Values" and "Attribution").
import { h } from "../dom.js";
import { bounds, extent, floats, heatPart, histogramBars, num, ramp } from "../format.js";

const HIST_W = 280;
const HIST_H = 80;
export const STATS = { off: "off", norm: "norm", zeros: "fraction of zeros", nonfinite: "NaN / Inf",
  grad: "gradient norm", gxa: "gradient × activation", flops: "FLOPs (compiled)", bytes: "bytes accessed (compiled)",
  comm: "bytes of collectives (compiled)" };
/** The colourings by the gradient of a scalar of the output: they send the scalar chosen. */
export const GRAD_STATS = new Set(["grad", "gxa"]);
/** The colourings by the compiled program's cost (yax.cost): shapes only, no batch's values. */
export const COST_STATS = new Set(["flops", "bytes", "comm"]);
/** The colourings on a log scale (norms, costs: they span orders of magnitude). */
const LOG_STATS = new Set(["norm", "grad", ...COST_STATS]);
const GRAD_COLOR = "#8e44ad"; // the gradient's histograms, apart from the values'

const NONFINITE_RGB = [230, 30, 60]; // NaN and ±Inf cells of a heatmap: off the ramp
const count = (n) => n.toLocaleString("en-US");
const fraction = (k, n) => (n ? `${count(k)} (${num((100 * k) / n)}%)` : "–");

/** The caption of a histogram of values (`hist`: the real range of the finite values). */
export function valuesCaption({ lo, hi, n, nonfinite = 0 }) {
  const text = !n ? "no finite values"
    : lo === hi ? `every finite value is ${num(lo)} (${count(n)} values)`
      : `values from ${num(lo)} to ${num(hi)} (${count(n)} finite)`;
  return nonfinite ? `${text}; ${count(nonfinite)} NaN or infinite not counted` : text;
}

/** The ends of a range under a plot: the real values (one value: just it). */
function ends(lo, hi) {
  return h("div", { class: "yax-values-ends" }, h("span", {}, num(lo)), lo === hi ? null : h("span", {}, num(hi)));
}

function histFigure(hist, color) {
  const canvas = h("canvas", { class: "yax-hist", width: HIST_W, height: HIST_H });
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = color;
  // one value everywhere has no range to spread over: a single bar in the middle, and the caption says so
  const counts = hist.lo === hist.hi ? [0, hist.counts.reduce((a, b) => a + b, 0), 0] : hist.counts;
  if (hist.n) for (const b of histogramBars(counts, HIST_W, HIST_H)) ctx.fillRect(b.x, b.y, b.w, b.h);
  return h("figure", { class: "yax-hist-fig" }, canvas, hist.n ? ends(hist.lo, hist.hi) : null,
    h("figcaption", {}, valuesCaption(hist)));
}

/** A heatmap of float32 `values` (rows x cols): finite values on the ramp over their real range,
 * NaN and ±Inf in red, so that an overflow never looks like the smallest value. */
export function heatPixels(values, rows, cols) {
  const [lo, hi] = extent(values);
  const px = new Uint8ClampedArray(rows * cols * 4);
  let bad = 0;
  for (let i = 0; i < rows * cols; i++) {
    const v = values[i];
    const finite = Number.isFinite(v);
    if (!finite) bad += 1;
    px.set([...(finite ? ramp((v - lo) / (hi - lo)) : NONFINITE_RGB), 255], i * 4);
  }
  return { px, bad };
}

function heatFigure(heat) {
  const v = floats(heat.values);
  const real = bounds(v);
  const canvas = h("canvas", { class: "yax-heat", width: heat.cols, height: heat.rows,
    style: { aspectRatio: `${heat.cols} / ${Math.max(heat.rows, heat.cols / 4)}` } });
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(heat.cols, heat.rows);
  const { px, bad } = heatPixels(v, heat.rows, heat.cols);
  img.data.set(px);
  ctx.putImageData(img, 0, 0);
  const stops = [0, 0.25, 0.5, 0.75, 1].map((t) => `rgb(${ramp(t).join(",")}) ${t * 100}%`).join(", ");
  return h("div", { class: "yax-values-heat" },
    h("div", { class: "yax-hint yax-heat-part" },
      `heatmap of ${heatPart(heat)}${heat.nonfinite ? ", the first slice holding NaN or Inf" : ""}`),
    canvas,
    real ? h("div", { class: "yax-values-scale", style: { background: `linear-gradient(to right, ${stops})` } }) : null,
    real ? ends(real[0], real[1]) : null,
    bad ? h("div", { class: "yax-hint yax-nonfinite" },
      h("span", { class: "yax-swatch", style: { background: `rgb(${NONFINITE_RGB.join(",")})` } }),
      ` ${count(bad)} NaN or infinite values shown here`) : null);
}

/** The statistics table of one output: only numbers Python computed ("–" where none exist). */
function statsTable(o) {
  const bad = o.nan + o.posinf + o.neginf;
  const cells = [["min", num(o.min)], ["max", num(o.max)], ["mean", num(o.mean)], ["std", num(o.std)],
    ["norm", num(o.norm)], ["zeros", fraction(o.zeros, o.size)],
    ["NaN / Inf", bad ? `${fraction(bad, o.size)}: ${count(o.nan)} NaN, ${count(o.posinf)} +Inf, ${count(o.neginf)} −Inf` : "none"]];
  return h("table", { class: "yax-stats yax-values-stats" },
    bad ? h("caption", { class: "yax-hint" }, "min … norm: of the finite values") : null,
    cells.map(([k, v]) => h("tr", { class: k === "NaN / Inf" && bad ? "yax-nonfinite" : null },
      h("th", {}, k), h("td", { dataset: { stat: k } }, v))));
}

/** The gradient of the scalar at one output (`_values.grad.outputs[k]`): its statistics and
 * histogram, or why it has none. `g`: the `_values.grad`; `o`: the output's entry. */
function gradBlock(g, o, name) {
  const title = `gradient of ${g.what} at ${name}`;
  if (o.why) {
    return h("div", { class: "yax-output yax-grad-output yax-grad-none" },
      h("div", { class: "yax-output-title" }, title), h("div", { class: "yax-hint" }, `No gradient: ${o.why}.`));
  }
  return h("div", { class: "yax-output yax-grad-output" },
    h("div", { class: "yax-output-title" }, `${title}: ${o.type}`
      + (o.steps.length ? ` — stacked over ${o.steps.join(" × ")} scan steps` : "")),
    statsTable(o), histFigure(o.hist, GRAD_COLOR));
}

/** The line above the gradients: what was differentiated, and its value. */
function gradHead(g) {
  return h("div", { class: "yax-grad-head" },
    h("strong", {}, `gradient of ${g.what}`), g.scalar === null ? "" : ` (its value: ${num(g.scalar)})`,
    h("div", { class: "yax-hint" }, g.label));
}

/** Fill the Values tab from a `_values` value for the selected row (with `grad`: the gradient
 * of the colouring's scalar beside each output). */
export function renderValues(pane, v, { color = "#1976d2", name = "" } = {}) {
  const g = v.grad;
  const head = h("div", { class: "yax-values-head" },
    h("code", {}, v.key), ` on batch “${v.batch}”`,
    h("div", { class: "yax-hint" }, v.seconds > 0 ? `computed on the device in ${v.seconds} s` : "kept from before"),
    g ? gradHead(g) : null);
  const outs = v.outputs.map((o, k) => h("div", { class: "yax-output yax-values-output" },
    h("div", { class: "yax-output-title" }, `${name || o.name}: ${o.type}`
      + (o.steps.length ? ` — stacked over ${o.steps.join(" × ")} scan steps` : "")),
    statsTable(o),
    histFigure(o.hist, color),
    g && g.outputs[k] ? gradBlock(g, g.outputs[k], name || o.name) : null,
    o.heat ? heatFigure(o.heat) : null));
  const more = v.more ? h("div", { class: "yax-hint" }, `${v.more} more outputs not shown`) : null;
  const none = v.outputs.length ? null : h("div", { class: "yax-hint" }, "This row has no array outputs.");
  pane.replaceChildren(...[head, ...outs, more, none].filter(Boolean));
}

const POSITIVE = [200, 40, 40];
const NEGATIVE = [40, 90, 200];
const MIDDLE = [236, 236, 236];

/** The diverging colour of `t` in [-1, 1]: blue below zero, red above, light grey at zero. */
export function diverging(t) {
  const u = Math.max(-1, Math.min(1, t));
  const end = u < 0 ? NEGATIVE : POSITIVE;
  return MIDDLE.map((m, i) => Math.round(m + (end[i] - m) * Math.abs(u)));
}

/** A row's colour for statistic `stat` of value `x` (`lo`/`hi`: the real range over the rows).
 * `gxa` (gradient × activation) is signed: a diverging scale over [-max|x|, max|x|]. */
export function overlayColor(stat, x, lo, hi) {
  if (x === null || x === undefined) return null;
  if (stat === "nonfinite") return x > 0 ? "hsl(0, 80%, 50%)" : "hsl(120, 45%, 45%)";
  if (stat === "gxa") {
    const m = Math.max(Math.abs(lo), Math.abs(hi));
    return `rgb(${diverging(m > 0 ? x / m : 0).join(", ")})`;
  }
  let t = stat === "zeros" ? x : 0.5;
  if (LOG_STATS.has(stat) && hi > lo) {
    // a log scale over the positive norms: a zero norm sits at the bottom
    const floor = lo > 0 ? lo : hi * 1e-6;
    t = x <= floor ? 0 : (Math.log10(x) - Math.log10(floor)) / (Math.log10(hi) - Math.log10(floor));
  }
  const [r, g, b] = ramp(t);
  return `rgb(${r}, ${g}, ${b})`;
}

/** The legend of the colouring: what it shows and its real range. */
export function overlayLegend(o) {
  if (!o || !o.stat) return [];
  const n = Object.values(o.values).filter((x) => x !== null).length;
  const unknown = o.rows - n;
  const where = COST_STATS.has(o.stat)
    ? `${n} of ${o.rows} calls, ${o.per}${unknown ? `; ${unknown} not known before it runs (hover for why)` : ""}`
    : `${n} of ${o.rows} calls, batch “${o.batch}”`;
  if (o.stat === "nonfinite") {
    const bad = Object.values(o.values).filter((x) => x > 0).length;
    return [h("span", { class: "yax-swatch", style: { background: overlayColor("nonfinite", 0) } }), "all finite",
      h("span", { class: "yax-swatch", style: { background: overlayColor("nonfinite", 1) } }),
      `holds NaN or Inf (${bad})`, h("span", { class: "yax-hint" }, ` · ${where}`)];
  }
  if (GRAD_STATS.has(o.stat)) return gradLegend(o, n);
  const stops = [0, 0.25, 0.5, 0.75, 1].map((t) => `rgb(${ramp(t).join(",")}) ${t * 100}%`).join(", ");
  const scale = LOG_STATS.has(o.stat) ? "log scale" : "0 … 1";
  return [`${o.label}:`, h("span", { class: "yax-ov-scale" }, num(o.lo)),
    h("span", { class: "yax-ov-ramp", style: { background: `linear-gradient(to right, ${stops})` } }),
    h("span", { class: "yax-ov-scale" }, num(o.hi)), h("span", { class: "yax-hint" }, ` (${scale}) · ${where}`)];
}

/** The legend of a gradient colouring: the statistic, exactly what was differentiated, the real
 * range (the ends of a signed scale: ±max|x|, labelled as such), and the rows without a gradient. */
function gradLegend(o, n) {
  const none = Object.values(o.values).filter((x) => x === null).length;
  const tail = h("span", { class: "yax-hint" },
    ` · ${n} of ${o.rows} calls${none ? `; ${none} without a gradient (hatched: hover for why)` : ""}`);
  const head = h("span", { class: "yax-ov-what" }, `${o.label} of ${o.scalar.label}:`);
  if (o.stat === "gxa") {
    const m = Math.max(Math.abs(o.lo ?? 0), Math.abs(o.hi ?? 0));
    const stops = [-1, -0.5, 0, 0.5, 1].map((t) => `rgb(${diverging(t).join(",")}) ${(t + 1) * 50}%`).join(", ");
    return [head, h("span", { class: "yax-ov-scale" }, num(-m)),
      h("span", { class: "yax-ov-ramp", style: { background: `linear-gradient(to right, ${stops})` } }),
      h("span", { class: "yax-ov-scale" }, num(m)),
      h("span", { class: "yax-hint" }, ` (signed, linear: Σ gradient × output of each row; rows from ${num(o.lo)} to ${num(o.hi)})`),
      tail];
  }
  const stops = [0, 0.25, 0.5, 0.75, 1].map((t) => `rgb(${ramp(t).join(",")}) ${t * 100}%`).join(", ");
  return [head, h("span", { class: "yax-ov-scale" }, num(o.lo)),
    h("span", { class: "yax-ov-ramp", style: { background: `linear-gradient(to right, ${stops})` } }),
    h("span", { class: "yax-ov-scale" }, num(o.hi)), h("span", { class: "yax-hint" }, " (log scale)"), tail];
}

/** The scalar chosen in the bar as a request's fields: `kind` from the scalar menu, `text` the
 * logit index box (empty: the argmax). Throws an Error saying what is wrong with the index. */
export function scalarChoice(kind, text) {
  const t = String(text ?? "").trim();
  if (kind !== "logit" || t === "") return { scalar: kind, index: null };
  const i = Number(t);
  if (!Number.isInteger(i) || i < 0) {
    throw new Error(`The logit index must be a whole number from 0 (or empty for the argmax), not “${t.slice(0, 20)}”.`);
  }
  return { scalar: kind, index: i };
}

/** A row's entry in the view's overlay map for the colouring `o`: its colour and tooltip, or, for
 * a row of a gradient colouring with no gradient, a hatched mark whose tooltip says why. */
export function overlayEntry(o, id, x) {
  const why = (o.why || {})[id];
  const bad = (o.nonfinite || {})[id] || 0; // NaN or Inf values in its gradient: a mark on the row, not a tooltip
  if (x === null) {
    if (!why) return null;
    const what = COST_STATS.has(o.stat) ? `${o.label} unknown: ${why}` : `no gradient: ${why}`;
    return { color: "transparent", title: what, x: -Infinity, nonfinite: bad };
  }
  const title = `${o.label}: ${num(x)}` + (GRAD_STATS.has(o.stat) ? ` (${o.scalar.label})` : "")
    + (why ? `; ${why}` : "");
  // a folded run shows its largest: for a signed attribution, the largest in magnitude
  return { color: overlayColor(o.stat, x, o.lo, o.hi), title, x: o.stat === "gxa" ? Math.abs(x) : x, nonfinite: bad };
}

/**
 * The values bar above the tree and the Values tab. `request(type, payload, options)`: requests.js;
 * `view`: the TreeView (its `overlay` map paints the rows); `tabs`, `pane`: the side panel's tabs
 * and the Values tab; `on(event, fn)`: model events removed with the widget; `change`: the
 * request options of a change (a batch switch re-runs the comparison).
 * Returns `{bar, select(id), shown(), rowsChanged(), dispose()}`.
 */
export function createValues({ model, request, view, tabs, pane, failed, on, change, color = () => "#1976d2" }) {
  const batch = h("select", { class: "yax-batch", "aria-label": "input batch", title: "The input batch the values, colours and comparison use" });
  const colour = h("select", { class: "yax-colour", "aria-label": "colour rows by" },
    Object.entries(STATS).map(([k, t]) => h("option", { value: k }, t)));
  const legend = h("span", { class: "yax-ov-legend" });
  const nan = h("button", { class: "yax-find-nan", title: "Run the model and select where the first NaN or Inf appears" },
    "find first NaN/Inf");
  const scalar = h("select", { class: "yax-scalar", "aria-label": "the scalar the gradient is taken of",
    title: "The scalar of the output whose gradient the gradient colourings, the Values tab and the gradient's "
      + "NaN search take: the loss (`grad_of`), a logit (out[0, …, -1, index] of the output's logits; empty index: "
      + "the argmax there), or the sum of the logits" });
  const index = h("input", { class: "yax-logit-index", type: "number", min: "0", step: "1", placeholder: "argmax",
    "aria-label": "logit index", title: "The logit's index along the output's last axis (empty: the argmax)" });
  const gradNan = h("button", { class: "yax-find-grad-nan",
    title: "Take the gradient of the chosen scalar with respect to the parameters and select the row whose "
      + "derivative rule first gives a NaN or Inf (yax.first_nonfinite with grad_of)" },
  "find first NaN/Inf in the gradient");
  const message = h("span", { class: "yax-values-message", role: "status" });
  const bar = h("div", { class: "yax-values-bar" },
    h("label", {}, "batch ", batch), h("label", {}, "colour rows by ", colour),
    h("label", { class: "yax-grad-of" }, "gradient of ", scalar, index), nan, gradNan, message, legend);
  let asked = 0; // the latest values request: older replies do not overwrite newer ones

  const hint = (text) => pane.replaceChildren(h("div", { class: "yax-hint" }, text));
  const batchName = () => (model.get("_batches") || {}).current || "";
  const idle = () => hint(`Select a row to see its values on batch “${batchName()}”.`);

  function show() {
    const v = model.get("_values") || {};
    if (view.selected !== null && v.id === view.selected && v.outputs) renderValues(pane, v, { color: color() });
  }

  async function fetch(id) {
    if (id === null || id === undefined) return idle();
    const mine = ++asked;
    pane.classList.add("yax-stale");
    if (!pane.querySelector(".yax-values-output")) {
      hint("Computing the values on the device (the first row of a model or batch compiles and runs it once)…");
    }
    try {
      await request("values", { id }, change); // the first compiles: as long as a change may take
      if (mine === asked) show();
    } catch (err) {
      if (mine === asked) pane.replaceChildren(h("div", { class: "yax-error" }, err.message));
    } finally {
      if (mine === asked) pane.classList.remove("yax-stale");
    }
  }

  function paint() {
    const o = model.get("_overlay") || {};
    if (!o.stat || o.stat !== colour.value) {
      view.overlay = null;
      legend.replaceChildren();
    } else {
      view.overlay = new Map(Object.entries(o.values).map(([id, x]) => [Number(id), overlayEntry(o, id, x)])
        .filter(([, e]) => e !== null));
      legend.replaceChildren(...overlayLegend(o));
    }
    bar.dataset.overlay = o.stat || "off";
    view.schedule();
  }

  const choice = () => scalarChoice(scalar.value, index.value);

  async function recolour() {
    const stat = colour.value;
    bar.classList.add("yax-computing");
    try {
      const payload = GRAD_STATS.has(stat) ? { stat, ...choice() } : { stat };
      const key = JSON.stringify(payload);
      await request("overlay", payload, change);
      const now = GRAD_STATS.has(colour.value) ? { stat: colour.value, ...choice() } : { stat: colour.value };
      if (key === JSON.stringify(now)) paint();
      if (tabs.current() === "Values") show(); // the gradient beside the values comes or goes
    } catch (err) {
      failed(err);
    } finally {
      bar.classList.remove("yax-computing");
    }
  }

  function syncScalars() {
    const offered = model.get("_scalars") || [];
    const was = scalar.value;
    scalar.replaceChildren(...offered.map((s) => h("option", { value: s.name }, s.name === "loss" ? "loss (grad_of)"
      : s.name === "sum" ? "sum of output" : "logit")));
    if (offered.some((s) => s.name === was)) scalar.value = was;
    index.hidden = scalar.value !== "logit";
    gradNan.disabled = !offered.length;
  }

  function syncBatches() {
    const { names = [], current = "" } = model.get("_batches") || {};
    batch.replaceChildren(...names.map((n) => h("option", { value: n }, n)));
    batch.value = current;
    batch.disabled = names.length < 2;
  }

  /** Expand the calls around `id`, select it and scroll to it. */
  function reveal(id) {
    for (let p = view.tree.byId.get(id)?.parent; p !== undefined && p >= 0; p = view.tree.byId.get(p)?.parent) {
      view.expanded.add(p);
    }
    view.relayout();
    view.select(id, false);
    view.scrollTo(view.indexOf(id));
  }

  async function findNan(grad) {
    message.className = "yax-values-message";
    message.textContent = grad ? "taking the gradient and searching its backward pass…" : "searching…";
    try {
      const r = await request("nonfinite", grad ? choice() : {}, change);
      message.textContent = r.message;
      message.classList.add(r.found ? "yax-nan-found" : "yax-nan-none");
      if (!r.found || r.id === null) return;
      reveal(r.id);
      const call = view.tree.byId.get(r.id);
      if (r.eq !== null && call) { // the equation's row, when it runs directly in that call
        view.expanded.add(r.id);
        await view.loadEquations(call);
        view.relayout();
        if (view.indexOf(r.eq) >= 0) {
          view.select(r.eq, false);
          view.scrollTo(view.indexOf(r.eq));
        }
      }
      tabs.show("Values");
    } catch (err) {
      message.textContent = "";
      failed(err);
    }
  }

  batch.addEventListener("change", async () => {
    try {
      await request("batch", { name: batch.value }, change);
      show();
      paint();
    } catch (err) {
      syncBatches();
      failed(err);
    }
  });
  colour.addEventListener("change", recolour);
  const rescalar = () => {
    index.hidden = scalar.value !== "logit";
    if (GRAD_STATS.has(colour.value)) recolour();
  };
  scalar.addEventListener("change", rescalar);
  index.addEventListener("change", rescalar);
  nan.addEventListener("click", () => findNan(false));
  gradNan.addEventListener("click", () => findNan(true));
  on("change:_scalars", syncScalars);
  on("change:_batches", () => { syncBatches(); if (view.selected === null) idle(); });
  on("change:_values", show);
  on("change:_overlay", paint);
  syncBatches();
  syncScalars();
  idle();

  return {
    bar,
    /** The selection moved: fetch its values when the Values tab shows. */
    select: (id) => { if (tabs.current() === "Values") fetch(id); },
    /** The Values tab was shown. */
    shown: () => fetch(view.selected),
    /** A new model (`_tree`), its rows set: its own colours, and the values of the row still selected
     * (the view keeps the selection where its row still exists), shown stale until they come. */
    rowsChanged: () => {
      message.textContent = "";
      view.overlay = null;
      if (colour.value !== "off") recolour();
      else paint();
      if (view.selected === null) idle();
      else if (tabs.current() === "Values") fetch(view.selected);
      else pane.replaceChildren(); // filled when the tab is shown
    },
    dispose: () => {},
  };
}
