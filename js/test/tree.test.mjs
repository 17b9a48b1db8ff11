import assert from "node:assert/strict";
import { test } from "node:test";
import {
  ancestorsOf, buildTree, equationNodes, expandable, filterKeep, initialExpanded, visibleRows,
} from "../src/tree.js";

// [id, parent, kind, name, type, attrs, in, out, params, neq, fields]
const ROWS = [
  [1, -1, "module_call", "Model", "Model", "", "f32[2]", "f32[2]", 30, 1],
  [2, 1, "module_call", "Block_0", "Block", "", "f32[2]", "f32[2]", 20, 0],
  [3, 2, "module_call", "Dense_0", "Dense", "features=2", "f32[2]", "f32[2]", 6, 2, "features=2 use_bias=True"],
  [6, 2, "activation", "gelu", "gelu", "", "f32[2]", "f32[2]", 0, 3],
  [7, 1, "module_call", "Block_1", "Block", "", "f32[2]", "f32[2]", 10, 0],
  [8, 7, "module_call", "Dense_0", "Dense", "features=2", "f32[2]", "f32[2]", 6, 2],
];

test("buildTree links children in document order with depths", () => {
  const t = buildTree(ROWS);
  assert.deepEqual(t.roots.map((n) => n.id), [1]);
  assert.deepEqual(t.byId.get(2).children.map((n) => n.id), [3, 6]);
  assert.deepEqual([...t.byId.values()].map((n) => n.depth), [0, 1, 2, 2, 1, 2]);
  assert.equal(t.byId.get(3).attrs, "features=2");
  assert.equal(t.byId.get(3).fields, "features=2 use_bias=True");
  assert.equal(t.byId.get(2).fields, "");
});

test("visibleRows follows the expanded set; equations come after the calls", () => {
  const t = buildTree(ROWS);
  assert.deepEqual(visibleRows(t, new Set()).map((n) => n.id), [1]);
  assert.deepEqual(visibleRows(t, new Set([1])).map((n) => n.id), [1, 2, 7]);
  const eqs = new Map([[1, equationNodes(t.byId.get(1), [[100, "add", "f32[2]", "f32[2]", ""]])]]);
  assert.deepEqual(visibleRows(t, new Set([1, 2]), eqs).map((n) => n.id), [1, 2, 3, 6, 7, 100]);
  const eq = eqs.get(1)[0];
  assert.equal(eq.depth, 1);
  assert.equal(expandable(eq), false);
  assert.equal(expandable(t.byId.get(6)), true); // an activation with equations
});

test("initialExpanded opens the top levels only", () => {
  const t = buildTree(ROWS);
  assert.deepEqual([...initialExpanded(t, 2)].sort(), [1, 2, 7]);
  assert.deepEqual([...initialExpanded(t, 1)], [1]);
});

test("ancestorsOf collects every ancestor once, not the ids", () => {
  const t = buildTree(ROWS);
  const up = ancestorsOf([3, 8, 6], (i) => t.byId.get(i)?.parent);
  assert.deepEqual([...up].sort(), [1, 2, 7]);
  assert.deepEqual([...ancestorsOf([1], (i) => t.byId.get(i)?.parent)], []);
});

test("filterKeep keeps matches and their ancestors; visibleRows shows them expanded", () => {
  const t = buildTree(ROWS);
  assert.equal(filterKeep(t, "  "), null);
  const keep = filterKeep(t, "GELU");
  assert.deepEqual([...keep].sort(), [1, 2, 6]);
  assert.deepEqual(visibleRows(t, new Set(), new Map(), keep).map((n) => n.id), [1, 2, 6]);
  assert.deepEqual([...filterKeep(t, "dense")].sort(), [1, 2, 3, 7, 8]);
});

test("a fully expanded 48-layer tree (~1000 rows) is built and flattened quickly", () => {
  const rows = [[0, -1, "module_call", "Model", "Model", "", "", "", 0, 0]];
  let id = 1;
  for (let l = 0; l < 48; l++) {
    const b = id++;
    rows.push([b, 0, "module_call", `Block_${l}`, "Block", "", "", "", 0, 0]);
    for (let k = 0; k < 20; k++) rows.push([id++, b, "module_call", `Dense_${k}`, "Dense", "", "", "", 0, 2]);
  }
  const t0 = performance.now();
  const tree = buildTree(rows);
  const all = new Set(tree.byId.keys());
  const visible = visibleRows(tree, all);
  const ms = performance.now() - t0;
  assert.equal(visible.length, rows.length);
  assert.equal(visible[2].depth, 2);
  assert.ok(ms < 100, `took ${ms} ms`);
  const keep = filterKeep(tree, "Block_47");
  const shown = visibleRows(tree, all, new Map(), keep);
  assert.equal(shown[0].name, "Model");
  assert.equal(shown[1].name, "Block_47");
});
