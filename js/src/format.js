// Formatting and colour helpers. No DOM here.

/** 1234567 -> "1.2M", 5300 -> "5.3k", 0 -> "". */
export function compact(n) {
  if (!n) return "";
  const abs = Math.abs(n);
  if (abs >= 1e9) return `${(n / 1e9).toFixed(1)}B`;
  if (abs >= 1e6) return `${(n / 1e6).toFixed(1)}M`;
  if (abs >= 1e3) return `${(n / 1e3).toFixed(1)}k`;
  return String(n);
}

/** A number for tables: 3 significant digits, exponent when tiny or huge. */
export function num(x) {
  if (x === null || x === undefined) return "–";
  if (x === 0) return "0";
  const a = Math.abs(x);
  return a < 1e-3 || a >= 1e5 ? x.toExponential(2) : x.toPrecision(3);
}

/** Divergence level 0..1 of a relative error on a log scale: 1e-7 -> 0, 1 -> 1. */
export function divergenceLevel(rel) {
  if (rel === null || rel === undefined) return null;
  if (!(rel > 1e-7)) return 0;
  return Math.min(1, (Math.log10(rel) + 7) / 7);
}

/** A CSS colour for a divergence level: green (same) -> yellow -> red. */
export function divergenceColor(level) {
  if (level === null) return "transparent";
  const hue = Math.round(120 * (1 - level));
  return `hsl(${hue}, 75%, 45%)`;
}

/** Float32 values from a DataView / ArrayBuffer / typed array (little-endian). */
export function floats(buf) {
  if (!buf) return new Float32Array(0);
  if (buf instanceof Float32Array) return buf;
  if (buf instanceof DataView) {
    const out = new Float32Array(buf.byteLength / 4);
    for (let i = 0; i < out.length; i++) out[i] = buf.getFloat32(i * 4, true);
    return out;
  }
  if (ArrayBuffer.isView(buf)) return floats(new DataView(buf.buffer, buf.byteOffset, buf.byteLength));
  if (buf instanceof ArrayBuffer) return floats(new DataView(buf));
  return new Float32Array(0);
}

/** [min, max] of the finite values, or null when there are none. */
export function bounds(values) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of values) {
    if (Number.isFinite(v)) {
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
  }
  return lo === Infinity ? null : [lo, hi];
}

/** A range to draw finite values in: their [min, max], [0, 1] when there are none, widened
 * when all are equal. For drawing only: label a range with `bounds`, which is not widened. */
export function extent(values) {
  const b = bounds(values);
  if (!b) return [0, 1];
  const [lo, hi] = b;
  return lo === hi ? [lo - 0.5, hi + 0.5] : [lo, hi];
}

/** Bars of a histogram in a `width` x `height` box: [{x, y, w, h}]. */
export function histogramBars(counts, width, height) {
  const max = Math.max(1, ...counts);
  const w = width / Math.max(1, counts.length);
  return counts.map((c, i) => {
    const h = c === 0 ? 0 : Math.max(1, (c / max) * height);
    return { x: i * w, y: height - h, w: Math.max(1, w - 1), h };
  });
}

/** Viridis-like colour ramp, t in 0..1 -> [r, g, b]. */
export function ramp(t) {
  const stops = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  const x = Math.min(1, Math.max(0, Number.isFinite(t) ? t : 0)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(x));
  const f = x - i;
  return stops[i].map((a, k) => Math.round(a + f * (stops[i + 1][k] - a)));
}

/** The histogram's caption from `hist` (`{lo, hi, n, nonfinite}`: the real range of the
 * differences). An unchanged output has no range to draw: it says so instead. `base`: what the
 * modified model was compared with ("original", or "previous": the step before). */
export function histCaption({ lo, hi, n, nonfinite = 0 }, base = "original") {
  const count = n === undefined ? "" : ` (${n.toLocaleString("en-US")} values)`;
  const diff = base === "previous" ? "modified − step before" : base === "original" ? "modified − original"
    : `model − reference “${base}”`;
  const text = lo === hi
    ? `${diff}: every difference is ${num(lo)}${lo === 0 ? ", unchanged" : ""}${count}`
    : `${diff}, from ${num(lo)} to ${num(hi)}${count}`;
  return nonfinite ? `${text}; ${nonfinite.toLocaleString("en-US")} NaN or infinite not counted` : text;
}

/** What part of an output a heatmap shows: the whole, or its first 2-D slice, every n-th
 * row/column (`heat`: `{label, step: [rows, cols], whole}`). */
export function heatPart({ label, step = [1, 1], whole }) {
  if (whole) return label;
  const every = (k, what) => (k > 1 ? `every ${k === 2 ? "2nd" : k === 3 ? "3rd" : `${k}th`} ${what}` : "");
  const sub = [every(step[0], "row"), every(step[1], "column")].filter(Boolean).join(", ");
  return sub ? `${label}, ${sub}` : label;
}

/** The |difference| heatmap's caption: the largest difference it shows, and, when the whole
 * output's (the table's max|Δ|) is larger, that one too, so the two never seem to disagree. */
export function diffCaption(shownMax, outputMax, whole) {
  const here = `|difference| (max ${num(shownMax)}${whole ? "" : " shown"})`;
  if (whole || outputMax === null || outputMax === undefined || !(outputMax > (shownMax ?? 0))) return here;
  return `${here}; the whole output's max is ${num(outputMax)}, outside what is shown`;
}
