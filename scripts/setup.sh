#!/usr/bin/env bash
# One set-up command: installs yax with its dev tools into .venv (newest
# supported JAX) and a second environment .venv-oldest with the oldest
# supported JAX, so the test command can run the core suite against both.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# System programs from Debian's packages: Graphviz's `dot` (yax.to_svg) and
# chromium for the widget's browser tests (never a downloaded browser).
need=()
command -v dot >/dev/null || need+=(graphviz)
[ -x /usr/bin/chromium ] || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

# The widget's front-end: js/ bundled by esbuild into yax_widget/static. Built before the editable
# installs, whose build hook (hatch-jupyter-builder, see pyproject.toml) then finds it up to date.
npm --prefix js ci --no-audit --no-fund
npm --prefix js run build

$PY -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# PyTorch (dev extras, pinned: tests/test_reference.py records Hugging Face's PyTorch models) from
# PyTorch's CPU wheel index: PyPI's Linux wheel of the same version pulls several GB of CUDA.
.venv/bin/python -m pip install -q "torch==2.13.0" --extra-index-url https://download.pytorch.org/whl/cpu
.venv/bin/python -m pip install -q -e ".[dev,widget]"

# DeepMind's `gemma` library for the zoo (tests/test_gemma.py), as a user on a slim machine installs
# it: its model modules need kauldron, whose typing module imports tensorflow (the CPU build, about
# 20 s from PyPI) and clu; gemma's own dependency list (grain, orbax, the data pipeline) is skipped.
.venv/bin/python -m pip install -q "tensorflow-cpu==2.21.0" "clu==0.0.12" typeguard immutabledict chex
.venv/bin/python -m pip install -q --no-deps "gemma==3.3.0" "kauldron==1.4.2" einops sentencepiece

# Oldest supported JAX (keep in step with pyproject's lower bounds).
$PY -m venv .venv-oldest
.venv-oldest/bin/python -m pip install -q --upgrade pip
.venv-oldest/bin/python -m pip install -q "jax==0.9.0" "jaxlib==0.9.0" "flax==0.12.6" \
    "lxml>=5" "pytest>=8" "hypothesis>=6" "pytest-xdist>=3" "ytsaurus-client" "optax" "flatbuffers" \
    "nbclient" "nbformat" "ipykernel" "anywidget>=0.9" "ipywidgets>=8" "transformers<5" \
    "equinox>=0.13" "safetensors>=0.4" "jmp>=0.0.4"
.venv-oldest/bin/python -m pip install -q -e . --no-deps

.venv/bin/python -c "import jax, flax, yax; print('newest: jax', jax.__version__, 'flax', flax.__version__)"
.venv-oldest/bin/python -c "import jax, flax, yax; print('oldest: jax', jax.__version__, 'flax', flax.__version__)"
