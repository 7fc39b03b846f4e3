"""The typed graph IR: what `trace` builds, `gradient` expands and `policy` types.

A defun is a dataflow graph of nodes in trace order. A node's inputs are other
nodes or compile-time scalars; its static attributes (axes, shapes) are scalars
too, kept as expressions so the emitter can write them in terms of the
constructor's arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Optional, Union

from sx2torch.errors import Span
from sx2torch.syntax.scalars import Scalar, run_nodes

ISLAND = "island"  # (with-numerics (:sensitivity :high) ...): f32
REGION = "region"  # (with-numerics (:precision :bf16) ...): bf16
# The model name of the library functions' graphs: no source model is named so (a space
# cannot be in a symbol). A CALL node with the attribute `library` calls one.
LIBRARY = "sexpgpu library"


@dataclass(frozen=True)
class Frame:
    """One `with-numerics` form (or a library mark) around the nodes traced in it."""

    mode: str
    text: str  # the form as the comment above its block shows it
    span: Span
    library: bool = False


class DType(str, Enum):
    """A value's dtype as the policy decides it; written as its name (`f32`) in text."""

    F32 = "f32"
    BF16 = "bf16"
    INT = "int"
    BOOL = "bool"

    __str__ = str.__str__
    __format__ = str.__format__


class Kind(Enum):
    """The closed set of node kinds: every pass dispatches on these, and only `OP` nodes
    look further, into the op registry."""

    INPUT = "input"  # an argument of the defun
    PARAM = "param"  # a read of a parameter (or of a sub-model's, where it is inlined)
    OP = "op"  # an op of the registry, its entry in `op`
    CALL = "call"  # a call of another defun of the model
    SUBMODEL = "submodel"  # a call of a sub-model's forward
    CAST = "cast"  # an explicit conversion, `(cast x :bf16)`
    IF = "if"  # two regions, one run, on a condition known when the module runs
    FOR = "for"  # one region run for each layer of a stack, carrying values
    ITEM = "item"  # one carried value of a `for` after the loop, or one value of a call
    GRADIENT = (
        "gradient"  # `(gradient Y X)` as traced: (Y, X); the gradient pass expands it
    )


CALLS = (Kind.CALL, Kind.SUBMODEL)


@dataclass(frozen=True)
class Shape:
    """A value's shape: a size per axis, None where a size is not known; `dims` is None where
    the rank is not known. A FOR's, or a call's that gives several values, is the tuple of
    their shapes. As a node is made (sx2torch/ops/shapes.py's `Analysis.made`), its defun's
    arguments and its calls' values are unknown, and `dims` may be a `Tail` (only the last
    sizes known); the ranks pass sets it again with the arguments shaped as every call in the
    file passes them (where the calls agree), a Tail then unknown."""

    dims: Optional[tuple]


# the shape an argument, or a loop's carried value, is made with: nothing known of it yet
UNKNOWN = Shape(None)


def argument(name: Optional[str], span: Span, form) -> "Node":
    """A defun's argument, or a loop's carried value, as it is made: its shape unknown."""
    return Node(Kind.INPUT, None, (), {}, span, form, name=name, shape=UNKNOWN)


@dataclass(eq=False)
class Region:
    """Nodes that run together under an `if` or a `for`: they may read values made before
    their node (as Python's blocks do), and they give `outputs` to it. A `for` region's
    `inputs` are its carried values, as they are when an iteration starts."""

    inputs: list
    nodes: list = field(default_factory=list)
    outputs: list = field(default_factory=list)


@dataclass(eq=False)
class Node:
    kind: Kind
    # an OP node's registry entry (sx2torch/ops/registry.py's `Op`: its fields say what the
    # op does, `op.name` names it), else None
    op: Optional[object]
    inputs: tuple
    attrs: dict
    span: Span
    form: object
    frames: tuple = ()
    name: Optional[str] = None
    note: Optional[str] = None  # a comment for the statement that computes this node
    # the library op a node computes the result of, for its name
    label: Optional[str] = None
    regions: tuple = ()  # an IF's (then, else), a FOR's (body,)
    aliases: tuple = ()  # the other names a `let` binds this value to, in order
    # the forward node a backward node differentiates, whose marks it carries
    forward: Optional["Node"] = None
    shape: Optional[Shape] = None  # set as the node is made, and by the ranks pass

    @property
    def mode(self) -> Optional[str]:
        return self.frames[-1].mode if self.frames else None

    @property
    def what(self) -> str:
        """The op, or the kind of a structural node: for dumps and messages."""
        return self.op.name if self.op is not None else self.kind.value

    def __repr__(self) -> str:
        return f"<{self.what} {self.name or ''} @{self.span.line}:{self.span.col}>"


Operand = Union[Node, Scalar]


@dataclass(eq=False)
class Graph:
    """One defun, traced once, before any dtype is known."""

    model: str
    name: str
    inputs: list
    keys: list  # [(name, Scalar default)]
    doc: Optional[str]
    nodes: list = field(default_factory=list)
    # the value it returns, or a tuple of them where its body ends in a vector `[a b]`
    output: Union[Operand, tuple, None] = None
    span: Optional[Span] = None
    # the library ops traced in place, for the functions pass to make calls of
    expansions: list = field(default_factory=list)
    # [(name, Scalar)]: the compile-time numbers the body's `let`s bind that are more than
    # a name (`(buckets (if bidirectional (// num-buckets 2) num-buckets))`), in order;
    # the plan keeps one the method writes more than once as a local
    lets: list = field(default_factory=list)
    # node -> the shape mismatch its op's rank rule proved as it was made (ops/shapes.py)
    mismatches: dict = field(default_factory=dict)

    @property
    def arity(self) -> int:
        return len(self.output) if isinstance(self.output, tuple) else 1


