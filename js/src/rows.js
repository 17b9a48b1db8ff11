// The row format: the positional arrays Python sends (`call_row` in yax_widget/_payloads.py for
// call rows, its `expand` reply for equation rows; docs/widget.md). This is the only module
// that knows the positions: everything else reads the named records made here.

/** Columns of a call row, `_tree.rows[i]`. */
export const CALL = Object.freeze({
  id: 0, parent: 1, kind: 2, name: 3, type: 4, attrs: 5, ins: 6, outs: 7, params: 8, neq: 9, fields: 10, copies: 11,
  policy: 12, fold: 13, sharding: 14, source: 15,
});

/** Columns of an equation row, an `expand` reply's `rows[i]`. */
export const EQUATION = Object.freeze({ id: 0, primitive: 1, ins: 2, outs: 3, params: 4, source: 5 });

/** The rows of a `_tree` / `_original_tree` trait value (none before the first). */
export function treeRows(trait) {
  return (trait && trait.rows) || [];
}

/** A call row as a named record. `fields` (every field, the tooltip) may be absent. */
export function callRecord(row) {
  return {
    id: row[CALL.id], parent: row[CALL.parent], kind: row[CALL.kind], name: row[CALL.name],
    type: row[CALL.type], attrs: row[CALL.attrs], ins: row[CALL.ins], outs: row[CALL.outs],
    params: row[CALL.params], neq: row[CALL.neq], fields: row[CALL.fields] || "", eq: false,
    copies: row[CALL.copies] || 1, policy: row[CALL.policy] || "",
    fold: row[CALL.fold] ?? null, // the structure key: equal for calls alike (tree.js folds runs of them)
    sharding: row[CALL.sharding] || "", // its parameters' PartitionSpecs: "kernel=P(None,'model')", "" unsplit
    source: row[CALL.source] || "", // the user's line calling it: "model.py:12", "" where none is known
  };
}

/** An equation row of the call `parentId` as a record shaped like a call's: the primitive is
 * its name, its parameters are both what the row shows and its tooltip. */
export function equationRecord(row, parentId) {
  const params = row[EQUATION.params];
  return {
    id: row[EQUATION.id], parent: parentId, kind: "equation", name: row[EQUATION.primitive], type: "",
    attrs: params, ins: row[EQUATION.ins], outs: row[EQUATION.outs], params: 0, neq: 0, fields: params, eq: true,
    source: row[EQUATION.source] || "", // the user's line making it
  };
}

const CALL_DEFAULTS = { kind: "module_call", type: "", attrs: "", ins: "", outs: "", params: 0, neq: 0, fields: "",
  copies: 1, policy: "", fold: null, sharding: "", source: "" };

/** The inverse of `callRecord`, for fixtures: a positional call row from named fields
 * (`id`, `parent` and `name` are required). */
export function callRow(fields) {
  const row = [];
  for (const [key, i] of Object.entries(CALL)) row[i] = key in fields ? fields[key] : CALL_DEFAULTS[key];
  return row;
}

/** The inverse of `equationRecord`, for fixtures: a positional equation row. */
export function equationRow({ id, primitive, ins = "", outs = "", params = "", source = "" }) {
  const row = [];
  Object.entries({ id, primitive, ins, outs, params, source }).forEach(([key, v]) => { row[EQUATION[key]] = v; });
  return row;
}
