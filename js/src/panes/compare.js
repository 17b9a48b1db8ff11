// The compare pane: the verdict, per-output statistics, the histogram of the differences and
// the heatmaps of original, modified and |difference| (from `_comparison`, docs/widget.md).
import { h } from "../dom.js";
import {
  bounds, diffCaption, divergenceColor, divergenceLevel, extent, floats, heatPart, histCaption, histogramBars, num, ramp,
} from "../format.js";

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

/** The ticks under the histogram: its real smallest and largest difference, and 0 when it lies
 * between (positions in % of the width). One value everywhere: that value, in the middle. */
export function histTicks({ lo, hi }) {
  if (lo === hi) return [{ at: 50, text: num(lo) }];
  const ticks = [{ at: 0, text: num(lo) }, { at: 100, text: num(hi) }];
  const zero = (100 * (0 - lo)) / (hi - lo);
  if (zero > 15 && zero < 85) ticks.push({ at: zero, text: "0" });
  return ticks;
}

function axis(ticks, cls) {
  return h("div", { class: `yax-axis ${cls}` }, ticks.map((t) => h("span", {
    class: "yax-tick", style: { left: `${t.at}%`, transform: `translateX(${t.at === 0 ? 0 : t.at === 100 ? -100 : -50}%)` },
  }, t.text)));
}

function histCanvas(hist, color, base) {
  const canvas = h("canvas", { class: "yax-hist", width: HIST_W, height: HIST_H });
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = color;
  // one value everywhere has no range to spread over: a single bar in the middle, and the caption says so
  const counts = hist.lo === hist.hi ? [0, hist.counts.reduce((a, b) => a + b, 0), 0] : hist.counts;
  for (const b of histogramBars(counts, HIST_W, HIST_H)) ctx.fillRect(b.x, b.y, b.w, b.h);
  return h("figure", { class: "yax-hist-fig" }, h("div", { class: "yax-hist-box" }, canvas, axis(histTicks(hist), "yax-hist-axis")),
    h("figcaption", {}, histCaption(hist, base)));
}

/** The colour scale of a heatmap: the ramp from `lo` to `hi` (the real values, not widened). */
function colourScale(lo, hi, label) {
  const stops = [0, 0.25, 0.5, 0.75, 1].map((t) => `rgb(${ramp(t).join(",")}) ${t * 100}%`).join(", ");
  return h("div", { class: "yax-scale", title: `colour scale of ${label}` },
    h("div", { class: "yax-scale-bar", style: { background: `linear-gradient(to right, ${stops})` } }),
    axis(lo === hi ? [{ at: 50, text: num(lo) }] : [{ at: 0, text: num(lo) }, { at: 100, text: num(hi) }], "yax-scale-axis"));
}

function heatmaps(heat, outputMax, [first, second] = ["original", "modified"]) {
  const a = floats(heat.original);
  const b = floats(heat.modified);
  const d = floats(heat.diff);
  const [lo, hi] = extent([...extent(a), ...extent(b)]);
  const [dlo, dhi] = extent(d);
  const dmax = (bounds(d) || [])[1]; // the caption says the real maximum, not the widened one
  const whole = heat.whole ?? true;
  const [vlo, vhi] = bounds([...(bounds(a) || []), ...(bounds(b) || [])]) || [0, 0];
  return h("div", {},
    h("div", { class: "yax-hint yax-heat-part" }, `heatmaps of ${heatPart({ ...heat, whole })}`),
    h("div", { class: "yax-heats" },
      heatCanvas(a, heat.rows, heat.cols, lo, hi, first),
      heatCanvas(b, heat.rows, heat.cols, lo, hi, second),
      heatCanvas(d, heat.rows, heat.cols, Math.min(0, dlo), dhi === dlo ? dlo + 1 : dhi,
        diffCaption(dmax, outputMax, whole))),
    h("div", { class: "yax-scales" }, colourScale(vlo, vhi, `${first} and ${second}`),
      colourScale(Math.min(0, dmax ?? 0), dmax ?? 0, "|difference|")));
}

/** The module outputs compared, in program order (row ids are document order): where the
 * difference starts and how it grows. `pathOf(id)` names a row; `onPick(id)` selects it. With
 * `columns` (a comparison with a reference): one relative-error column per model compared with
 * it, each model's first divergence marked in its own column. */
