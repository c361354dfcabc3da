"""The graph-mode capturing ``construct``: source generated from the cell's signature.

MindSpore's compiler parses the wrapper, so it is written to the facts the parser
relies on (MindSpore 2.9):

* the function is bound with ``types.MethodType`` and its first parameter is named
  ``self`` (a plain function assigned to ``cell.construct`` fails to parse);
* it has the original's explicit parameters, generated from the signature: a loop like
  MindFormers' ``for i in range(n): self.layers[i](...)`` is compiled as a graph loop
  that switches between the layers' constructs, and that path rejects a
  ``*args, **kwargs`` wrapper ("parameters number ... provided arguments");
* the generated source is a real file while attached (``GeneratedSources``, below: the
  parser reads source, and MindSpore's debug info reads the file), its module name is
  ours, and everything it uses comes in as closure variables (the parser resolves
  closures, not the ``exec`` namespace);
* no ``for`` loops: MindSpore may compile a loop whose body holds capture ops into a
  graph while-loop whose index is no longer a constant; sequences are walked by
  recursion instead;
* dicts inside arguments pass through uncaptured.

A construct with ``*args``/``**kwargs`` itself gets a generic varargs wrapper.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import logging
import os
import tempfile
import weakref
from dataclasses import dataclass
from typing import Callable, List, Optional

from mf_celldump.capture.backends.base import GraphFace, GraphProbe, InputTie, check_probe
from mf_celldump.capture.construct import (
    NESTED,
    NOT_DIFFERENTIABLE,
    UNPASSED,
    GradientGapLog,
    ParamSlot,
    differentiable_dtypes,
    param_slots,
)
from mf_celldump.capture.selection import SelectedCell
from mf_celldump.mapping import ArgModes
from mf_celldump.rawformat.keys import SLOT_ARG, SLOT_CODES, SLOT_KWARG, SLOT_OUTPUT, SLOTS

logger = logging.getLogger(__name__)

_GENERATED_MODULE = __name__


@dataclass(frozen=True)
class _GraphHelpers:
    """The graph-parsable functions a generated ``construct`` closes over."""

    capture: Callable  # (value, head, path, use_in, note, call) -> value
    capture_items: Callable  # (items, head, path, flags, index, note, call) -> tuple
    capture_output: Callable  # (out, head, flags, note, call) -> out
    after: Callable  # (value, note) -> the note left for later probes of the call
    note_constants: Callable  # (cell_id, leaves) -> note; 0 when the backend records none
    constants_of: Callable  # (value, slot_code, path) -> ((slot_code, path, value), ...)
    constants_of_items: Callable  # (items, slot_code, path, index) -> the same, for a sequence
    ranked: Callable  # (head, rank) -> head + (rank,): a top-level positional input's backward rank
    next_rank: Callable  # (value, rank) -> rank + 1 if value is a tensor
    capture_args: Callable  # (items, head, flags, note, call) -> items captured with backward ranks
    tie_first: Callable  # (values) -> values, their top-level tensors through one gradient op, before the probes
    tie: Callable  # (values) -> values, the same after the probes (one of the two passes values through)
    call_number: Callable  # (cell_id) -> the call's number for its probes (-1: processing infers it)
    default: Callable  # (value, original default) -> the default when the caller left the parameter out


def _graph_helpers(probe: GraphProbe, note_constants: Optional[Callable], call_number: Optional[Callable],
                   input_tie: Optional[InputTie] = None, class_name: str = "",
                   gaps: Optional[GradientGapLog] = None) -> _GraphHelpers:
    """Graph-parsable helpers shared by both graph wrapper shapes.

    Only tensors are handed to probes that may replace them; a non-tensor value is
    returned as the same object. Constant non-tensor values are collected at compile time
    (``constants_of``, pure) and reach the raw files through the ``note`` of the call's
    first tensor probe, so no operation touches them and they stay compile-time constants.
    """
    from mindspore.ops.primitive import constexpr

    @constexpr
    def extend(path, index):
        return path + (index,)

    @constexpr
    def no_note(cell_id, leaves):
        return 0

    @constexpr
    def uncounted(cell_id):
        return -1

    constants_of, constants_of_items = _constant_collectors(extend)
    @constexpr
    def uses_in(flags, index):
        return flags if isinstance(flags, bool) else (index < len(flags) and flags[index])

    capture, capture_items, capture_output, after = _capturers(probe, extend, uses_in, class_name, gaps)
    ranked, next_rank, capture_args = _ranked_capturers(capture, after, extend, uses_in)
    tie = _input_tie(input_tie, class_name, gaps)
    tie_first, tie_last = (tie, _untied) if input_tie is not None and input_tie.before_probes else (_untied, tie)
    return _GraphHelpers(capture, capture_items, capture_output, after, note_constants or no_note,
                         constants_of, constants_of_items, ranked, next_rank, capture_args, tie_first, tie_last,
                         call_number or uncounted, _default_filler())


def _default_filler() -> Callable:
    """``default(value, fallback)``: ``fallback`` where ``value`` is ``UNPASSED``; folded at compile time."""

    def default(value, fallback):
        if isinstance(value, str):  # noqa: SIM102 - never compare a tensor with a string in graph code
            if value == UNPASSED:
                return fallback
        return value

    return default


def _ranked_capturers(capture: Callable, after: Callable, extend: Callable, uses_in: Callable):
    """msprobe's backward numbering in graph code: ``ranked``, ``next_rank`` and ``capture_args``.

    A top-level tensor positional argument gets ``head = (cell id, slot code, rank)``, its rank
    among the call's top-level tensor arguments, computed at compile time; a probe records
    its gradient as backward ``output.{rank}`` (a nested tensor gets rank -1: no gradient,
    as msprobe records none).
    """
    from mindspore import Tensor
    from mindspore.ops.functional import is_sequence_shape_unknown as is_dynamic_length
    from mindspore.ops.primitive import constexpr

    @constexpr
    def ranked(head, rank):
        return (head[0], head[1], rank)

    def next_rank(value, rank):
        if isinstance(value, Tensor):
            return rank + 1
        return rank

    def capture_args(items, head, flags, note, call):
        return capture_ranked(items, head, flags, 0, note, 0, call)

    def capture_ranked(items, head, flags, index, note, rank, call):
        if is_dynamic_length(items):
            return items
        if not items:
            return ()
        first = capture(items[0], ranked(head, rank), extend((), index), uses_in(flags, index), note, call)
        return (first,) + capture_ranked(items[1:], head, flags, index + 1, after(items[0], note),
                                         next_rank(items[0], rank), call)

    return ranked, next_rank, capture_args


def _untied(values):
    return values


def _input_tie(input_tie: Optional[InputTie], class_name: str = "", gaps: Optional[GradientGapLog] = None) -> Callable:
    """``tie(values) -> values``: msprobe's per-call tie of the inputs, in graph code.

    The call's top-level tensor arguments pass through ONE ``InsertGradientOf`` over their
    tuple (``InputTie``): an input that depends on no parameter gets its gradient once
    another input of the call does. (A probe's own bprop alone would not do: graph autodiff
    builds no bprop for a node none of whose inputs is differentiated, so a mask's probe
    never runs backward.) A call whose tensors are all integer goes through the backend's
    ``no_gradient`` instead, which writes the nulls.
    """
    from mindspore import Tensor, ops
    from mindspore.ops.functional import is_sequence_shape_unknown as is_dynamic_length
    from mindspore.ops.primitive import constexpr

    tie_op = ops.InsertGradientOf(input_tie.on_gradients) if input_tie is not None else None
    unfolded = _constant_unfolder()
    no_gradient = input_tie.no_gradient if input_tie is not None else None
    float_types = differentiable_dtypes()

    @constexpr
    def differentiable(dtypes):
        # Compile time: whether any top-level tensor input can have a gradient; log why not once per class.
        if any(dtype in float_types for dtype in dtypes):
            return True
        if gaps is not None:
            gaps.note(class_name, NOT_DIFFERENTIABLE, ", ".join(f"backward output.{i}" for i in range(len(dtypes))),
                      ", ".join(str(dtype) for dtype in dtypes))
        return False

    def dtypes_of(tensors):
        if not tensors:
            return ()
        return (tensors[0].dtype,) + dtypes_of(tensors[1:])

    def tensors_of(values):
        if not values:
            return ()
        if isinstance(values[0], Tensor):
            return (values[0],) + tensors_of(values[1:])
        return tensors_of(values[1:])

    def put_back(values, tensors):
        if not values:
            return ()
        if isinstance(values[0], Tensor):
            return (tensors[0],) + put_back(values[1:], tensors[1:])
        return (values[0],) + put_back(values[1:], tensors)

    def tie(values):
        if no_gradient is None:
            return values
        if is_dynamic_length(values):
            return values
        tensors = tensors_of(values)
        if not tensors:
            return values
        if not differentiable(dtypes_of(tensors)):
            return put_back(values, no_gradient(tensors))
        return put_back(values, tie_op(unfolded(tensors, tensors)))

    return tie


def _constant_unfolder() -> Callable:
    """``unfolded(tensors, anchor) -> tensors``: each compile-time constant tensor ``depend``-ed on ``anchor``.

    A constant tensor argument (MindFormers' ``init_extra_loss`` handed to the first layer) stays a
    constant through ``InsertGradientOf`` (its abstract keeps the value), so the compiler folds the
    probe's input to the constant and autodiff builds no bprop for that probe, nor for anything on
    the path from it to the call's outputs: the input's gradient and the gradient of an output that
    passes it through are lost (a tie after the probes received it; one before them gets zeros). After
    ``depend`` on the call's tensors it is a node of the graph like a mask from the batch, so the
    tie's join keeps its gradient. ``depend`` returns its first input: no value changes."""
    from mindspore import ops
    from mindspore.ops.functional import isconstant

    depend = ops.depend

    def unfolded(tensors, anchor):
        if not tensors:
            return ()
        first = depend(tensors[0], anchor) if isconstant(tensors[0]) else tensors[0]
        return (first,) + unfolded(tensors[1:], anchor)

    return unfolded


def _constant_collectors(extend: Callable):
    """``constants_of`` / ``constants_of_items``: the constant non-tensor leaves of a value, as
    ``((slot_code, path, value), ...)``, computed at compile time by pure graph code."""
    from mindspore import Tensor
    from mindspore.ops.functional import is_sequence_shape_unknown as is_dynamic_length
    from mindspore.ops.functional import isconstant
    from mindspore.ops.primitive import constexpr

    @constexpr
    def leaf(slot_code, path, value):
        return ((slot_code, path, value),)

    def constants_of(value, slot_code, path):
        if isinstance(value, Tensor):
            return ()
        if isinstance(value, str):  # noqa: SIM102 - never compare a tensor with a string in graph code
            if value == UNPASSED:
                return ()  # left out by the caller: not recorded
        if isinstance(value, (tuple, list)):
            return constants_of_items(tuple(value), slot_code, path, 0)
        if isinstance(value, dict):
            return ()  # dicts pass through uncaptured
        if isconstant(value):
            return leaf(slot_code, path, value)
        return ()

    def constants_of_items(items, slot_code, path, index):
        if is_dynamic_length(items):
            return ()
        if not items:
            return ()
        first = constants_of(items[0], slot_code, extend(path, index))
        return first + constants_of_items(items[1:], slot_code, path, index + 1)

    return constants_of, constants_of_items


def _capturers(probe: GraphProbe, extend: Callable, uses_in: Callable, class_name: str = "",
               gaps: Optional[GradientGapLog] = None):
    """``capture``, ``capture_items``, ``capture_output`` and ``after``: tensors through ``probe``
    (the call's note handed to its first tensor), everything else returned as it came."""
    from mindspore import Tensor
    from mindspore.ops.functional import is_sequence_shape_unknown as is_dynamic_length
    from mindspore.ops.functional import isconstant
    from mindspore.ops.primitive import constexpr

    def has_tensor(value):
        if isinstance(value, Tensor):
            return True
        if isinstance(value, (tuple, list)):
            if is_dynamic_length(value):
                return False  # passed through uncaptured
            return items_have_tensor(tuple(value))
        return False

    def items_have_tensor(items):
        if not items:
            return False
        if has_tensor(items[0]):
            return True
        return items_have_tensor(items[1:])

    def after(value, note):
        if has_tensor(value):
            return 0
        return note

    def capture_items(items, head, path, flags, index, note, call):
        if is_dynamic_length(items):
            return items  # length unknown at compile time: passed through uncaptured
        if not items:
            return ()
        first = capture(items[0], head, extend(path, index), uses_in(flags, index), note, call)
        return (first,) + capture_items(items[1:], head, path, flags, index + 1, after(items[0], note), call)

    @constexpr
    def nested(head, holds_tensor):
        # Compile time: no backward rank inside a sequence (msprobe records no gradient there).
        if len(head) > 2 and holds_tensor and gaps is not None:
            gaps.note(class_name, NESTED, f"input.{head[2]}", "msprobe numbers top-level tensors")
        return (head[0], head[1], -1) if len(head) > 2 else head

    def capture(value, head, path, use_in, note, call):
        if isinstance(value, tuple):
            return capture_items(value, nested(head, has_tensor(value)), path, use_in, 0, note, call)
        if isinstance(value, list):
            return list(capture_items(tuple(value), nested(head, has_tensor(value)), path, use_in, 0, note, call))
        if isinstance(value, Tensor):
            return probe(value, head, path, use_in, note, call)
        if isconstant(value):
            return value  # the same object: a compile-time constant stays one
        return probe(value, head, path, use_in, 0, call)  # a variable scalar (``mutable``)

    def capture_output(out, head, flags, note, call):
        if isinstance(out, tuple):
            return capture_items(out, head, (), flags, 0, note, call)
        return capture(out, head, (0,), uses_in(flags, 0), note, call)

    return capture, capture_items, capture_output, after


def _always_captured(cell_id):
    return False


def graph_construct(selected: SelectedCell, modes: ArgModes, face: GraphFace, sources: GeneratedSources,
                    gaps: Optional[GradientGapLog] = None, plain: Optional[Callable] = None) -> Callable:
    """A graph-parsable ``construct`` capturing through the backend's graph face.

    ``plain(cell_id)``: a ``constexpr`` answering, while a graph is compiled, whether that graph is the
    one without capture ops (``graph_switch``); the wrapper then calls the original and nothing else."""
    original = selected.cell.construct
    slots = param_slots(original, selected.params)
    in_flags = tuple(modes.input_mode(i) == "in" for i in range(len(modes.input_modes)))
    out_flags = tuple(modes.output_mode(i) == "in" for i in range(len(modes.output_modes)))
    heads = {slot: (selected.cell_id, SLOT_CODES[slot]) for slot in SLOTS}
    records_constants = face.constants_function()
    record_inputs = face.input_gradients_function()
    probe = face.probe_function()
    check_probe(probe, GraphProbe, type(face).__name__)
    helpers = _graph_helpers(probe, records_constants, face.call_function(),
                             record_inputs(selected.cell_id) if record_inputs is not None else None,
                             type(selected.cell).__name__, gaps)
    plain = plain or _always_captured
    if any(slot.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD) for slot in slots):
        return _varargs_graph_construct(original, slots, heads, in_flags, out_flags, helpers,
                                        records_constants is not None, plain)
    return _generated_graph_construct(original, slots, heads, in_flags, out_flags, helpers,
                                      records_constants is not None, sources, plain)


