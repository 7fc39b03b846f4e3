"""The policy pass: graphs + a run's precision -> typed specializations (rules 6.1-6.8), the
library's separable uses outlined as calls of its functions (library.py), which are then
typed as any defun's."""

import sx2torch.policy.library as library
from sx2torch.policy.rules import Lowered, Typed, verify
from sx2torch.policy.rules import run as typed
from sx2torch.syntax.program import Program

__all__ = ["Lowered", "Typed", "run", "verify"]


def run(program: Program, graphs: dict, precision: str) -> Lowered:
    """Type every graph; where the library's uses, so typed, are outlined, type again: the
    functions' graphs are specialized as their calls pass them their arguments."""
    lowered = typed(program, graphs, precision)
    if not library.run(graphs, lowered):
        return lowered
    library.shape(program, graphs)
    return typed(program, graphs, precision)
