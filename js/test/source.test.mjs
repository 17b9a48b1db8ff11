// The Source tab's content (js/src/panes/source.js): the kernel's lines numbered with the node's own
// marked, or the kernel's sentence where it has none. In a real page: tests/e2e/test_source_e2e.py.
import assert from "node:assert/strict";
import { test } from "node:test";
import { JSDOM } from "jsdom";

const { window } = new JSDOM("<!doctype html><html><body></body></html>");
globalThis.document = window.document;
const { createSourcePane, sourceView } = await import("../src/panes/source.js");

const reply = { id: 3, file: "model.py", path: "/work/model.py", line: 10, note: "",
  lines: [[8, "class M:"], [9, "    def f(self, x):"], [10, "        return x + 1"], [11, ""]] };

test("the lines are numbered, the node's own marked, the whole path in the heading's tooltip", () => {
  const [head, body] = sourceView(reply);
  assert.equal(head.textContent, "model.py:10");
  assert.equal(head.title, "/work/model.py");
  const rows = [...body.querySelectorAll(".yax-source-line")];
  assert.deepEqual(rows.map((r) => r.dataset.line), ["8", "9", "10", "11"]);
  assert.deepEqual(rows.filter((r) => r.classList.contains("yax-source-here")).map((r) => r.dataset.line), ["10"]);
  assert.equal(rows[2].textContent, "10         return x + 1");
  assert.equal(rows[0].querySelector(".yax-source-no").textContent, " 8"); // numbers right-aligned
});

test("without lines, the kernel's sentence and nothing else", () => {
  const els = sourceView({ id: 3, file: "", path: "", line: 0, lines: [], note: "JAX recorded no line of your code." });
  assert.equal(els.length, 1);
  assert.equal(els[0].textContent, "JAX recorded no line of your code.");
});

test("the pane asks once per row and shows only the latest row's answer", async () => {
  const el = document.createElement("div");
  const asked = [];
  let release;
  const slow = new Promise((r) => { release = r; });
  const request = async (type, { id }) => {
    asked.push([type, id]);
    if (id === 1) await slow;
    return { ...reply, id, file: `f${id}.py` };
  };
  const pane = createSourcePane({ el, request });
  const first = pane.show(1);
  await pane.show(2);
  release();
  await first;
  assert.equal(el.querySelector(".yax-source-head").textContent, "f2.py:10"); // row 1's late answer is dropped
  await pane.show(2);
  assert.deepEqual(asked, [["source", 1], ["source", 2]]);
  await pane.show(null);
  assert.match(el.textContent, /^Select a row/);
});
