// Pure helpers behind the comparison pane and the tree: honest captions for the comparison, what the query box says
// about a result, the path filter, "only matches" and match navigation.
import assert from "node:assert/strict";
import { test } from "node:test";
import { diffCaption, heatPart, histCaption } from "../src/format.js";
import { resultText } from "../src/querybox.js";
import { callRow, fixtureRecords } from "../src/rows.js";
import { allExpandable, bothKept, buildTree, filterKeep, matchKeep, nextIndex, visibleRows } from "../src/tree.js";

test("an unchanged output's histogram says so instead of drawing a made-up range", () => {
  assert.equal(histCaption({ lo: 0, hi: 0, n: 1024 }), "modified − original: every difference is 0, unchanged (1,024 values)");
  assert.equal(histCaption({ lo: 0.5, hi: 0.5, n: 2 }), "modified − original: every difference is 0.500 (2 values)");
  assert.equal(histCaption({ lo: -0.3, hi: 0.3, n: 10, nonfinite: 2 }),
    "modified − original, from -0.300 to 0.300 (10 values); 2 NaN or infinite not counted");
  assert.doesNotMatch(histCaption({ lo: 0, hi: 0, n: 4 }), /0\.500/);
  assert.equal(histCaption({ lo: -1, hi: 2, n: 3 }, "previous"), "modified − step before, from -1.00 to 2.00 (3 values)");
});

test("the heatmap says which part of the output it shows, and the whole output's max when larger", () => {
  assert.equal(heatPart({ label: "logits", step: [1, 1], whole: true }), "logits");
  assert.equal(heatPart({ label: "logits[0]", step: [1, 1], whole: false }), "logits[0]");
  assert.equal(heatPart({ label: "logits[0]", step: [2, 4], whole: false }), "logits[0], every 2nd row, every 4th column");
  assert.equal(diffCaption(5.08, 5.08, false), "|difference| (max 5.08 shown)");
  assert.equal(diffCaption(5.08, 6.04, false),
    "|difference| (max 5.08 shown); the whole output's max is 6.04, outside what is shown");
  assert.equal(diffCaption(0, 0, true), "|difference| (max 0)");
});

test("the query box names what a query returned: matches, a value, strings, where an empty one stops", () => {
  assert.deepEqual(resultText({}), { text: "", title: "", explain: "" });
  assert.equal(resultText({ kind: "nodes", count: 1 }).text, "1 match");
  assert.equal(resultText({ kind: "nodes", count: 16 }).text, "16 matches");
  assert.equal(resultText({ kind: "value", value: 51 }).text, "= 51");
  assert.equal(resultText({ kind: "value", value: true }).text, "= true");
  const v = resultText({ kind: "values", count: 30, values: ["", "Model", "Model/Dense_0"] });
  assert.equal(v.text, "30 values (not nodes: nothing to highlight)");
  assert.match(v.title, /^\nModel\nModel\/Dense_0\n… and 27 more$/);
  const e = resultText({ kind: "nodes", count: 0, explain: "1  //a\n0  //a/b   <- stops matching here" });
  assert.equal(e.text, "0 matches");
  assert.match(e.explain, /yax\.explain.*\n1  \/\/a\n0  \/\/a\/b   <- stops matching here/s);
});

const ROWS = [
  callRow({ id: 1, parent: -1, name: "Model", type: "Model", neq: 1 }),
  callRow({ id: 2, parent: 1, name: "layer", type: "Seq" }),
  callRow({ id: 3, parent: 2, name: "3", type: "Layer" }),
  callRow({ id: 4, parent: 3, name: "attention", type: "Attention", neq: 2 }),
  callRow({ id: 5, parent: 2, name: "4", type: "Layer" }),
  callRow({ id: 6, parent: 5, name: "attention", type: "Attention", neq: 2 }),
];

test("the filter finds rows by path as well as by name or type", () => {
  const tree = buildTree(fixtureRecords(ROWS));
  assert.equal(tree.byId.get(4).path, "Model/layer/3/attention");
  assert.deepEqual([...filterKeep(tree, "layer/3/attention")].sort(), [1, 2, 3, 4]);
  assert.deepEqual([...filterKeep(tree, "LAYER/4")].sort(), [1, 2, 5, 6]);
  assert.equal(filterKeep(tree, "nothing/like/this").size, 0);
});

test("only matches keeps the matched calls (an equation's call) and their ancestors; with the filter, both", () => {
  const tree = buildTree(fixtureRecords(ROWS));
  const keep = matchKeep(tree, [6, 900], { 900: 4 });
  assert.deepEqual([...keep].sort(), [1, 2, 3, 4, 5, 6]);
  assert.deepEqual([...matchKeep(tree, [6], {})].sort(), [1, 2, 5, 6]);
  assert.deepEqual([...bothKept(matchKeep(tree, [6], {}), filterKeep(tree, "layer/3"))].sort(), [1, 2]);
  assert.equal(bothKept(null, null), null);
});

test("expand all opens every call; next/previous match wrap around", () => {
  const tree = buildTree(fixtureRecords(ROWS));
  const all = allExpandable(tree);
  assert.deepEqual([...all].sort(), [1, 2, 3, 4, 5, 6]);
  const visible = visibleRows(tree, all);
  const set = new Set([4, 6]);
  const ids = (i) => visible[i].id;
  assert.equal(ids(nextIndex(visible, set, -1, 1)), 4);
  assert.equal(ids(nextIndex(visible, set, visible.findIndex((n) => n.id === 4), 1)), 6);
  assert.equal(ids(nextIndex(visible, set, visible.findIndex((n) => n.id === 6), 1)), 4); // wraps
  assert.equal(ids(nextIndex(visible, set, -1, -1)), 6);
  assert.equal(nextIndex(visible, new Set([99]), 0, 1), -1);
});
