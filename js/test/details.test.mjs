// A row data provider's tab (js/src/panes/details.js): Python's heading, table and note, painted
// as given; one request per row, the latest row's answer shown. In a real page:
// tests/e2e/test_details_e2e.py.
import assert from "node:assert/strict";
import { test } from "node:test";
import { JSDOM } from "jsdom";

const { window } = new JSDOM("<!doctype html><html><body></body></html>");
globalThis.document = window.document;
const { createDetailsPane, detailsView } = await import("../src/panes/details.js");

const reply = { id: 3, provider: "Cost", heading: "module_call MLP/Dense_0", columns: ["", "", ""],
  rows: [["FLOPs (matrix products, convolutions)", "128", "one run"], ["outputs", "128 bytes", "what one run returns"]],
  note: "Counted from the traced program." };

test("the heading, every row's cells as Python wrote them, the note", () => {
  const [head, table, note] = detailsView(reply);
  assert.equal(head.textContent, "module_call MLP/Dense_0");
  assert.equal(table.querySelector("thead"), null); // no column names given: no header row
  // a list: the label, then the value with its explanation under it
  const rows = [...table.querySelectorAll("tbody tr")].map((tr) => [tr.children[0].textContent,
    ...[...tr.children[1].children].map((c) => c.textContent)]);
  assert.deepEqual(rows, reply.rows);
  assert.equal(table.querySelector(".yax-details-more").textContent, "one run");
  assert.equal(table.querySelector("tbody th").getAttribute("scope"), "row");
  assert.equal(note.textContent, "Counted from the traced program.");
});

test("named columns make a header row; no note, no note element", () => {
  const els = detailsView({ ...reply, columns: ["what", "count", "how"], note: "" });
  assert.equal(els.length, 2);
  assert.deepEqual([...els[1].querySelectorAll("thead th")].map((c) => c.textContent), ["what", "count", "how"]);
  assert.deepEqual([...els[1].querySelectorAll("tbody tr")[0].children].map((c) => c.textContent), reply.rows[0]);
});

test("the pane asks once per row, names its provider, and shows only the latest row's answer", async () => {
  const el = document.createElement("div");
  const asked = [];
  let release;
  const slow = new Promise((r) => { release = r; });
  const request = async (type, payload) => {
    asked.push([type, payload]);
    if (payload.id === 1) await slow;
    return { ...reply, id: payload.id, heading: `row ${payload.id}` };
  };
  const pane = createDetailsPane({ el, request, provider: "Cost" });
  const first = pane.show(1);
  await pane.show(2);
  release();
  await first;
  assert.equal(el.querySelector(".yax-details-head").textContent, "row 2"); // the late reply for row 1 is dropped
  await pane.show(2); // the same row: not asked again
  assert.deepEqual(asked, [["details", { provider: "Cost", id: 1 }], ["details", { provider: "Cost", id: 2 }]]);
  await pane.show(null);
  assert.match(el.textContent, /Select a row to see its cost/);
});

test("a failure shows the kernel's message and the row is asked again next time", async () => {
  const el = document.createElement("div");
  let fail = true;
  const pane = createDetailsPane({ el, provider: "Cost", request: async () => {
    if (fail) throw new Error("Node 9 is not a node of the current model.");
    return reply;
  } });
  await pane.show(9);
  assert.equal(el.querySelector(".yax-error").textContent, "Node 9 is not a node of the current model.");
  fail = false;
  await pane.show(9);
  assert.equal(el.querySelector(".yax-details-head").textContent, "module_call MLP/Dense_0");
});