function boundaryTable(boundaries, firstId, { pathOf, onPick, columns = null }) {
  const cols = columns && columns.length ? columns : null;
  const ids = [...new Set([...Object.keys(boundaries), ...(cols || []).flatMap((c) => Object.keys(c.rel))])]
    .map(Number).sort((x, y) => x - y);
  if (!ids.length) return null;
  const MAX = 400;
  const rows = ids.slice(0, MAX).map((id) => {
    const b = boundaries[String(id)];
    const level = divergenceLevel(b ? b.rel : null);
    const path = pathOf(id) || `#${id}`;
    const first = id === firstId || (cols || []).some((c) => c.first_divergence_id === id);
    const relCells = cols ? cols.map((c) => {
      const r = c.rel[String(id)];
      const mark = c.first_divergence_id === id;
      return h("td", { class: mark ? "yax-first-cell" : "", title: mark ? `${c.name}: the first divergence` : "" },
        r === undefined ? "—" : `${num(r)}${mark ? " ◀" : ""}`);
    }) : [b ? stat(b, "rel") : h("td", {}, "—")];
    return h("tr", { class: `yax-boundary${first ? " yax-first-row" : ""}`, dataset: { id: String(id) },
      onclick: () => onPick(id), title: `${path}: select this call in the tree` },
    h("td", { class: "yax-boundary-path", style: { borderLeftColor: divergenceColor(level) } },
      path.includes("/") ? path.slice(path.indexOf("/") + 1) : path), // below the model's own name
    ...relCells, b ? stat(b, "max_abs") : h("td", {}, "—"), h("td", {}, b ? (b.allclose ? "✓" : "✗") : ""),
    h("td", {}, b ? stepsCell(b) : ""));
  });
  const heads = ["call", ...(cols ? cols.map((c) => `rel: ${c.name}${c.current && c.name !== "original" ? " (current)" : ""}`)
    : ["rel"]), "max|Δ|", "", "steps"];
  return h("details", { class: "yax-boundaries", open: true },
    h("summary", {}, `module outputs, in program order (${ids.length}${ids.length > MAX ? `, the first ${MAX} shown` : ""})`),
    h("table", { class: "yax-stats" }, h("tr", {}, heads.map((t) => h("th", t.startsWith("rel: ")
      ? { class: "yax-model-col" } : {}, t))), rows));
}

/** A statistic's cell: its value, or "undefined" with the reason as the tooltip (never a
 * number that was not computed). */
function stat(s, name) {
  const why = s.undefined && s.undefined[name];
  return why ? h("td", { class: "yax-undefined", title: why }, "undefined") : h("td", {}, num(s[name]));
}

/** A call in a scanned stack: how many steps, and the first that differs. */
function stepsCell(b) {
  if (!b.steps) return "";
  const n = b.steps.join("×");
  const same = b.first_step === null || b.first_step === undefined;
  const head = same ? `×${n}` : `×${n}, from ${b.first_step}`;
  const title = `compared at each of ${n} scan steps; ${same ? "every step is allclose"
    : `step ${b.first_step} is the first that differs`} (click for each step)`;
  if (!b.step_rel) return head;
  // expandable: each step's relative error (a click here does not select the row)
  return h("details", { class: "yax-steps", title, onclick: (e) => e.stopPropagation() }, h("summary", {}, head),
    h("div", { class: "yax-hint" }, b.step_rel.map((r, i) => `step ${i}: rel ${num(r)}`).join(" · ")));
}

/** Entries left out of the statistics (NaN or ±Inf in either model), said next to them. */
function nonfiniteNote(s) {
  if (!s.nonfinite) return null;
  return h("div", { class: "yax-hint" }, `${s.nonfinite} non-finite entries (NaN/±Inf) left out of the statistics`
    + (s.changed ? `, ${s.changed} of them changed` : ", the same in both"));
}

/** The parameters' gradients (`Explorer(..., grad_of=loss)`), the most changed first; or, with a
 * reference, the model's parameters against its weights (`title`). */
function gradTable(grads, title = "parameter gradients of the loss", foldWhenClose = false) {
  if (!grads) return null;
  const MAX = 40;
  const same = grads.every((g) => g.allclose);
  return h("details", { class: "yax-gradients", open: !(foldWhenClose && same) },
    h("summary", {}, `${title}, the most changed first (${grads.length}`
      + `${grads.length > MAX ? `, the first ${MAX} shown` : ""}${same ? ", all allclose" : ""})`),
    h("table", { class: "yax-stats" },
      h("tr", {}, ["parameter", "rel", "max|Δ|", "cos", ""].map((t) => h("th", {}, t))),
      grads.slice(0, MAX).map((g) => h("tr", {}, h("td", {}, g.name), stat(g, "rel"), stat(g, "max_abs"),
        stat(g, "cosine"), h("td", {}, g.allclose ? "✓" : "✗")))));
}