def _literal(value) -> Optional[str]:
    """Source text for a default that is a plain literal (the parser then sees the value
    itself, as in the original), else None."""
    if value is None or isinstance(value, (bool, int, float, str)):
        text = repr(value)
        try:
            if ast.literal_eval(text) == value and type(ast.literal_eval(text)) is type(value):
                return text
        except (ValueError, SyntaxError):
            return None
    return None


@dataclass
class _WrapperText:
    """The per-parameter pieces of a generated ``construct``'s source."""

    params: List[str]  # its signature
    body: List[str]  # the tie before or after the captures, then the defaults put back
    fill: List[str]  # the defaults put back alone (the graph without capture ops)
    call: List[str]  # the original's arguments
    constants: List[str]  # constants_of(...) terms of the call's note


def _wrapper_text(slots: List[ParamSlot], heads, in_flags) -> _WrapperText:
    """Source lines for each parameter: a defaulted one gets ``UNPASSED`` as its default and its
    real default back after the captures, so what the caller left out is not recorded."""
    text = _WrapperText(["self"], [], [], [], [])
    positional, fill = [], []
    for slot in slots:
        if slot.kind == inspect.Parameter.KEYWORD_ONLY and "*" not in text.params:
            text.params.append("*")
        if slot.default is inspect.Parameter.empty:
            text.params.append(slot.name)
        else:
            text.params.append(f"{slot.name}={UNPASSED!r}")
            value = _literal(slot.default) or f"_mfcd_d{len(fill)}"  # else a closure variable of its own
            fill.append(f"{slot.name} = _mfcd_default({slot.name}, {value})")
        head = heads[SLOT_ARG] if slot.slot == SLOT_ARG else heads[SLOT_KWARG]
        use_in = slot.slot == SLOT_ARG and slot.index < len(in_flags) and in_flags[slot.index]
        text.constants.append(f"_mfcd_constants_of({slot.name}, {head[1]!r}, ({slot.index},))")
        if slot.slot == SLOT_ARG:
            head_text = f"_mfcd_ranked({head!r}, _mfcd_rank)"
            positional.append(slot.name)
        else:
            head_text = repr(head)
        text.body.append(f"{slot.name} = _mfcd_capture({slot.name}, {head_text}, ({slot.index},), {use_in!r}, "
                         "_mfcd_note, _mfcd_call)")
        text.body.append(f"_mfcd_note = _mfcd_after({slot.name}, _mfcd_note)")
        if slot.slot == SLOT_ARG:
            text.body.append(f"_mfcd_rank = _mfcd_next_rank({slot.name}, _mfcd_rank)")
        text.call.append(slot.name if slot.slot == SLOT_ARG else f"{slot.name}={slot.name}")
    if positional:
        names = ", ".join(positional)
        text.body.insert(0, f"({names},) = _mfcd_tie_first(({names},))")
        text.body.append(f"({names},) = _mfcd_tie(({names},))")
    text.body.extend(fill)  # after capture: an argument the caller left out is not recorded (msprobe's rule)
    text.fill = fill
    return text


