"""The tensor slots inside an entry body, for every dumper's spelling (entry names: ``naming``).

Slots, as labels of this module: ``input.I[.J...]`` for positional inputs,
``kwarg.NAME`` for keyword inputs, ``output.I[.J...]``, and ``param.NAME`` for the weights
msprobe records in forward entries (``parameters``). Forward bodies hold
``input_args``/``input_kwargs``/``output``; backward bodies ``input`` (msprobe PyTorch) or
``input_args`` (MindSpore dumpers) = gradients w.r.t. the forward outputs, and ``output`` =
gradients w.r.t. the forward inputs.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional, Tuple

from mf_celldump.layout.naming import PARAMETERS


def is_tensor(record: Any) -> bool:
    return isinstance(record, dict) and "shape" in record and "dtype" in record


def tensor_slots(
    direction: str, body: Dict[str, Any], parameters: bool = False
) -> Iterator[Tuple[str, Dict[str, Any]]]:
    """(slot label, tensor record) for every tensor of an entry body, in argument order.

    ``parameters``: also the cell's own weights that msprobe records in forward entries
    (``param.NAME``), before the inputs: a bad weight is where a bad output comes from.
    """
    if parameters and isinstance(body.get(PARAMETERS), dict):
        for key, value in body[PARAMETERS].items():
            yield from _walk(f"param.{key}", value, numbered=False)
    inputs = body.get("input_args")
    if inputs is None:
        inputs = body.get("input")
    yield from _walk("input", inputs)
    kwargs = body.get("input_kwargs")
    if isinstance(kwargs, dict):
        for key, value in kwargs.items():
            yield from _walk(f"kwarg.{key}", value, numbered=False)
    yield from _walk("output", body.get("output"))


def _walk(prefix: str, value: Any, numbered: bool = True) -> Iterator[Tuple[str, Dict[str, Any]]]:
    if is_tensor(value):
        yield prefix, value
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _walk(f"{prefix}.{index}", item)
    elif not numbered and isinstance(value, dict) and "type" not in value:
        for key, item in value.items():
            yield from _walk(f"{prefix}.{key}", item)


def slot_record(body: Dict[str, Any], slot: str) -> Optional[Dict[str, Any]]:
    """The record of ``slot`` in ``body`` (None when absent or not a tensor)."""
    head, _, rest = slot.partition(".")
    if head == "input":
        node: Any = body.get("input_args")
        if node is None:
            node = body.get("input")
    elif head == "output":
        node = body.get("output")
    elif head == "kwarg":
        key, _, rest = rest.partition(".")
        node = (body.get("input_kwargs") or {}).get(key)
    else:
        return None
    for part in rest.split(".") if rest else ():
        if isinstance(node, (list, tuple)) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return None
    return node if is_tensor(node) else None


def weight_records(body: Dict[str, Any], gradients: bool = False) -> Dict[str, Dict[str, Any]]:
    """The cell's own weights (a forward entry's ``parameters``) or, with ``gradients``, their
    gradients (a ``parameters_grad`` entry: ``{name: [T]}``), by weight name, in dump order."""
    holder = body if gradients else body.get(PARAMETERS)
    out: Dict[str, Dict[str, Any]] = {}
    if not isinstance(holder, dict):
        return out
    for name, value in holder.items():
        if isinstance(value, (list, tuple)):
            value = next((item for item in value if is_tensor(item)), None)
        if is_tensor(value):
            out[str(name)] = value
    return out
