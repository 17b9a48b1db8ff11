// The bundled layout engine's source code, as a string. In js/src it is null (the pane then imports
// ./layout-engine.js itself); js/build.mjs replaces this module in widget.js with the engine bundled
// on its own (Graphviz's WebAssembly included), so widget.js stays one self-contained file.
export default null;