def _generated_graph_construct(original, slots: List[ParamSlot], heads, in_flags, out_flags,
                               helpers: _GraphHelpers, records_constants: bool,
                               sources: GeneratedSources, plain: Callable) -> Callable:
    """Source for a wrapper with exactly the original's parameters, compiled and registered."""
    text = _wrapper_text(slots, heads, in_flags)
    params, body, call, constants = text.params, text.body, text.call, text.constants
    defaults = tuple(slot.default for slot in slots if slot.default is not inspect.Parameter.empty)
    if records_constants and constants:
        note = f"_mfcd_note = _mfcd_note_constants({heads[SLOT_ARG][0]!r}, {' + '.join(constants)})"
    else:
        note = "_mfcd_note = 0"
    lines = [
        "def _mfcd_make(_mfcd_original, _mfcd_capture, _mfcd_capture_output, _mfcd_after, _mfcd_note_constants,",
        "               _mfcd_constants_of, _mfcd_out_head, _mfcd_out_flags, _mfcd_ranked, _mfcd_next_rank,",
        "               _mfcd_tie_first, _mfcd_tie, _mfcd_call_number, _mfcd_default, _mfcd_plain"
        f"{''.join(f', _mfcd_d{k}' for k in range(len(defaults)))}):",
        f"    def construct({', '.join(params)}):",
        f"        if _mfcd_plain({heads[SLOT_ARG][0]!r}):",  # folded at compile time: the graph without capture
        *[f"            {line}" for line in text.fill],
        f"            return _mfcd_original({', '.join(call)})",
        f"        _mfcd_call = _mfcd_call_number({heads[SLOT_ARG][0]!r})",
        f"        {note}",
        "        _mfcd_rank = 0",
        *[f"        {line}" for line in body],
        f"        _mfcd_out = _mfcd_original({', '.join(call)})",
        "        return _mfcd_capture_output(_mfcd_out, _mfcd_out_head, _mfcd_out_flags, _mfcd_note, _mfcd_call)",
        "    return construct",
        "",
    ]
    source = "\n".join(lines)
    file_name = sources.add(f"construct_{heads[SLOT_ARG][0]}", source)
    namespace = {"__name__": _GENERATED_MODULE}
    exec(compile(source, file_name, "exec"), namespace)  # noqa: S102 - our own generated source
    make = namespace["_mfcd_make"]
    construct = make(original, helpers.capture, helpers.capture_output, helpers.after, helpers.note_constants,
                     helpers.constants_of, heads[SLOT_OUTPUT], out_flags, helpers.ranked, helpers.next_rank,
                     helpers.tie_first, helpers.tie, helpers.call_number, helpers.default, plain, *defaults)
    construct.__defaults__ = tuple(
        UNPASSED for slot in slots
        if slot.kind != inspect.Parameter.KEYWORD_ONLY and slot.default is not inspect.Parameter.empty
    ) or None
    construct.__kwdefaults__ = {
        slot.name: UNPASSED for slot in slots
        if slot.kind == inspect.Parameter.KEYWORD_ONLY and slot.default is not inspect.Parameter.empty
    } or None
    return construct


