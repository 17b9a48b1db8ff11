// The module tree: rows from Python (see docs/widget.md) -> nodes, and the
// flat list of visible rows for the virtualised view. No DOM here.

export const ROW = { id: 0, parent: 1, kind: 2, name: 3, type: 4, attrs: 5, ins: 6, outs: 7, params: 8, neq: 9, fields: 10 };

/** Build the tree: `byId` (id -> node), `roots`, each node with `children` and `depth`. */
export function buildTree(rows) {
  const byId = new Map();
  const roots = [];
  for (const r of rows) {
    const node = {
      id: r[0], parent: r[1], kind: r[2], name: r[3], type: r[4], attrs: r[5],
      ins: r[6], outs: r[7], params: r[8], neq: r[9], fields: r[10] || "", children: [], depth: 0, eq: false,
    };
    byId.set(node.id, node);
    const p = byId.get(node.parent);
    if (p) {
      node.depth = p.depth + 1;
      p.children.push(node);
    } else {
      roots.push(node);
    }
  }
  return { byId, roots };
}

/** Equation rows `[id, primitive, in, out, params]` as leaf nodes under `parent`. */
export function equationNodes(parent, eqRows) {
  return eqRows.map((r) => ({
    id: r[0], parent: parent.id, kind: "equation", name: r[1], type: "", attrs: r[4],
    ins: r[2], outs: r[3], params: 0, neq: 0, fields: r[4], children: [], depth: parent.depth + 1, eq: true,
  }));
}

/** Can the node be expanded (calls with children or equations)? */
export function expandable(node) {
  return !node.eq && (node.children.length > 0 || node.neq > 0);
}

/** Ids of the ancestors of `ids` (not the ids themselves), via `parentOf(id)`. */
export function ancestorsOf(ids, parentOf) {
  const out = new Set();
  for (const id of ids) {
    let p = parentOf(id);
    while (p !== undefined && p !== null && p >= 0 && !out.has(p)) {
      out.add(p);
      p = parentOf(p);
    }
  }
  return out;
}

/** Nodes kept by a name filter: those whose name or type contain the
 * text (case-insensitive), and their ancestors. `null` when no filter. */
export function filterKeep(tree, text) {
  const t = (text || "").trim().toLowerCase();
  if (!t) return null;
  const keep = new Set();
  for (const node of tree.byId.values()) {
    if (`${node.name} ${node.type}`.toLowerCase().includes(t)) {
      keep.add(node.id);
      for (const a of ancestorsOf([node.id], (i) => tree.byId.get(i)?.parent)) keep.add(a);
    }
  }
  return keep;
}

/** The flat list of visible nodes, in document order: children of expanded
 * nodes (equations after the calls they belong to, from `eqs`: id -> nodes). */
export function visibleRows(tree, expanded, eqs = new Map(), keep = null) {
  const out = [];
  const visit = (node) => {
    if (keep && !keep.has(node.id)) return;
    out.push(node);
    if (!(expanded.has(node.id) || (keep && node.children.some((c) => keep.has(c.id))))) return;
    for (const c of node.children) visit(c);
    if (!keep) for (const e of eqs.get(node.id) || []) out.push(e);
  };
  for (const r of tree.roots) visit(r);
  return out;
}

/** Ids of the nodes to expand initially: those above `levels`. */
export function initialExpanded(tree, levels = 2) {
  const out = new Set();
  for (const node of tree.byId.values()) if (node.depth < levels && node.children.length) out.add(node.id);
  return out;
}

/** The call node an id belongs to: itself for calls, the owner for equations. */
export function ownerOf(id, tree, eqOwner) {
  return tree.byId.has(id) ? id : eqOwner.get(id);
}
