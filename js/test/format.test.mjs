import assert from "node:assert/strict";
import { test } from "node:test";
import {
  bounds, compact, divergenceColor, divergenceLevel, extent, floats, histogramBars, num, ramp,
} from "../src/format.js";

test("compact parameter counts", () => {
  assert.equal(compact(0), "");
  assert.equal(compact(999), "999");
  assert.equal(compact(5300), "5.3k");
  assert.equal(compact(85_000_000), "85.0M");
});

test("num uses exponents for tiny and huge values", () => {
  assert.equal(num(null), "–");
  assert.equal(num(0), "0");
  assert.equal(num(0.5), "0.500");
  assert.equal(num(1.5e-6), "1.50e-6");
});

test("divergence is on a log scale from 1e-7 to 1 and coloured green to red", () => {
  assert.equal(divergenceLevel(undefined), null);
  assert.equal(divergenceLevel(0), 0);
  assert.equal(divergenceLevel(1e-9), 0);
  assert.ok(Math.abs(divergenceLevel(10 ** -3.5) - 0.5) < 1e-9);
  assert.equal(divergenceLevel(100), 1);
  assert.equal(divergenceColor(0), "hsl(120, 75%, 45%)");
  assert.equal(divergenceColor(1), "hsl(0, 75%, 45%)");
  assert.equal(divergenceColor(null), "transparent");
});

test("floats reads little-endian float32 from DataView, ArrayBuffer and typed arrays", () => {
  const src = new Float32Array([1.5, -2, 3.25]);
  assert.deepEqual([...floats(new DataView(src.buffer))], [1.5, -2, 3.25]);
  assert.deepEqual([...floats(src.buffer)], [1.5, -2, 3.25]);
  assert.deepEqual([...floats(new Uint8Array(src.buffer, 4, 8))], [-2, 3.25]);
  assert.equal(floats(undefined).length, 0);
});

test("bounds are the real range of the finite values; extent widens a constant for drawing", () => {
  assert.deepEqual(bounds([3, NaN, -1, Infinity]), [-1, 3]);
  assert.deepEqual(bounds([0.1, 0.1]), [0.1, 0.1]);
  assert.equal(bounds([NaN]), null);
});

test("extent ignores non-finite values and widens a constant", () => {
  assert.deepEqual(extent([3, NaN, -1, Infinity]), [-1, 3]);
  assert.deepEqual(extent([2, 2]), [1.5, 2.5]);
  assert.deepEqual(extent([]), [0, 1]);
});

test("histogram bars fill the box, tallest bar full height, empty bins zero", () => {
  const bars = histogramBars([0, 5, 10], 300, 100);
  assert.equal(bars.length, 3);
  assert.deepEqual(bars.map((b) => b.h), [0, 50, 100]);
  assert.deepEqual(bars.map((b) => b.x), [0, 100, 200]);
  assert.equal(bars[2].y, 0);
});

test("ramp clamps and interpolates", () => {
  assert.deepEqual(ramp(-1), [68, 1, 84]);
  assert.deepEqual(ramp(2), [253, 231, 37]);
  assert.deepEqual(ramp(NaN), [68, 1, 84]);
});