def _varargs_graph_construct(original, slots: List[ParamSlot], heads, in_flags, out_flags,
                             helpers: _GraphHelpers, records_constants: bool, plain: Callable) -> Callable:
    """For a construct taking ``*args``/``**kwargs``: positional values by position, named
    keywords by their parameter's slot, other keywords passed through."""
    from mindspore.ops.primitive import constexpr

    named = {slot.name: (SLOT_CODES[slot.slot], slot.index) for slot in slots if slot.slot}
    arg_head, out_head = heads[SLOT_ARG], heads[SLOT_OUTPUT]
    cell_id = arg_head[0]
    capture, capture_output = helpers.capture, helpers.capture_output
    capture_args, tie_first, tie = helpers.capture_args, helpers.tie_first, helpers.tie
    after, note_constants, call_number = helpers.after, helpers.note_constants, helpers.call_number
    constants_of, constants_of_items = helpers.constants_of, helpers.constants_of_items

    @constexpr
    def keyword_head(name):
        slot_code, index = named.get(name, (-1, -1))
        return (cell_id, slot_code), index

    def kwargs_constants(kwargs, names):
        if not names:
            return ()
        head, index = keyword_head(names[0])
        rest = kwargs_constants(kwargs, names[1:])
        if index >= 0:
            return constants_of(kwargs[names[0]], head[1], (index,)) + rest
        return rest

    def capture_kwargs(kwargs, names, note, call):
        if not names:
            return {}
        name = names[0]
        head, index = keyword_head(name)
        if index >= 0:
            value = capture(kwargs[name], head, (index,), False, note, call)
            captured = capture_kwargs(kwargs, names[1:], after(kwargs[name], note), call)
            captured[name] = value
        else:
            captured = capture_kwargs(kwargs, names[1:], note, call)
            captured[name] = kwargs[name]  # absorbed by **kwargs: no stable index to name it by
        return captured

    def kwargs_after(kwargs, names, note):
        if not names:
            return note
        head, index = keyword_head(names[0])
        if index >= 0:
            return kwargs_after(kwargs, names[1:], after(kwargs[names[0]], note))
        return kwargs_after(kwargs, names[1:], note)

    def construct(self, *args, **kwargs):
        if plain(cell_id):  # folded at compile time: the graph without capture ops
            return original(*args, **kwargs)
        call = call_number(cell_id)
        note = 0
        if records_constants:
            note = note_constants(cell_id, constants_of_items(args, arg_head[1], (), 0)
                                  + kwargs_constants(kwargs, tuple(kwargs.keys())))
        new_args = tie(capture_args(tie_first(args), arg_head, in_flags, note, call))
        new_kwargs = capture_kwargs(kwargs, tuple(kwargs.keys()), after(args, note), call)
        out = original(*new_args, **new_kwargs)
        return capture_output(out, out_head, out_flags, kwargs_after(kwargs, tuple(kwargs.keys()), after(args, note)),
                              call)

    return construct


