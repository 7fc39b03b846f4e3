"""The cache pass: the KV-cached specialization of a `(defrun NAME :generate true)` run, made
from the traced graphs (docs/LANGUAGE.md, "Generation").

On the defuns the top model's `forward` reaches: each `(attention ... :causal true)` becomes
`cached-attention`, which keeps its keys and values; each `arange-of` and `positions` over
the sequence axis (axis 1, the `[batch, length]` of the ids forward takes) becomes its cached
op, which starts where the cache ends; in `forward`, the value made by the last form that
reaches an attention goes through `last-position`, so the tokenwise work after it (the final
norm's reader, lm_head) runs on the last position only, transformers' `logits_to_keep=1`.
Anything else that mixes positions would compute wrong numbers from a cache, so it is a
located diagnostic: a non-causal attention or one given a mask, a product of two values made
from the input (attention written out), an op that combines values along an axis other than
the last (a reduction, a scan, a softmax over it), the sequence's size used as a value.
Other runs are left as they are.
"""

from __future__ import annotations

from typing import Optional

from sx2torch.errors import SourceError
from sx2torch.ir import Graph, Kind, Node, Scalar, walk
from sx2torch.ops import REGISTRY, ArgKind
from sx2torch.ops.sequence import SEQUENCE
from sx2torch.syntax.echo import echo
from sx2torch.syntax.program import Program, Run
from sx2torch.trace.calls import calls


def run(program: Program, graphs: dict, chosen: Optional[Run]) -> None:
    if chosen is None or not chosen.generate:
        return
    entry = (program.top.name, "forward")
    reached = _reached(program, graphs, entry)
    for key in reached:
        _specialize(graphs[key])
    holds = _holding(program, graphs, reached)
    if not holds[entry]:
        raise SourceError(
            chosen.span,
            f"run '{chosen.name}' asks to generate, but forward calls no causal "
            "attention: there is nothing to cache",
        )
    _keep_last(graphs[entry], program, holds)


def _reached(program: Program, graphs: dict, entry: tuple) -> list:
    """`entry` and the defuns it calls, at any depth."""
    found, pending = [], [entry]
    while pending:
        key = pending.pop()
        if key not in found:
            found.append(key)
            pending.extend(callee for callee, _ in calls(program, graphs[key]))
    return found


def _specialize(graph: Graph) -> None:
    """Each op's `cached` rewrite, in place; what cannot be cached, a diagnostic."""
    made = _from_input(graph)
    for node in walk(graph.nodes):
        if node.kind is not Kind.OP:
            continue
        op = REGISTRY[node.op]
        flags = tuple(x in made for x in node.inputs)
        found = op.cached(node.attrs, node.inputs, flags) if op.cached else None
        if found is None and node in made and op.mixes_along(node.attrs):
            found = "combines values along an axis that may be the sequence's"
        if isinstance(found, str):
            raise SourceError(
                node.span, f"a :generate run cannot cache {echo(node.form)}: it {found}"
            )
        if found is not None:
            node.op, node.attrs = found


def _from_input(graph: Graph) -> set:
    """The values computed from the graph's arguments or carried values (activations), not
    counting reads for a shape or device alone."""
    made = set(graph.inputs)
    for node in walk(graph.nodes):
        for region in node.regions:
            made.update(region.inputs)
        op = REGISTRY.get(node.op)
        if any(x in made and not _shape_only(op, k) for k, x in enumerate(node.inputs)):
            made.add(node)
    return made


def _shape_only(op, k: int) -> bool:
    """Whether an op reads its k-th operand for its shape or device alone."""
    return op is not None and k < len(op.args) and op.args[k].kind is ArgKind.LIKE


def _holding(program: Program, graphs: dict, reached: list) -> dict:
    """For each reached defun, whether it calls a cached attention, at any depth (calls
    nest at most MAX_CALL_DEPTH deep, without recursion: trace checked it)."""
    holds: dict = {}

    def visit(key: tuple) -> bool:
        if key not in holds:
            graph = graphs[key]
            for callee, _ in calls(program, graph):
                visit(callee)
            holds[key] = any(
                _holds(n, graph, program, holds) for n in walk(graph.nodes)
            )
        return holds[key]

    for key in reached:
        visit(key)
    return holds


def _holds(node: Node, graph: Graph, program: Program, holds: dict) -> bool:
    if node.kind is Kind.OP:
        return REGISTRY[node.op].caches
    if node.kind in (Kind.CALL, Kind.SUBMODEL):
        return holds[_callee(node, graph, program)]
    return any(
        _holds(n, graph, program, holds) for r in node.regions for n in walk(r.nodes)
    )


def _callee(node: Node, graph: Graph, program: Program) -> tuple:
    target = node.attrs["target"]
    if node.kind is Kind.CALL:
        return (graph.model, target)
    callee = program.submodel(
        program.model(graph.model), target, node.attrs.get("item")
    )
    return (callee, "forward")


def _keep_last(graph: Graph, program: Program, holds: dict) -> None:
    """Put `last-position` after the last top-level node of forward that reaches an
    attention (after each of its ITEMs where it gives several values): every later reader
    of it reads the last position."""
    last = [n for n in graph.nodes if _holds(n, graph, program, holds)][-1]
    items = [n for n in graph.nodes if n.kind is Kind.ITEM and n.inputs[0] is last]
    for value in items or [last]:
        _slice_after(graph, value)


def _slice_after(graph: Graph, value: Node) -> None:
    kept = Node(
        Kind.OP,
        "last-position",
        (value,),
        {"axis": Scalar.lit(SEQUENCE)},
        value.span,
        value.form,
        value.frames,
    )
    at = graph.nodes.index(value) + 1
    after = set(walk(graph.nodes[at:]))
    for node in after:
        node.inputs = tuple(kept if x is value else x for x in node.inputs)
        for region in node.regions:
            region.outputs = [kept if x is value else x for x in region.outputs]
    graph.nodes.insert(at, kept)
    for expansion in graph.expansions:  # the library ops the functions pass may call
        if expansion.result in after:
            expansion.inputs = tuple(
                kept if x is value else x for x in expansion.inputs
            )
    if isinstance(graph.output, tuple):
        graph.output = tuple(kept if x is value else x for x in graph.output)
    elif graph.output is value:
        graph.output = kept
