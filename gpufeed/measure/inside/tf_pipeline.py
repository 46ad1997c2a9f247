"""The structure of a ``tf.data`` pipeline, read from the dataset object an iterator was made from.

Every dataset transformation in TensorFlow 2.x is a Python object holding its input datasets
(``_inputs()``) and its arguments: ``num_parallel_calls``, ``deterministic``, ``batch_size``,
``buffer_size``, the traced function of a ``map``. This walks that chain from the last stage to the
source and writes down what decides the pipeline's speed, in TensorFlow's own names, plus the
``tf.data.Options`` in force (autotune, its CPU and RAM budgets, threading, the graph rewrites that
parallelise maps and inject a prefetch). Private attributes are read defensively: a stage whose
attributes moved in another TensorFlow version is still listed, with what could be read.
"""
from __future__ import annotations

from typing import Any

# Ops that call back into Python: they hold the GIL, so parallel calls do not run them in parallel.
PYTHON_OPS = ("EagerPyFunc", "PyFunc", "PyFuncStateless",
              "GeneratorDataset")  # Dataset.from_generator: its next() is a numpy_function
MAX_STAGES = 64


def _value(tensor: Any) -> Any:
    try:
        value = tensor.numpy() if hasattr(tensor, "numpy") else tensor
        return value.item() if hasattr(value, "item") else value
    except Exception:
        return None


def _function_facts(dataset: Any) -> dict[str, Any]:
    """Python callbacks and stateful ops inside the stage's traced functions."""
    python_ops, stateful = set(), False
    for attr in vars(dataset).values():
        graph = getattr(getattr(attr, "function", None), "graph", None)
        if graph is None:
            continue
        try:
            for op in graph.get_operations():
                if op.type in PYTHON_OPS:
                    python_ops.add(op.type)
                if op.op_def is not None and op.op_def.is_stateful and op.type not in ("Placeholder",):
                    stateful = True
        except Exception:
            continue
    facts: dict[str, Any] = {}
    if python_ops:
        facts["python_ops"] = sorted(python_ops)
    if stateful:
        facts["stateful"] = True
    return facts


def _stage(dataset: Any) -> dict[str, Any]:
    name = type(dataset).__name__.lstrip("_")
    stage: dict[str, Any] = {"op": name[:-len("Dataset")] if name.endswith("Dataset") and name != "Dataset" else name}
    for attr, key in (("_num_parallel_calls", "num_parallel_calls"), ("_batch_size", "batch_size"),
                      ("_drop_remainder", "drop_remainder"), ("_buffer_size", "buffer_size"),
                      ("_cycle_length", "cycle_length"), ("_block_length", "block_length"),
                      ("_filename", "filename")):
        if attr in vars(dataset):
            value = _value(vars(dataset)[attr])
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            stage[key] = value
    deterministic = vars(dataset).get("_deterministic")
    if isinstance(deterministic, str):
        stage["deterministic"] = deterministic
    # Where the script made this stage, and what gpufeed changed in it (tf_overrides.py).
    for attr, key in (("_gpufeed_site", "site"), ("_gpufeed_override", "gpufeed_override")):
        if vars(dataset).get(attr) is not None:
            stage[key] = vars(dataset)[attr]
    stage.update(_function_facts(dataset))
    return stage


def _options(dataset: Any) -> dict[str, Any]:
    try:
        options = dataset.options()
    except Exception:
        return {}
    read = {
        "autotune": lambda: options.autotune.enabled,
        "autotune_cpu_budget": lambda: options.autotune.cpu_budget,
        "autotune_ram_budget": lambda: options.autotune.ram_budget,
        "deterministic": lambda: options.deterministic,
        "private_threadpool_size": lambda: options.threading.private_threadpool_size,
        "max_intra_op_parallelism": lambda: options.threading.max_intra_op_parallelism,
        "map_parallelization": lambda: options.experimental_optimization.map_parallelization,
        "inject_prefetch": lambda: options.experimental_optimization.inject_prefetch,
    }
    out = {}
    for key, get in read.items():
        try:
            out[key] = get()  # None: not set, TensorFlow's default applies
        except Exception:
            out[key] = None
    return out


def describe(dataset: Any) -> dict[str, Any]:
    """``{"stages": [last stage first, ...], "options": {...}, "cardinality": n or None}``.

    Stages are listed from the one the iterator reads (the end of the pipeline) to the source,
    following the first input of each (``zip`` and ``concatenate`` name their other inputs' count).
    """
    stages = []
    current, seen = dataset, set()
    while current is not None and id(current) not in seen and len(stages) < MAX_STAGES:
        seen.add(id(current))
        stage = _stage(current)
        try:
            inputs = list(current._inputs())
        except Exception:
            inputs = []
        if len(inputs) > 1:
            stage["inputs"] = len(inputs)
        stages.append(stage)
        current = inputs[0] if inputs else None
    try:
        cardinality = int(dataset.cardinality().numpy())
    except Exception:
        cardinality = None
    return {"stages": stages, "options": _options(dataset),
            "cardinality": cardinality if cardinality is not None and cardinality >= 0 else None}
