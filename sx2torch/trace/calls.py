"""The call graph, read from the traced graphs: no defun calls itself, directly or through
others, and calls nest at most MAX_CALL_DEPTH defuns deep (the policy and the emitted module
follow calls by recursion). Trace runs the check on what it made; under `gradient`, where
calls are traced in place, the tracer stops a recursion as it would loop, with the same words.
"""

from __future__ import annotations

from sx2torch.errors import SourceError, Span
from sx2torch.ir import Graph, Kind, walk

MAX_CALL_DEPTH = 64  # defuns in one chain of calls


def check(program, graphs: dict) -> None:
    """`graphs`: {(model, defun): Graph}, in source order."""
    edges = {key: calls(program, graph) for key, graph in graphs.items()}
    below: dict = (
        {}
    )  # a finished defun -> the length of the longest chain of calls it starts
    for root in edges:
        stack, path = [(root, iter(edges[root]))], [root]
        while stack:
            caller, callees = stack[-1]
            step = next(callees, None)
            if step is None:
                below[caller] = 1 + max(
                    (below[callee] for callee, _ in edges[caller]), default=0
                )
                stack.pop()
                path.pop()
                continue
            callee, span = step
            if callee in path:
                raise recursion(path, callee, span)
            if len(path) + below.get(callee, 1) > MAX_CALL_DEPTH:
                raise too_deep(span)
            if callee not in below:
                stack.append((callee, iter(edges[callee])))
                path.append(callee)


def calls(program, graph: Graph) -> list:
    """[((model, defun), span)] of a graph's calls, in source order: of its model's defuns,
    and of a sub-model's forward (called, or applied to each layer of a stack)."""
    model = program.model(graph.model)
    found = []
    for node in walk(graph.nodes):
        target = node.attrs.get("target")
        if node.kind is Kind.CALL:
            found.append(((graph.model, target), head(node.form)))
        elif node.kind is Kind.SUBMODEL:
            callee = program.submodel(model, target, node.attrs.get("item"))
            found.append(((callee, "forward"), head(node.form)))
    return sorted(found, key=lambda call: (call[1].line, call[1].col))


def head(call) -> Span:
    """Where a call is reported: at the name it calls."""
    return call.items[0].span


def recursion(path: list, callee: tuple, span: Span) -> SourceError:
    route = " -> ".join(name for _, name in path[path.index(callee) :] + [callee])
    return SourceError(
        span, f"defun '{callee[1]}' calls itself ({route}); recursion is not supported"
    )


def too_deep(span: Span) -> SourceError:
    return SourceError(span, f"calls nested more than {MAX_CALL_DEPTH} defuns deep")
