// Bundles the front-end into yax_widget/static (`npm run build`). The graph pane's layout engine
// (src/panes/layout-engine.js, Graphviz in WebAssembly) is bundled first, on its own, and goes into
// widget.js as a string in place of src/panes/layout-code.js: the pane starts a Web Worker from it,
// and widget.js stays one file that needs no network.
import * as esbuild from "esbuild";

const out = "../yax_widget/static";
const common = { bundle: true, minify: true, target: "es2020", logLevel: "warning" };

const engine = await esbuild.build({ ...common, entryPoints: ["src/panes/layout-engine.js"], format: "esm",
  write: false });
const code = engine.outputFiles[0].text;

const inlineEngine = {
  name: "inline-layout-engine",
  setup(build) {
    build.onLoad({ filter: /[\\/]panes[\\/]layout-code\.js$/ }, () => ({
      contents: `export default ${JSON.stringify(code)};`, loader: "js" }));
  },
};

await esbuild.build({ ...common, entryPoints: ["src/index.js"], format: "esm", outfile: `${out}/widget.js`,
  plugins: [inlineEngine] });
await esbuild.build({ bundle: true, minify: true, logLevel: "warning", entryPoints: ["src/widget.css"],
  outfile: `${out}/widget.css` });
