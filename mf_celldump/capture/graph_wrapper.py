"""The graph-mode capturing ``construct``: source generated from the cell's signature.

MindSpore's compiler parses the wrapper, so it is written to the facts the parser
relies on (MindSpore 2.9):

* the function is bound with ``types.MethodType`` and its first parameter is named
  ``self`` (a plain function assigned to ``cell.construct`` fails to parse);
* it has the original's explicit parameters, generated from the signature: a loop like
  MindFormers' ``for i in range(n): self.layers[i](...)`` is compiled as a graph loop
  that switches between the layers' constructs, and that path rejects a
  ``*args, **kwargs`` wrapper ("parameters number ... provided arguments");
* the generated source is registered with ``linecache`` (the parser reads source), its
  module name is ours, and everything it uses comes in as closure variables (the
  parser resolves closures, not the ``exec`` namespace);
* no ``for`` loops: MindSpore may compile a loop whose body holds capture ops into a
  graph while-loop whose index is no longer a constant; sequences are walked by
  recursion instead;
* dicts inside arguments pass through uncaptured.

A construct with ``*args``/``**kwargs`` itself gets a generic varargs wrapper.
"""

from __future__ import annotations

import inspect
import linecache
from typing import Callable, List

from mf_celldump.capture.selection import SelectedCell
from mf_celldump.capture.signature import ParamSlot, param_slots
from mf_celldump.mapping import ArgModes
from mf_celldump.rawformat.keys import SLOT_ARG, SLOT_CODES, SLOT_KWARG, SLOT_OUTPUT, SLOTS

_GENERATED_MODULE = __name__


def _graph_helpers(probe: Callable):
    """Graph-parsable helpers shared by both graph wrapper shapes."""
    from mindspore.ops.functional import is_sequence_shape_unknown as is_dynamic_length
    from mindspore.ops.primitive import constexpr

    @constexpr
    def uses_in(flags, index):
        return flags if isinstance(flags, bool) else (index < len(flags) and flags[index])

    @constexpr
    def extend(path, index):
        return path + (index,)

    def capture_items(items, head, path, flags, index):
        if is_dynamic_length(items):
            return items  # length unknown at compile time: passed through uncaptured
        if not items:
            return ()
        first = capture(items[0], head, extend(path, index), uses_in(flags, index))
        return (first,) + capture_items(items[1:], head, path, flags, index + 1)

    def capture(value, head, path, use_in):
        if isinstance(value, tuple):
            return capture_items(value, head, path, use_in, 0)
        if isinstance(value, list):
            return list(capture_items(tuple(value), head, path, use_in, 0))
        return probe(value, head, path, use_in)

    def capture_output(out, head, flags):
        if isinstance(out, tuple):
            return capture_items(out, head, (), flags, 0)
        return capture(out, head, (0,), uses_in(flags, 0))

    return capture, capture_items, capture_output


def graph_construct(selected: SelectedCell, modes: ArgModes, probe: Callable) -> Callable:
    """A graph-parsable ``construct``; ``probe`` is the backend's graph probe function."""
    original = selected.cell.construct
    slots = param_slots(original, selected.params)
    in_flags = tuple(modes.input_mode(i) == "in" for i in range(len(modes.input_modes)))
    out_flags = tuple(modes.output_mode(i) == "in" for i in range(len(modes.output_modes)))
    heads = {slot: (selected.cell_id, SLOT_CODES[slot]) for slot in SLOTS}
    capture, capture_items, capture_output = _graph_helpers(probe)
    if any(slot.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD) for slot in slots):
        return _varargs_graph_construct(original, slots, heads, in_flags, out_flags,
                                        capture, capture_items, capture_output)
    return _generated_graph_construct(original, slots, heads, in_flags, out_flags, capture, capture_output)


def _generated_graph_construct(original, slots: List[ParamSlot], heads, in_flags, out_flags,
                               capture, capture_output) -> Callable:
    """Source for a wrapper with exactly the original's parameters, compiled and registered."""
    params, body, call = ["self"], [], []
    kw_only_seen = False
    for slot in slots:
        if slot.kind == inspect.Parameter.KEYWORD_ONLY and not kw_only_seen:
            params.append("*")
            kw_only_seen = True
        params.append(f"{slot.name}=None" if slot.default is not inspect.Parameter.empty else slot.name)
        if slot.slot == SLOT_ARG:
            use_in = slot.index < len(in_flags) and in_flags[slot.index]
            body.append(f"{slot.name} = _mfcd_capture({slot.name}, {heads[SLOT_ARG]!r}, "
                        f"({slot.index},), {use_in!r})")
            call.append(slot.name)
        else:
            body.append(f"{slot.name} = _mfcd_capture({slot.name}, {heads[SLOT_KWARG]!r}, "
                        f"({slot.index},), False)")
            call.append(f"{slot.name}={slot.name}")
    lines = [
        "def _mfcd_make(_mfcd_original, _mfcd_capture, _mfcd_capture_output, _mfcd_out_head,",
        "               _mfcd_out_flags):",
        f"    def construct({', '.join(params)}):",
        *[f"        {line}" for line in body],
        f"        _mfcd_out = _mfcd_original({', '.join(call)})",
        "        return _mfcd_capture_output(_mfcd_out, _mfcd_out_head, _mfcd_out_flags)",
        "    return construct",
        "",
    ]
    source = "\n".join(lines)
    file_name = f"<mf_celldump generated construct {id(original):x}>"
    linecache.cache[file_name] = (len(source), None, source.splitlines(True), file_name)
    namespace = {"__name__": _GENERATED_MODULE}
    exec(compile(source, file_name, "exec"), namespace)  # noqa: S102 - our own generated source
    make = namespace["_mfcd_make"]
    construct = make(original, capture, capture_output, heads[SLOT_OUTPUT], out_flags)
    positional_defaults = tuple(
        slot.default for slot in slots
        if slot.kind != inspect.Parameter.KEYWORD_ONLY and slot.default is not inspect.Parameter.empty
    )
    construct.__defaults__ = positional_defaults or None
    construct.__kwdefaults__ = {
        slot.name: slot.default for slot in slots
        if slot.kind == inspect.Parameter.KEYWORD_ONLY and slot.default is not inspect.Parameter.empty
    } or None
    return construct


def _varargs_graph_construct(original, slots: List[ParamSlot], heads, in_flags, out_flags,
                             capture, capture_items, capture_output) -> Callable:
    """For a construct taking ``*args``/``**kwargs``: positional values by position, named
    keywords by their parameter's slot, other keywords passed through."""
    from mindspore.ops.primitive import constexpr

    named = {slot.name: (SLOT_CODES[slot.slot], slot.index) for slot in slots if slot.slot}
    arg_head, out_head = heads[SLOT_ARG], heads[SLOT_OUTPUT]
    cell_id = arg_head[0]

    @constexpr
    def keyword_head(name):
        slot_code, index = named.get(name, (-1, -1))
        return (cell_id, slot_code), index

    def capture_kwargs(kwargs, names):
        if not names:
            return {}
        captured = capture_kwargs(kwargs, names[1:])
        name = names[0]
        head, index = keyword_head(name)
        if index >= 0:
            captured[name] = capture(kwargs[name], head, (index,), False)
        else:
            captured[name] = kwargs[name]  # absorbed by **kwargs: no stable index to name it by
        return captured

    def construct(self, *args, **kwargs):
        new_args = capture_items(args, arg_head, (), in_flags, 0)
        new_kwargs = capture_kwargs(kwargs, tuple(kwargs.keys()))
        out = original(*new_args, **new_kwargs)
        return capture_output(out, out_head, out_flags)

    return construct