@dataclass(eq=False)
class Expansion:
    """A library op traced in place (its `expand`), as the functions pass may make it a call
    of the op's function: what it read, and the nodes it made, its result among them."""

    op: object  # the op's registry entry, as a node's
    inputs: tuple
    attrs: dict
    nodes: list
    result: Node
    frames: tuple  # around the op's form


def callee_key(node: Node, model: str) -> tuple:
    """(model, defun) of the graph a CALL node of `model` calls: a library function's, or
    one of the model's defuns."""
    return (LIBRARY if node.attrs.get("library") else model, node.attrs["target"])


def outputs(graph: Graph) -> list:
    """The values a graph returns, in order."""
    out = graph.output
    return list(out) if isinstance(out, tuple) else [out]


def walk(nodes: list):
    """Every node, its regions' nodes just after it, in the order they run."""
    for node in nodes:
        yield node
        for region in node.regions:
            yield from walk(region.nodes)


def reads(node: Node, numbers: Optional[list] = None) -> list:
    """The values a node reads: its inputs, what its regions give it, and the run-time
    numbers its scalars read (`x.shape[1]` in a slice's bound; `numbers`, where its
    `numbers_read` was found already)."""
    given = [out for region in node.regions for out in region.outputs]
    numbers = numbers_read(node) if numbers is None else numbers
    return [*node.inputs, *given, *numbers]


def numbers_read(node: Node) -> list:
    """The nodes whose Python numbers (ScalarOp.RUN) a node's operands and attributes read,
    besides its inputs: a size read for a slice's bound is read by the slice."""
    values = (*node.inputs, *node.attrs.values())
    found = [v for v in values if isinstance(v, (Scalar, tuple))]
    return run_nodes(tuple(found)) if found else []  # most read tensors alone


def prune(graph: Graph, roots: tuple = ()) -> None:
    """Drop the nodes neither the output nor `roots` depend on: a defun has no side effects.
    A node made in a region keeps the IF or FOR around it: the backward of an IF reads the
    values its forward branch made (under the same condition), even where the IF's own
    value is dead, as in an adjoint loop, which computes its layer's forward again; an
    adjoint loop keeps its forward loop, whose recorded values it reads.
    """
    owner = {
        inner: node
        for node in walk(graph.nodes)
        for region in node.regions
        for inner in [*region.inputs, *region.nodes]
    }
    live, pending = set(), [*outputs(graph), *run_nodes(tuple(outputs(graph))), *roots]
    while pending:
        node = pending.pop()
        if isinstance(node, Node) and node not in live:
            live.add(node)
            pending.extend(reads(node))
            if node in owner:
                pending.append(owner[node])
            if node.kind is Kind.FOR:
                # an adjoint loop reads the lists its forward loop records as it runs
                pending.append(node.attrs.get("reverse"))
    _keep(graph.nodes, live)


def _keep(nodes: list, live: set) -> None:
    """Drop the nodes that are not live, in regions too."""
    nodes[:] = [n for n in nodes if n in live]
    for node in nodes:
        for region in node.regions:
            _keep(region.nodes, live)


def verify(graph: Graph, known_ops) -> None:
    """Check a graph's invariants (tests run it after every pass from trace on): every
    value a node reads is made before it, in its region or around it, or in the same
    branch of an earlier IF of the same block on the same condition (the backward of an
    IF reads what its forward branch made, as Python's flat scope lets it); every op is
    known, every attribute of an op's node one its entry declares (an argument or a key),
    and every value has its shape; the output is one of the graph's values."""
    _verify_block(graph.nodes, outputs(graph), set(graph.inputs), known_ops)


def _verify_block(nodes: list, outputs: list, made: set, known_ops) -> None:
    made = set(made)
    for value in made:
        assert value.shape is not None, f"{value!r} made without its shape"
    branches: dict = {}  # (condition, branch) -> what the IFs so far made in it
    for node in nodes:
        assert (node.kind is Kind.OP) == (
            node.op is not None and known_ops.get(node.op.name) is node.op
        ), f"unknown op {node.what!r}"
        assert len(node.regions) == {Kind.IF: 2, Kind.FOR: 1}.get(node.kind, 0)
        assert node.shape is not None, f"{node!r} made without its shape"
        if node.kind is Kind.OP:
            declared = {a.name for a in (*node.op.args, *node.op.keys)}
            assert set(node.attrs) <= declared, f"{node!r}: attributes {node.attrs}"
        for operand in (*node.inputs, *numbers_read(node)):
            _assert_made(operand, made, node)
        for k, region in enumerate(node.regions):
            key = (node.attrs.get("condition"), k) if node.kind is Kind.IF else None
            seen = branches.setdefault(key, set()) if key else set()
            _verify_block(
                region.nodes,
                region.outputs,
                made | seen | set(region.inputs),
                known_ops,
            )
            seen.update(walk(region.nodes))
        made.add(node)
    for output in outputs:
        _assert_made(output, made, "the output")


def _assert_made(operand, made: set, reader) -> None:
    assert (
        operand is None or isinstance(operand, Scalar) or operand in made
    ), f"{reader!r} reads {operand!r} before it is made"