/** How the reference's modules were matched with the model's calls, and each model's verdict. */
function matchingNote(c) {
  const m = c.matching;
  if (!m) return null;
  const only = m.only_reference.length ? `; only in the reference: ${m.only_reference.slice(0, 4).join(", ")}`
    + `${m.only_reference.length > 4 ? ` and ${m.only_reference.length - 4} more` : ""}` : "";
  return h("div", { class: "yax-matching" },
    (c.columns || []).map((col) => h("div", { class: `yax-verdict ${col.allclose ? "yax-ok" : "yax-differs"}` },
      col.allclose ? `✓ ${col.name}: allclose to the reference` : `✗ ${col.name}: differs from the reference`,
      col.first_divergence ? h("span", {}, ", first at ", h("code", {}, col.first_divergence)) : null)),
    h("div", { class: "yax-hint", title: m.layouts.join("\n") },
      `${m.source}: ${m.calls} calls matched by name, ${m.only_model} only in the model${only}; `
      + `${m.weights} weights matched`
      + (m.layouts.length ? `; ${m.layouts.length} compared in another layout (hover)` : "")));
}

function statsTable(outputs) {
  return h("table", { class: "yax-stats" },
    h("tr", {}, ["output", "max|Δ|", "mean|Δ|", "rel", "cos", ""].map((t) => h("th", {}, t))),
    outputs.map((o) => h("tr", {}, h("td", {}, o.name), stat(o, "max_abs"), stat(o, "mean_abs"),
      stat(o, "rel"), stat(o, "cosine"), h("td", {}, o.allclose ? "✓" : "✗"))));
}

/** Compare with the original, the state before the last change, or a reference (`onBase(base)`). */
function baseChooser(base, onBase, references = []) {
  const select = h("select", { class: "yax-compare-base", "aria-label": "compare with" },
    h("option", { value: "original" }, "the original"),
    h("option", { value: "previous" }, "the step before (what the last change did)"),
    references.map((name) => h("option", { value: name }, `the reference “${name}”`)));
  select.value = base;
  select.addEventListener("change", () => onBase(select.value));
  return h("label", { class: "yax-hint yax-compare-with" }, "compare with ", select);
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
 * newer change is being compared (what is shown is the previous one); `undone`: see above;
 * `pathOf(id)` names a tree row, `onPick(id)` selects it (the per-call table). */
export function renderCompare(pane, c, { color = "#1976d2", busy = false, undone = false, pathOf = () => "",
  onPick = () => {}, base = "original", onBase = null, references = [] } = {}) {
  pane.classList.toggle("yax-stale", !!(busy && c.outputs));
  const choose = onBase ? baseChooser(base, onBase, references) : null;
  if (!c.outputs) {
    pane.replaceChildren(...[choose, h("div", { class: `yax-hint${busy ? " yax-comparing" : ""}` },
      emptyHint(c, { busy, undone }))].filter(Boolean));
    return;
  }
  const against = c.base === "previous" ? "the previous step" : c.reference ? `the reference “${c.reference}”`
    : "the original";
  const verdict = h("div", { class: `yax-verdict ${c.allclose ? "yax-ok" : "yax-differs"}` },
    c.allclose ? `✓ outputs allclose to ${against}` : `✗ outputs differ from ${against}`,
    c.first_divergence ? h("div", {}, "first divergence: ", h("code", {}, c.first_divergence)) : null,
    c.unavailable && c.unavailable.length ? h("div", { class: "yax-hint", title: c.unavailable.map((u) =>
      `${u.key}: ${u.why}`).join("\n") }, `${c.unavailable.length} call${c.unavailable.length > 1 ? "s" : ""} `
      + `not compared (inside while/cond/custom rules): ${c.unavailable[0].key}: ${c.unavailable[0].why}`) : null,
    h("div", { class: "yax-hint" }, `compiled and compared in ${c.seconds} s`
      + (c.rtol === undefined ? "" : c.matching && c.matching.atol_scaled
        ? ` · allclose: |Δ| ≤ ${num(c.atol)}·max|reference| + ${num(c.rtol)}·|reference|`
        : ` · allclose: |Δ| ≤ ${num(c.atol)} + ${num(c.rtol)}·|${c.reference ? "reference" : "original"}|`)));
  const plots = c.outputs.map((o) => h("div", { class: "yax-output" },
    h("div", { class: "yax-output-title" }, `${o.name} [${o.shape.join(", ")}]`),
    nonfiniteNote(o),
    histCanvas(o.hist, color, c.base),
    o.heat ? heatmaps(o.heat, o.max_abs, c.reference ? ["reference", "model"] : undefined) : null));
  const comparing = busy ? h("div", { class: "yax-hint yax-comparing" },
    "Compiling and comparing the modified model… (below: the previous comparison)") : null;
  const table = boundaryTable(c.boundaries || {}, c.first_divergence_id, { pathOf, onPick, columns: c.columns });
  pane.replaceChildren(...[comparing, choose, verdict, matchingNote(c), statsTable(c.outputs), gradTable(c.gradients),
    gradTable(c.weights, "parameters against the reference's weights", true), ...plots, table].filter(Boolean));
}
