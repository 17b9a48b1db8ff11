"""yax: look inside JAX/Flax models as module expressions (MoX) and change them.

The public API is re-exported here; everything else is private.
"""

# The module systems yax knows (`yax.frontends.register`); before anything that asks the registry.
from .frontends import _builtin  # noqa: F401  # isort: skip

from ._activations import ACTIVATIONS as ACTIVATIONS
from ._capture import NonFinite as NonFinite
from ._capture import capture as capture
from ._capture import first_nonfinite as first_nonfinite
from ._capture import patch as patch
from ._check import check_mox as check_mox
from ._compare import Comparison as Comparison
from ._compare import Comparisons as Comparisons
from ._compare import Matching as Matching
from ._compare import Stats as Stats
from ._compare import compare as compare
from ._compare import compare_all as compare_all
from ._compare import port_tolerances as port_tolerances
from ._cost import Cost as Cost
from ._cost import cost as cost
from ._diff import Diff as Diff
from ._diff import diff as diff
from ._dot import to_dot as to_dot
from ._dot import to_svg as to_svg
from ._eval import eval_mox as eval_mox
from ._eval import to_function as to_function
from ._ir import Equation as Equation
from ._ir import Literal as Literal
from ._ir import Mox as Mox
from ._ir import Symbol as Symbol
from ._ir import Var as Var
from ._map import map_mox as map_mox
from ._precision import Policy as Policy
from ._print import pprint as pprint
from ._reference import Reference as Reference
from ._serial import dump_yson as dump_yson
from ._summary import summary as summary
from ._trace import make_mox as make_mox
from ._weights import load_weights as load_weights
from ._weights import save_weights as save_weights
from ._xml import Document as Document
from ._xml import dump_xml as dump_xml
from ._xml import load_xml as load_xml
from ._xml import to_xml as to_xml
from ._xpath import explain as explain
from ._xpath import query as query
from .errors import YaxCaptureError as YaxCaptureError
from .errors import YaxCheckError as YaxCheckError
from .errors import YaxDependencyError as YaxDependencyError
from .errors import YaxError as YaxError
from .errors import YaxEvalError as YaxEvalError
from .errors import YaxInputError as YaxInputError
from .errors import YaxQueryError as YaxQueryError
from .errors import YaxRenderError as YaxRenderError
from .errors import YaxRewriteError as YaxRewriteError
from .errors import YaxTraceError as YaxTraceError
from .errors import YaxXMLError as YaxXMLError
from .frontends.nnx import replace_modules as replace_modules
from .rewrite import decider as decider
from .rewrite import module_of as module_of
from .rewrite import sub as sub
from .rewrite.lora import LoRA as LoRA
from .rewrite.lora import lora_mask as lora_mask
from .rewrite.lora import merge_lora as merge_lora
from .rewrite.precision import default_policy as default_policy
from .rewrite.precision import mixed_precision as mixed_precision

#: The earlier prototype's name for a MoX (a module expression).
Expr = Mox

__version__ = "0.1.0"
