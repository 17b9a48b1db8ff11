// The values pane's pure helpers (js/src/panes/values.js): captions, the rows' colours and the
// heatmap's pixels. What they draw in a real page is tested in tests/e2e/test_values_e2e.py.
import assert from "node:assert/strict";
import { test } from "node:test";
import { ramp } from "../src/format.js";
import { diverging, heatPixels, overlayColor, overlayEntry, scalarChoice, valuesCaption } from "../src/panes/values.js";

test("the histogram's caption says the real range, one value, or none", () => {
  assert.equal(valuesCaption({ lo: -1.5, hi: 2, n: 1000 }), "values from -1.50 to 2.00 (1,000 finite)");
  assert.equal(valuesCaption({ lo: 0, hi: 0, n: 12 }), "every finite value is 0 (12 values)");
  assert.equal(valuesCaption({ lo: null, hi: null, n: 0, nonfinite: 4 }), "no finite values; 4 NaN or infinite not counted");
  assert.match(valuesCaption({ lo: 1, hi: 3, n: 6, nonfinite: 2 }), /; 2 NaN or infinite not counted$/);
});

test("rows are coloured by their statistic: a log scale for the norm, fractions linear, non-finite red", () => {
  const rgb = (t) => `rgb(${ramp(t).join(", ")})`;
  assert.equal(overlayColor("norm", 1, 1, 100), rgb(0));
  assert.equal(overlayColor("norm", 10, 1, 100), rgb(0.5)); // halfway on a log scale
  assert.equal(overlayColor("norm", 100, 1, 100), rgb(1));
  assert.equal(overlayColor("norm", 0, 0, 100), rgb(0)); // a zero norm at the bottom
  assert.equal(overlayColor("zeros", 0.25, 0, 1), rgb(0.25));
  assert.equal(overlayColor("nonfinite", 0, 0, 1), "hsl(120, 45%, 45%)");
  assert.equal(overlayColor("nonfinite", 0.01, 0, 1), "hsl(0, 80%, 50%)");
  assert.equal(overlayColor("norm", null, 0, 1), null); // no value computed: no colour
});

test("a heatmap paints NaN and Inf apart from the smallest value", () => {
  const { px, bad } = heatPixels(Float32Array.from([0, 1, Infinity, NaN]), 2, 2);
  assert.equal(bad, 2);
  assert.deepEqual([...px.slice(0, 3)], ramp(0));
  assert.deepEqual([...px.slice(4, 7)], ramp(1));
  assert.deepEqual([...px.slice(8, 11)], [230, 30, 60]);
  assert.deepEqual([...px.slice(12, 15)], [230, 30, 60]);
});

test("gradient norms are on the norm's log scale; gradient × activation on a signed diverging scale", () => {
  const rgb = (t) => `rgb(${ramp(t).join(", ")})`;
  assert.equal(overlayColor("grad", 10, 1, 100), rgb(0.5));
  assert.equal(overlayColor("gxa", 2, -4, 1), `rgb(${diverging(0.5).join(", ")})`); // scaled by max |x| = 4
  assert.equal(overlayColor("gxa", -4, -4, 1), `rgb(${diverging(-1).join(", ")})`);
  assert.deepEqual(diverging(0), [236, 236, 236]);
  assert.deepEqual(diverging(1), [200, 40, 40]);
  assert.deepEqual(diverging(-1), [40, 90, 200]);
  assert.equal(overlayColor("gxa", 0, 0, 0), `rgb(${diverging(0).join(", ")})`); // all zero: the middle, no NaN
  assert.equal(overlayColor("grad", null, 0, 1), null);
});

test("a row without a gradient gets a hatched mark saying why, never a number", () => {
  const o = { stat: "grad", label: "gradient norm", lo: 1, hi: 4, why: { 3: "its gradient is zero everywhere" },
    scalar: { label: "d logits[0, -1, 7] (argmax) / d output of each row, batch `example`" } };
  assert.deepEqual(overlayEntry(o, "3", null), { color: "transparent", title: "no gradient: its gradient is zero everywhere",
    x: -Infinity, nonfinite: 0 });
  // NaN or Inf in a row's gradient is carried to the row, which marks it visibly
  assert.equal(overlayEntry({ ...o, nonfinite: { 4: 12 } }, "4", 2).nonfinite, 12);
  assert.equal(overlayEntry({ ...o, why: { 3: "every value of its gradient is NaN or Inf" }, nonfinite: { 3: 96 } },
    "3", null).nonfinite, 96);
  assert.equal(overlayEntry({ ...o, why: {} }, "5", null), null); // nothing said: nothing drawn
  const e = overlayEntry(o, "4", 2);
  assert.match(e.title, /^gradient norm: 2\.00 \(d logits\[0, -1, 7\] \(argmax\)/);
  const s = overlayEntry({ ...o, stat: "gxa", label: "gradient × activation", lo: -3, hi: 1 }, "4", -3);
  assert.equal(s.x, 3); // a folded run shows the largest magnitude
});

test("the scalar chosen: a logit's index is a whole number or empty for the argmax", () => {
  assert.deepEqual(scalarChoice("logit", ""), { scalar: "logit", index: null });
  assert.deepEqual(scalarChoice("logit", " 12 "), { scalar: "logit", index: 12 });
  assert.deepEqual(scalarChoice("sum", "3"), { scalar: "sum", index: null }); // only a logit takes one
  assert.throws(() => scalarChoice("logit", "-1"), /whole number from 0/);
  assert.throws(() => scalarChoice("logit", "1.5"), /whole number from 0/);
});
