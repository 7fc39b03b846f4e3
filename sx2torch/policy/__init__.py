"""The policy pass: graphs + a run's precision -> typed specializations (rules 6.1-6.8), the
library's separable uses outlined as calls of its functions (library.py), whose calls are
then typed as any defun's, each graph typed once."""

import sx2torch.policy.library as library
from sx2torch.policy.rules import Lowered, Typed, verify
from sx2torch.policy.rules import run as typed
from sx2torch.syntax.program import Program

__all__ = ["Lowered", "Typed", "run", "verify"]


def run(program: Program, graphs: dict, precision: str) -> Lowered:
    """Type every graph, the library's uses in place; those outlined as calls are typed
    then, the functions' graphs shaped and specialized as their calls pass them their
    arguments."""

    def outline(lowered: Lowered) -> dict:
        calls = library.run(graphs, lowered)
        if calls:
            library.shape(program, graphs)
        return calls

    return typed(program, graphs, precision, outline)
