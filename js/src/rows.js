// The row format. Python sends rows as positional arrays (a 70B model's tree has thousands: no names
// repeated in each) and names their positions once per trait or reply, in `columns` (`CALL_COLUMNS`
// and `EQUATION_COLUMNS` in yax_widget/_payloads.py; docs/widget.md). This module reads each column
// by its name there: it knows the names of the columns the tree shows, never their positions, and
// everything else reads the named records made here. A trait or reply without `columns`, or whose
// `columns` lack one the tree cannot do without, is refused with an error saying so, never read by guess.

/** The call columns read, and what a record holds where a row has none of the optional ones (a row
 * from a kernel older than the column). */
const CALL_NEEDED = ["id", "parent", "kind", "name", "type", "attrs", "ins", "outs", "params", "neq"];
const CALL_OPTIONAL = ["fields", "copies", "policy", "fold", "sharding", "source"];
/** The same for equation rows. */
const EQUATION_NEEDED = ["id", "primitive", "ins", "outs", "params"];
const EQUATION_OPTIONAL = ["source"];

const HINT = "The kernel's yax_widget and this front-end differ: restart the kernel and run the cell again.";

/** Where each column is in the rows `columns` names: `{name: position}`, -1 for an optional column
 * they lack (`row[-1]` reads as undefined: the record's default). `what` names the rows in errors. */
function positions(columns, needed, optional, what) {
  if (!Array.isArray(columns)) {
    throw new Error(`${what} came without \`columns\` naming the positions of their columns, so they cannot `
      + `be read. ${HINT}`);
  }
  const at = {};
  for (const name of [...needed, ...optional]) at[name] = columns.indexOf(name);
  const missing = needed.filter((name) => at[name] < 0);
  if (missing.length) {
    throw new Error(`${what} lack the column${missing.length > 1 ? "s" : ""} ${missing.map((n) => `\`${n}\``)
      .join(", ")}: their \`columns\` are ${columns.map((n) => `\`${n}\``).join(", ") || "none"}. ${HINT}`);
  }
  return at;
}

/** The call records of the rows `columns` names. `fields` (every field, the tooltip) and the
 * columns after it may be absent. */
export function callRecords(columns, rows) {
  const at = positions(columns, CALL_NEEDED, CALL_OPTIONAL, "The tree's rows");
  return rows.map((row) => ({
    id: row[at.id], parent: row[at.parent], kind: row[at.kind], name: row[at.name],
    type: row[at.type], attrs: row[at.attrs], ins: row[at.ins], outs: row[at.outs],
    params: row[at.params], neq: row[at.neq], fields: row[at.fields] || "", eq: false,
    copies: row[at.copies] || 1, policy: row[at.policy] || "",
    fold: row[at.fold] ?? null, // the structure key: equal for calls alike (tree.js folds runs of them)
    sharding: row[at.sharding] || "", // its parameters' PartitionSpecs: "kernel=P(None,'model')", "" unsplit
    source: row[at.source] || "", // the user's line calling it: "model.py:12", "" where none is known
  }));
}

/** The call records of a `_tree` / `_original_tree` trait value, `{version, columns, rows}` (none
 * before the first). */
export function treeRecords(trait) {
  if (!trait || trait.rows === undefined) return [];
  return callRecords(trait.columns, trait.rows);
}

/** The equation rows of the call `parentId` as records shaped like a call's: the primitive is
 * its name, its parameters are both what the row shows and its tooltip. `source`: the reply
 * carrying them (an `expand` or `equations` reply, whose `columns` name their positions), or those
 * `columns` themselves. */
export function equationRecords(source, rows, parentId) {
  const columns = Array.isArray(source) ? source : source && source.columns;
  const at = positions(columns, EQUATION_NEEDED, EQUATION_OPTIONAL, "The equations' rows");
  return rows.map((row) => {
    const params = row[at.params];
    return {
      id: row[at.id], parent: parentId, kind: "equation", name: row[at.primitive], type: "",
      attrs: params, ins: row[at.ins], outs: row[at.outs], params: 0, neq: 0, fields: params, eq: true,
      source: row[at.source] || "", // the user's line making it
    };
  });
}

// -- fixtures for the tests ------------------------------------------------------------------------

/** The order fixtures lay out their rows in: Python's names, deliberately not in Python's order, so
 * that every test shows the front-end reads columns by name. */
export const FIXTURE_CALL_COLUMNS = Object.freeze(["name", "id", "kind", "parent", "type", "outs", "ins", "attrs",
  "neq", "params", "fields", "policy", "copies", "sharding", "fold", "source"]);
export const FIXTURE_EQUATION_COLUMNS = Object.freeze(["primitive", "id", "outs", "ins", "params", "source"]);

const FIXTURE_DEFAULTS = { kind: "module_call", type: "", attrs: "", ins: "", outs: "", params: 0, neq: 0, fields: "",
  copies: 1, policy: "", fold: null, sharding: "", source: "" };

/** A call row for fixtures, laid out as `FIXTURE_CALL_COLUMNS` (`id`, `parent` and `name` are
 * required; `callRecords` reads it back, without its `eq`). */
export function callRow(fields) {
  return FIXTURE_CALL_COLUMNS.map((key) => (key in fields ? fields[key] : FIXTURE_DEFAULTS[key]));
}

/** An equation row for fixtures, laid out as `FIXTURE_EQUATION_COLUMNS`. */
export function equationRow({ id, primitive, ins = "", outs = "", params = "", source = "" }) {
  const fields = { id, primitive, ins, outs, params, source };
  return FIXTURE_EQUATION_COLUMNS.map((key) => fields[key]);
}

/** A `_tree` trait value for fixtures: `rows` made by `callRow`, with their columns. */
export function treeTrait(rows, version = 0) {
  return { version, columns: [...FIXTURE_CALL_COLUMNS], rows };
}

/** The call records of fixture rows (`callRow`'s). */
export function fixtureRecords(rows) {
  return treeRecords(treeTrait(rows));
}
