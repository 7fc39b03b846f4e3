"""The tape: every op the evaluator computes, in order, as `gradient` differentiates it.

docs/LANGUAGE.md (gradient) differentiates the program's graph before the precision policy
types it, so a backward is lowered like the forward: each backward node is an op on the
forward values as the forward op read them, in the marks of the node it differentiates. A
node therefore keeps its operands as they were passed (a parameter as its master, a 0-d
element as one), not as they were cast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True, eq=False)  # its fields hold tensors: identity, not ==
class Node:
    # the op (interpret/ops.py), "alias" (a cast the rules insert), "vjp", or "if" (its
    # keys: the nodes of the branch taken and of the other)
    name: str
    args: list  # the operands as passed (concat's first one a list of them)
    keys: dict
    frame: object  # the forward's frame, in the mode the op computed in
    high: bool  # it read a :numerics :high parameter (a mark its backward carries)
    result: object
    fn: Optional[Callable] = None  # a vjp node's function of its operands' tensors
