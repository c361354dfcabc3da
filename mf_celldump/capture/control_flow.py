"""Whether a training wrapper calls a cell inside a branch or loop on a run-time condition.

MindSpore documents TensorDump as unsupported inside control flow (``debug_func.py``
``tensordump``: "The operator of tensordump doesn't support in control flow"). Graph mode
makes control flow only where a condition is a variable (a tensor); an ``if`` on a Python
flag or a ``for`` over a constant range is folded or unrolled at compile time (MindSpore's
parser, ``parse.cc`` ``ParseForUnroll``, and its documentation of process control
statements). The cells a capture wraps are the model's, and MindFormers' layer loop
(``for i in range(self.num_layers)``) unrolls; but weight gradients are taken where the
optimizer receives them, and MindFormers' ``MFTrainOneStepCell`` and MindSpore's
``TrainOneStepWithLossScaleCell`` call the optimizer under ``if not overflow:``, a tensor.

This reads a wrapper's ``construct`` source and finds the call ``self.<attribute>(...)``
inside an ``if``/``while``/conditional expression whose condition uses a local variable
(a value computed in the graph); a condition on ``self`` attributes and literals only is
taken as a compile-time constant.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Iterable, Optional, Set, Tuple


def _locals_of(function: ast.FunctionDef) -> Set[str]:
    names = {arg.arg for arg in function.args.args + function.args.kwonlyargs if arg.arg != "self"}
    for extra in (function.args.vararg, function.args.kwarg):
        if extra is not None:
            names.add(extra.arg)
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _is_variable(test: ast.AST, local_names: Set[str]) -> bool:
    return any(isinstance(node, ast.Name) and node.id in local_names for node in ast.walk(test))


def _calls_attribute(node: ast.AST, attribute: str) -> Optional[ast.Call]:
    for child in ast.walk(node):
        if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr == attribute
                and isinstance(child.func.value, ast.Name) and child.func.value.id == "self"):
            return child
    return None


def _guarded_call(function: ast.FunctionDef, attribute: str, first_line: int) -> Optional[str]:
    local_names = _locals_of(function)
    for node in ast.walk(function):
        if not isinstance(node, (ast.If, ast.While, ast.IfExp)) or not _is_variable(node.test, local_names):
            continue
        branches = [node.body, node.orelse] if not isinstance(node, ast.IfExp) else [[node.body], [node.orelse]]
        for branch in branches:
            for statement in branch:
                call = _calls_attribute(statement, attribute)
                if call is not None:
                    kind = "while" if isinstance(node, ast.While) else "if"
                    return f"line {call.lineno + first_line - 1}, under `{kind} {ast.unparse(node.test)}`"
    return None


def _construct_tree(cell) -> Tuple[Optional[ast.FunctionDef], int]:
    """The parsed ``construct`` of the cell's class and the line it starts at in its file."""
    try:
        lines, first_line = inspect.getsourcelines(type(cell).construct)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None, 0
    function = tree.body[0] if tree.body else None
    return (function if isinstance(function, ast.FunctionDef) else None), first_line


def conditional_call(wrappers: Iterable[object], target) -> Optional[str]:
    """Where a wrapper of ``wrappers`` calls ``target`` (a cell it holds as an attribute) under a condition
    computed in the graph, as text naming the class, line and condition; None if no such call was found."""
    for cell in wrappers:
        attributes = [name for name, value in vars(cell).items() if value is target]
        attributes += [name for name, value in getattr(cell, "_cells", {}).items() if value is target]
        if not attributes:
            continue
        function, first_line = _construct_tree(cell)
        if function is None:
            continue
        for attribute in attributes:
            where = _guarded_call(function, attribute, first_line)
            if where is not None:
                return f"{type(cell).__name__}.construct calls self.{attribute} at {where}"
    return None