# -- the generated source files ------------------------------------------------------------------------
# MindSpore's compiler reads a function's source file from disk for its debug info
# (``ReadSectionDebugInfoFromFile`` in ``mindspore/core/utils/info.cc``); a name that is not a
# real file gets two log lines per compiled node ("Get realpath failed" at ERROR level):
# hundreds on a small mcore model. So each wrapper's source is also written to a private
# temporary folder of this process (0o700), registered with ``linecache`` for Python's own
# tracebacks, and removed at detach: only the files written here.

class GeneratedSources:
    """The source files of one attached dump's generated wrappers (removed at detach, or when
    the handle is collected or the interpreter exits, for a dump never detached)."""

    def __init__(self) -> None:
        self._folder: Optional[str] = None
        self._files: List[str] = []
        self._finalizer: Optional[weakref.finalize] = None

    def add(self, name: str, source: str) -> str:
        """Write ``source`` as ``{name}.py``; the file name to compile it under."""
        if self._folder is None:
            self._folder = tempfile.mkdtemp(prefix="mf_celldump-constructs-")
            self._finalizer = weakref.finalize(self, _remove, self._folder, self._files)
        path = os.path.join(self._folder, f"{name}.py")
        try:
            with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640), "w", encoding="utf-8") as handle:
                handle.write(source)
            self._files.append(path)
        except OSError as err:  # debug info only: compiling works without the file
            logger.debug("generated construct source not written to %s: %s", path, err)
        linecache.cache[path] = (len(source), None, source.splitlines(True), path)
        return path

    def remove(self) -> None:
        """Remove the files written here and their folder (if nothing else is in it)."""
        if self._finalizer is not None:
            self._finalizer()  # runs _remove once
            self._finalizer = None
        self._folder = None
        self._files = []


def _remove(folder: str, files: List[str]) -> None:
    for path in files:
        linecache.cache.pop(path, None)
        try:
            os.remove(path)
        except OSError as err:
            logger.debug("could not remove %s: %s", path, err)
    try:
        os.rmdir(folder)
    except OSError as err:
        logger.debug("could not remove %s: %s", folder, err)
