"""Accelerate's own values for the zero_optimization sizes it fills from a
model's hidden size when a DeepSpeed config says "auto".

The formulas live inside Accelerator._prepare_deepspeed, which needs
DeepSpeed and a process group to run; this evaluates the dictionary that
method passes to config_kwargs.update(), taken from accelerate's installed
source, for each hidden size on the command line. Prints one line per value:
"HIDDEN_SIZE KEY VALUE". Exits 77 when accelerate cannot be imported.
"""

import ast
import inspect
import sys
import textwrap

try:
    from accelerate import Accelerator
except Exception as error:  # noqa: BLE001 - any import failure means "skip"
    print(f"accelerate is not importable: {error}", file=sys.stderr)
    sys.exit(77)

KEYS = {
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
}

source = textwrap.dedent(inspect.getsource(Accelerator._prepare_deepspeed))
formulas = None
for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Dict) and {
        k.value for k in node.keys if isinstance(k, ast.Constant)
    } == KEYS:
        formulas = {k.value: ast.Expression(v) for k, v in zip(node.keys, node.values)}
if formulas is None:
    print("accelerate's _prepare_deepspeed no longer holds the hidden-size dictionary",
          file=sys.stderr)
    sys.exit(1)

for arg in sys.argv[1:]:
    hidden_size = int(arg)
    for key, expression in sorted(formulas.items()):
        code = compile(ast.fix_missing_locations(expression), "<accelerate>", "eval")
        value = eval(code, {}, {"hidden_size": hidden_size})  # noqa: S307 - accelerate's source
        print(hidden_size, key, value)
