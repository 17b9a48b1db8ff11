// The comparison pane and the tree's tooltips say what was not computed, and how a scanned
// stack's call was compared (its steps, the first that differs), in a DOM (jsdom).
import assert from "node:assert/strict";
import { test } from "node:test";
import { JSDOM } from "jsdom";

const { window } = new JSDOM("<!doctype html><html><body></body></html>", { pretendToBeVisual: true });
for (const k of ["window", "document"]) globalThis[k] = window[k];
window.HTMLCanvasElement.prototype.getContext = () => ({ fillRect() {}, createImageData: (w, h) => ({ width: w, height: h, data: new Uint8ClampedArray(w * h * 4) }), putImageData() {} });
const { renderCompare } = await import("../src/panes/compare.js");
const { boundaryTitle } = await import("../src/treerow.js");

const undefinedRel = { rel: null, max_abs: 0.455, mean_abs: 0.1, cosine: null, allclose: false, nonfinite: 12,
  changed: 0, undefined: { rel: "the original is 0 at every finite entry", cosine: "the original is 0 at every finite entry" } };

test("a statistic that could not be computed reads 'undefined' with its reason, never 0 or a tick", () => {
  const pane = document.createElement("div");
  renderCompare(pane, {
    allclose: false, first_divergence: "T5/decoder/block_0 at scan step 0", first_divergence_id: 3, seconds: 1,
    outputs: [{ name: "out", shape: [2, 4], ...undefinedRel, hist: { counts: [1], lo: 0, hi: 1, n: 1, nonfinite: 12 }, heat: null }],
    boundaries: { 3: { rel: 0.1, max_abs: 0.2, allclose: false, undefined: {}, steps: [4], step_rel: [0.1, 0, 0, 0], first_step: 0 } },
    unavailable: [{ id: 5, key: "T5/loop/relu", why: "it runs inside the `while` in `T5`: …" }],
    gradients: [{ name: "['params']['wi']['kernel']", rel: 0.3, max_abs: 1.8, cosine: 0.9, allclose: false, undefined: {} }],
  });
  assert.match(pane.querySelector(".yax-gradients").textContent, /\['params'\]\['wi'\]\['kernel'\]0\.3001\.800\.900✗/);
  const cells = [...pane.querySelectorAll(".yax-undefined")];
  assert.equal(cells.length, 2);
  assert.match(cells[0].title, /original is 0/);
  assert.match(pane.textContent, /12 non-finite entries \(NaN\/±Inf\) left out of the statistics, the same in both/);
  assert.match(pane.textContent, /×4, from 0/);
  assert.match(pane.querySelector(".yax-steps").textContent, /step 0: rel 0\.100 · step 1: rel 0/);
  assert.match(pane.textContent, /first divergence: T5\/decoder\/block_0 at scan step 0/);
  assert.match(pane.textContent, /1 call not compared/);
  const row = pane.querySelector(".yax-stats tr:nth-child(2)");
  assert.ok(!row.textContent.includes("✓"));
});

test("a compared call's tooltip says why an error is undefined and over how many steps it was compared", () => {
  assert.match(boundaryTitle({ rel: null, max_abs: 1, undefined: { rel: "no finite entries" } }),
    /relative error undefined \(no finite entries\)/);
  assert.match(boundaryTitle({ rel: 0.5, max_abs: 1, undefined: {}, steps: [4], first_step: 2 }),
    /over 4 scan steps \(first differs at step 2\)/);
});

test("a comparison with a reference: one column per model, each first divergence in its column, the matching said", () => {
  const pane = document.createElement("div");
  let chosen = null;
  renderCompare(pane, {
    allclose: false, first_divergence: "GPT/h/0/ln_1 ↔ transformer.h.0.ln_1", first_divergence_id: 4, seconds: 1,
    base: "pytorch", reference: "pytorch",
    outputs: [{ name: "out", shape: [2], rel: 0.2, max_abs: 0.3, mean_abs: 0.1, cosine: 0.9, allclose: false,
      undefined: {}, hist: { counts: [1], lo: 0, hi: 1, n: 1 }, heat: null }],
    boundaries: { 2: { rel: 1e-7, max_abs: 1e-7, allclose: true, undefined: {} },
      4: { rel: 0.01, max_abs: 0.05, allclose: false, undefined: {} } },
    columns: [{ name: "original", allclose: true, first_divergence: null, first_divergence_id: null, rel: { 2: 1e-7, 4: 2e-7 } },
      { name: "current", allclose: false, first_divergence: "GPT/h/0/ln_1", first_divergence_id: 4, rel: { 2: 1e-7, 4: 0.01 } }],
    matching: { source: "torch GPT2LMHeadModel", calls: 27, only_model: 15, only_reference: ["transformer.drop"],
      layouts: ["GPT/wpe: broadcast"], weights: 29, only_model_weights: [] },
    weights: [{ name: "h/0/ln_1/scale", rel: 0, max_abs: 0, cosine: 1, allclose: true, undefined: {} }],
  }, { base: "pytorch", references: ["pytorch"], onBase: (b) => { chosen = b; } });
  const heads = [...pane.querySelectorAll(".yax-boundaries th")].map((t) => t.textContent);
  assert.deepEqual(heads, ["call", "rel: original", "rel: current", "max|Δ|", "", "steps"]);
  const marked = pane.querySelector(".yax-first-cell");
  assert.match(marked.textContent, /0\.0100 ◀/);
  assert.match(marked.title, /current: the first divergence/);
  assert.match(pane.textContent, /✓ original: allclose to the reference/);
  assert.match(pane.textContent, /✗ current: differs from the reference, first at GPT\/h\/0\/ln_1/);
  assert.match(pane.textContent, /torch GPT2LMHeadModel: 27 calls matched by name, 15 only in the model; only in the reference: transformer\.drop; 29 weights matched; 1 compared in another layout/);
  assert.match(pane.textContent, /outputs differ from the reference “pytorch”/);
  assert.match(pane.querySelector(".yax-gradients summary").textContent, /parameters against the reference's weights/);
  const select = pane.querySelector(".yax-compare-base");
  assert.deepEqual([...select.options].map((o) => o.value), ["original", "previous", "pytorch"]);
  assert.equal(select.value, "pytorch");
  select.value = "original";
  select.dispatchEvent(new window.Event("change"));
  assert.equal(chosen, "original");
});
