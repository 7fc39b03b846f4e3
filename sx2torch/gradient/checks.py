"""The gradients a loop around them would make wrong, refused with a diagnostic: one that
reaches a carried value through the earlier iterations, and one with respect to a carried
value whose start Y reads too."""

from __future__ import annotations

from sx2torch.errors import SourceError
from sx2torch.gradient.backward import Backward
from sx2torch.gradient.dependence import Dependence, made_inside, reads_around
from sx2torch.gradient.labels import label
from sx2torch.ir import Kind, Node


def carried_check(
    gradient: Node, visible: list, around: list, backward: "Backward", expansion: tuple
):
    """A gradient inside a loop whose backward reaches a carried value that depends on X
    through the iterations before would have to go back through them, and each may hold
    this gradient's backward again (a nesting as deep as the loop is long): a diagnostic.
    Where the carried value depends on X only as it is held fixed, the backward is right.
    """
    x = gradient.inputs[1]
    marked = Dependence(x, (gradient, *expansion)).around(visible, around)
    for loop in (n for n in around if n.kind is Kind.FOR and x not in made_inside(n)):
        reached = [c for c in loop.regions[0].inputs if backward.reaches(c)]
        for carried in (c for c in reached if c in marked.found):
            raise SourceError(
                gradient.span,
                f"this gradient reaches '{label(carried)}', which the loop around it "
                f"carries and which depends on '{label(x)}' through the iterations "
                "before, and a backward does not go back through a loop's earlier "
                "iterations: take the gradient outside the loop",
            )


def aliased_start_check(gradient: Node, y: Node, visible: list, around: list):
    """A gradient with respect to a value a loop around it carries, where Y also reads
    what that value starts as (or a value computed from it): in the first iteration the
    two are one value, whose gradient has both contributions, and in the later ones they
    are not, so no one backward of the body is the gradient of every iteration."""
    x = gradient.inputs[1]
    for loop in (n for n in around if n.kind is Kind.FOR):
        (body,) = loop.regions
        if x not in body.inputs:
            continue
        start = loop.inputs[body.inputs.index(x)]
        if not isinstance(start, Node):
            continue
        marked = Dependence(start)
        marked.mark(visible)
        inside = made_inside(loop)
        aliased = {v for v in marked.found if v not in inside}
        aliased |= {
            carried
            for carried, begins in zip(body.inputs, loop.inputs)
            if carried is not x and begins in marked.found
        }
        if aliased & _cone(y):
            raise SourceError(
                gradient.span,
                f"this gradient is with respect to '{label(x)}', which the loop around "
                f"it carries, starting as '{label(start)}', and Y reads that start too: "
                "in the first iteration they are one value, in the later ones not, so "
                "one backward of the body cannot be the gradient of every iteration; "
                f"start the loop from a copy Y does not read, as (* {label(start)} 1.0)",
            )


def _cone(y: Node) -> set:
    """The values Y is computed from, Y included."""
    seen, pending = set(), [y]
    while pending:
        node = pending.pop()
        if node not in seen:
            seen.add(node)
            pending.extend(i for i in reads_around(node) if isinstance(i, Node))
    return seen
