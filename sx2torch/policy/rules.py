"""The precision policy.

Every defun is specialized per dtype signature of its tensor arguments, starting
from the entry points (defuns no other defun calls, and `forward`), whose float
arguments are f32 and whose index arguments are integer tensors. Each node gets
the dtype it computes in, the dtype it outputs, and the reason for its compute
dtype; a parameter's read is typed by a ParamRef until a reader decides how it
reads it; frozen parameters are then stored in the dtype their readers read (6.7).

Dtypes: "f32", "bf16", "int", "bool", and a ParamRef for a parameter of a model (a
trained one is an f32 master weight).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Optional

from sx2torch.errors import SourceError
import sx2torch.ir as ir
from sx2torch.ir import (
    CALLS,
    ISLAND,
    REGION,
    DType,
    Frame,
    Graph,
    Kind,
    Node,
    Scalar,
    walk,
)
from sx2torch.ops import REGISTRY, ArgKind, Result
from sx2torch.ops.registry import UNCAST
from sx2torch.syntax.program import Program

INTEGERS = {DType.INT, DType.BOOL}
# the kinds of operand whose arguments the policy asks for (`_Reaching`): integer ones,
# conditions, attention's masks
REACHED = (ArgKind.IDS, ArgKind.BOOL_TENSOR, ArgKind.MASK)
DATA_KINDS = (
    ArgKind.TENSOR,
    ArgKind.MATRIX,
    ArgKind.TENSORS,
)  # inputs whose values an op's output carries


@dataclass(eq=False)
class Typed:
    """One specialization of a defun: a graph with a dtype for every node."""

    graph: Graph
    signature: tuple
    ambient: Optional[str] = (
        None  # the mode of the with-numerics around the call, if any
    )
    decided: dict = field(default_factory=dict)  # node -> Decision
    callee: dict = field(default_factory=dict)  # call node -> Typed
    # op node -> for each input, whether torch's promotion converts it (`_promoted`),
    # found as the op is typed, for the plan's casts to read; only an op that promotes
    # one (a long expression keeps no list per node)
    promoted: dict = field(default_factory=dict)

    @property
    def model(self) -> str:
        return self.graph.model

    @property
    def output_dtype(self):
        """Its value's dtype; a tuple of them where it returns several values."""
        out = self.graph.output
        if isinstance(out, tuple):
            return tuple(self.decided[o].dtype for o in out)
        return self.decided[out].dtype if isinstance(out, Node) else None

    def decision(self, operand) -> "Decision":
        """The decision for `operand`; an empty one for a number."""
        return self.decided.get(operand, UNDECIDED)


@dataclass
class Lowered:
    """What the emitter needs: every specialization and where parameters are stored."""

    precision: str
    specializations: list  # Typed, callees before callers
    storage: dict  # (model, param) -> "f32" | "bf16"
    natural: dict  # (model, defun) -> Typed at f32 (and integer) arguments, or None: the plain method name
    # Graph -> its arguments that reach an attention's MASK (through ops that keep dtypes
    # and calls): a boolean or a float, as its caller passes it, so a cast of one converts
    # only a float (sx2torch/plan/casts.py)
    masks: dict = field(default_factory=dict)
    # Graph -> the values a takes-bool operand reads, and the copies they are made from
    fed: dict = field(default_factory=dict)

    def value_dtype(self, typed: Typed, operand) -> Optional[str]:
        """The dtype of an operand's tensor: a parameter's is the dtype it is stored in (one
        passed in as an argument is treated as f32, so a cast at its use is never missed).
        """
        if isinstance(operand, Scalar) or operand is None:
            return None
        dtype = typed.decided[operand].dtype
        if is_param(dtype):
            return (
                self.storage[_key(dtype)] if operand.kind is Kind.PARAM else DType.F32
            )
        return dtype

    def read_dtype(self, typed: Typed, node: Node, index: int) -> Optional[str]:
        """The dtype `node` reads its input `index` in, or None where it takes it as it is."""
        have = self.value_dtype(typed, node.inputs[index])
        if node.kind is Kind.CAST and have in (DType.INT, DType.BOOL):
            return node.attrs["dtype"]  # integers made floats: (cast mask :f32)
        if (
            have not in (DType.F32, DType.BF16)
            or node.kind in CALLS
            or node.kind is Kind.ITEM
        ):
            return None
        if node.kind is Kind.FOR:
            # an initial value, as the loop carries it
            return typed.decided[node].dtype[index]
        if node.kind is Kind.CAST:
            return node.attrs["dtype"]
        if _kind(node.op, index) in UNCAST:
            return None  # read only for its shape
        return typed.decided[node].compute

    def may_be_bool(self, typed: Typed, node: Node, index: int) -> bool:
        """Whether `node` reads at `index`, as an operand that takes booleans (attention's
        mask), or as the data of a copy (a reshape, a slice) that reaches one, an argument
        (or such a copy of one) that a caller may pass as booleans where the policy types
        it a float: a cast of it must convert a float only. (A bf16 region casts a float
        input where the copy reads it.)"""
        if node.kind is not Kind.OP or not _origins(node.inputs[index], typed.graph):
            return False
        op = node.op
        if _kind(op, index).takes_bool:
            return True
        copied = op.result is Result.KEEP and _kind(op, index) in DATA_KINDS
        return copied and node in self.fed[typed.graph]

    def promoted(self, typed: Typed, node: Node) -> list:
        """For each input, whether it is a 0-d tensor beside a tensor with axes, which
        torch converts to the dtype of the op as it loads it: cuda reads it as it is."""
        return typed.promoted.get(node) or [False] * len(node.inputs)


def output_dtype(typed: Typed, node: Node, index: int) -> Optional[str]:
    """The dtype an IF or FOR stores a region's output `index` in: its own, or the carried
    value's."""
    dtype = typed.decided[node].dtype
    return dtype if node.kind is Kind.IF else dtype[index]


@dataclass(frozen=True)
class ParamRef:
    """The dtype of a read of a parameter, until its readers decide how they read it."""

    model: str
    name: str


@dataclass(frozen=True)
class ParamChoice:
    """The dtype of an `if` whose branches read different parameters: a read of the one it
    chooses, until its readers decide how they read it."""

    refs: tuple  # ParamRefs, each once

    @property
    def name(self) -> str:
        return " or ".join(ref.name for ref in self.refs)


def is_param(dtype) -> bool:
    return isinstance(dtype, (ParamRef, ParamChoice))


def refs(dtype) -> tuple:
    """The parameters a read of `dtype` may read."""
    return dtype.refs if isinstance(dtype, ParamChoice) else (dtype,)


def _choice(reads: list):
    """The read of whichever parameter an `if` of parameter reads chooses."""
    found = tuple(dict.fromkeys(ref for read in reads for ref in refs(read)))
    return found[0] if len(found) == 1 else ParamChoice(found)


class Why(Enum):
    """Why a node computes in the dtype it does."""

    POLICY = "the run's precision"
    CONTAGION = "it reads a parameter or a bf16 value"
    NOT_YET = "no parameter or bf16 value has reached it yet"
    MARK = "a with-numerics form, or an op's library mark, around it"
    CALLED_IN = "its defun is called inside a with-numerics form"
    HIGH = "it reads a :numerics :high parameter"
    CAST = "an explicit cast"
    OUT_F32 = ":out :f32 keeps the f32 accumulator of the bf16 GEMM"
    AFTER_OUT_F32 = (
        "it reads the f32 result of an :out :f32 matmul, an island until bf16 (6.4)"
    )
    NEGATED = (
        "a negation read only in bf16 negates its operand cast down: the same bits"
    )


@dataclass(frozen=True)
class Reason:
    why: Why
    frame: Optional[Frame] = None  # the frame of MARK
    param: Optional[str] = None  # the parameter of HIGH


@dataclass(frozen=True)
class Decision:
    """What the policy decided for one node of a specialization."""

    # its output's dtype: a ParamRef for a parameter's read, a tuple for a FOR or a call
    # that gives several values, None for a number
    dtype: object
    compute: Optional[str] = (
        None  # of an op or cast: the dtype it reads float inputs in
    )
    reason: Optional[Reason] = None  # of an op or cast: why it computes in `compute`


UNDECIDED = Decision(None)


def run(program: Program, graphs: dict, precision: str, outline=None) -> Lowered:
    """Specialize from the entry points: the top model's forward and every defun of it that no
    other defun calls, at f32 (and integer) arguments; what they call is specialized on the way.
    Then every defun of every model gets its specialization at f32 (and integer) arguments
    too: the public method of its name. Parameters are stored as all of those read them.

    `outline(lowered)` may then make some of the library's uses, typed in place, calls of
    its functions (sx2torch/policy/library.py), returning the calls by graph: only those are
    typed then, each function specialized as its calls pass it its arguments, and the
    whole-graph rules applied again to their callers (`_outlined`); no graph is
    typed twice.
    """
    policy = _Policy(program, graphs, precision)
    natural = _entry_points(policy)
    lowered = _lowered(policy, natural)
    calls = outline(lowered) if outline is not None else {}
    if not calls:
        return lowered
    _outlined(policy, calls)
    return _lowered(policy, natural)


class _Policy:
    """Specializes graphs per dtype signature and decides each node's dtypes; `order`
    holds the specializations, callees first."""

    def __init__(self, program: Program, graphs: dict, precision: str):
        self.program = program
        self.graphs = graphs
        self.precision = precision
        self.kinds = _Reaching(program, graphs)
        self.high = _any_high(program)  # else no op's operand is (`_compute_dtype`)
        self.done: dict = {}  # (model, defun) -> (signature, ambient) -> Typed
        self.order: list = []
        # for `_outlined`: library uses; where first typed; decisions before `_finish`
        self.uses = {r.result for g in graphs.values() for r in g.expansions}
        self.position, self.raw = {}, {}

    def natural(self, graph: Graph) -> Optional[Typed]:
        """The specialization at f32 (and integer) arguments, which only names methods.

        A defun that is only ever called with other dtypes may have none: a stack
        it chains can need a bf16 input, say. It then names no method.
        """
        try:
            signature = self.kinds.natural_signature(graph)
            return self.specialize(graph, _callers_kinds(self.done, graph, signature))
        except SourceError:
            return None

    def specialize(
        self, graph: Graph, signature: tuple, ambient: Optional[str] = None
    ) -> Typed:
        """Nodes a call makes inside a with-numerics form carry its mark too (the callee's own forms win)."""
        made = self.done.setdefault((graph.model, graph.name), {})
        if (signature, ambient) in made:
            return made[signature, ambient]
        typed = Typed(graph, signature, ambient)
        for node, dtype in zip(graph.inputs, signature):
            typed.decided[node] = Decision(dtype)
        self._block(typed, graph.nodes)
        if graph.expansions:  # kept for `outlined`
            self.raw[typed] = dict(typed.decided)
        _finish(self, typed)
        made[signature, ambient] = typed
        self.order.append(typed)
        return typed

    def _block(self, typed: Typed, nodes: list) -> None:
        for node in nodes:
            if node in self.uses:
                at = (len(self.order), len(self.position))  # then, in order
                self.position.setdefault((typed, node), at)
            if node.kind is Kind.OP:  # most nodes
                self._op(typed, node)
            elif node.kind is Kind.PARAM:
                owner = node.attrs.get("owner", typed.model)
                typed.decided[node] = Decision(ParamRef(owner, node.attrs["param"]))
            elif node.kind in CALLS:
                self._call(typed, node)
            elif node.kind is Kind.CAST:
                dtype = node.attrs["dtype"]
                typed.decided[node] = Decision(dtype, dtype, Reason(Why.CAST))
            elif node.kind is Kind.IF:
                self._if(typed, node)
            elif node.kind is Kind.FOR:
                self._for(typed, node)
            elif node.kind is Kind.ITEM:
                carried = typed.decided[node.inputs[0]].dtype
                typed.decided[node] = Decision(carried[node.attrs["index"]])

    def _if(self, typed: Typed, node: Node) -> None:
        """Both branches are compiled; the value has the join of their dtypes. An `if` of
        parameter reads is a parameter read, for contagion and :numerics :high alike, until
        `_settle` gives it the dtype its readers read it in."""
        for region in node.regions:
            self._block(typed, region.nodes)
        reads = [typed.decision(r.outputs[0]).dtype for r in node.regions]
        if all(is_param(d) for d in reads):
            typed.decided[node] = Decision(_choice(reads))
            return
        outputs = [self._data_dtype(typed, o) for o in _deciding_outputs(node)]
        _decide_if(typed, node, self._join(_one_dtype(node, outputs), node))

    def _settle(self, typed: Typed) -> None:
        """Each `if` of parameter reads stores the dtype its readers read it in, each branch
        casting its parameter (an outer `if` first, which an inner one is read by); passed
        to a call, the f32 master; where they differ, or it is the result, its value: the
        join of the parameters'."""
        graph = typed.graph
        if not any(
            n.kind is Kind.IF and is_param(typed.decided[n].dtype)
            for n in walk(graph.nodes)
        ):
            return
        read_in: dict = {}
        for node in walk(graph.nodes):
            for index, operand in enumerate(node.inputs):
                read_in.setdefault(operand, set()).add(_read_in(typed, node, index))
            if node.kind is Kind.IF:
                for region in node.regions:
                    read_in.setdefault(region.outputs[0], set()).add(node)
        outputs = graph.output if isinstance(graph.output, tuple) else (graph.output,)
        for node in walk(graph.nodes):
            if node.kind is Kind.IF and is_param(typed.decided[node].dtype):
                dtypes = {
                    typed.decided[r].dtype if isinstance(r, Node) else r
                    for r in read_in.get(node, ())
                } - {None}
                if Kind.CALL in dtypes:  # passed on as a parameter is: its f32 master
                    dtypes = {DType.F32}
                elif len(dtypes) != 1 or node in outputs:
                    dtypes = {self._data_dtype(typed, node)}
                typed.decided[node] = Decision(dtypes.pop())

    def _for(self, typed: Typed, node: Node) -> None:
        """Carried dtypes start as the initial values' (a none start as f32, which any
        join absorbs) and join with an iteration's, until they stay the same."""
        (body,) = node.regions
        carried = [self._data_dtype(typed, init) for init in node.inputs]
        forward, start = node.attrs.get("reverse"), len(self.order)
        if forward is not None:  # an adjoint loop: the forward's carried values
            recorded = body.inputs[len(carried) :]
            for value, dtype in zip(recorded, typed.decided[forward].dtype):
                typed.decided[value] = Decision(dtype)
        while True:
            for carried_input, dtype in zip(body.inputs, carried):
                typed.decided[carried_input] = Decision(dtype or DType.F32)
            self._block(typed, body.nodes)
            after = [
                self._join(_carried(before, self._data_dtype(typed, out), node), node)
                for before, out in zip(carried, body.outputs)
            ]
            if after == carried:
                break
            carried = after
        typed.decided[node] = Decision(tuple(carried))
        _drop_passed(self, typed, node, start)

    def _join(self, dtypes: list, node: Node) -> Optional[str]:
        """Where f32 and bf16 values meet, the dtype an op that read both would compute in
        outside any with-numerics form: bf16 under the bf16 policy (6.2), f32 under f32.
        """
        kinds = set(dtypes)
        if len(kinds) <= 1:
            return next(iter(kinds), None)
        if kinds == {DType.F32, DType.BF16}:
            return self.precision
        raise SourceError(
            node.span,
            f"the values joined here differ in kind ({' and '.join(sorted(kinds))}): cast them to one",
        )

    def _call(self, typed: Typed, node: Node) -> None:
        graph = _callee_graph(self.program, self.graphs, node, typed.model)
        signature = tuple(typed.decided[i].dtype for i in node.inputs)
        if None in signature:
            raise SourceError(
                node.span,
                "an argument here is a number, not a tensor: pass numbers as &key arguments",
            )
        if node.kind is not Kind.CALL and any(is_param(s) for s in signature):
            raise SourceError(
                node.span,
                "pass a parameter to a sub-model through an activation, not as an argument",
            )
        callee = self.specialize(graph, signature, node.mode or typed.ambient)
        typed.callee[node] = callee
        typed.decided[node] = Decision(callee.output_dtype)

    def _op(self, typed: Typed, node: Node) -> None:
        op, inputs = node.op, node.inputs
        kinds = op.kinds(len(inputs))  # each input's, looked up once
        data = [isinstance(i, Node) and k not in UNCAST for i, k in zip(inputs, kinds)]
        decided = typed.decided
        dtypes = [decided[i].dtype if d else None for i, d in zip(inputs, data)]
        for operand, kind, dtype in zip(inputs, kinds, dtypes):
            _check_kind(node, kind, operand, dtype)
        # a 0-d value decides a dtype only where no tensor with axes does
        promoted = _promoted(typed, data, node)
        dtypes = [None if p else d for p, d in zip(promoted, dtypes)]
        floats = [d for d in dtypes if d in (DType.F32, DType.BF16) or is_param(d)]
        compute, reason = self._compute_dtype(node, typed, floats)
        if reason.why is Why.NOT_YET and _after_out_f32(typed, node):
            reason = AFTER_OUT_F32
        if op.result is Result.BOOL:
            out = DType.BOOL
        elif _gives_int(op, floats, dtypes):
            out = DType.INT
        elif op.result is Result.KEEP and not floats:
            # Integer data passes through; a condition (where's) is not data, and
            # number literals give a float in the compute dtype.
            data = [
                d
                for d, kind in zip(dtypes, kinds)
                if d is not None and kind is not ArgKind.BOOL_TENSOR
            ]
            out = data[0] if data else compute
        else:
            out = compute
        chosen = op.out_dtype(node.attrs) if op.out_dtype else None
        if chosen is not None:
            out = chosen
            if compute == DType.BF16 and chosen == DType.F32:
                reason = OUT_F32
        decided[node] = Decision(out, compute, reason)

    def _compute_dtype(self, node: Node, typed: Typed, floats: list) -> tuple:
        """The dtype a node computes in, and why (rules 6.2, 6.3, 6.5, 6.7). A backward
        node carries its forward node's marks: one of a node that reads a :numerics :high
        parameter reads in f32 too."""
        mode = node.mode or typed.ambient
        high = (
            next((d.name for d in floats if self._is_high(d)), None)
            if self.high
            else None
        )
        inherited = typed.decision(node.forward).reason
        if high is None and inherited is not None and inherited.why is Why.HIGH:
            high = inherited.param
        if mode == ISLAND:
            return DType.F32, _marked(node)
        if high is not None:
            return DType.F32, Reason(Why.HIGH, param=high)
        if mode == REGION:
            return DType.BF16, _marked(node)
        if self.precision == DType.F32:
            return DType.F32, POLICY
        if node.op.result is Result.RUN:
            return DType.BF16, POLICY
        if any(d == DType.BF16 or is_param(d) for d in floats):
            return DType.BF16, CONTAGION
        return DType.F32, NOT_YET

    def _is_high(self, dtype) -> bool:
        return is_param(dtype) and any(
            self._param(ref).numerics_high for ref in refs(dtype)
        )

    def _param(self, ref: ParamRef):
        return self.program.model(ref.model).params[ref.name]

    def _data_dtype(self, typed: Typed, operand) -> Optional[str]:
        """An operand's dtype as a value: a parameter read's is its f32 master, a `:dtype
        :bf16` one's bf16; of an `if` of them, their join."""
        if isinstance(operand, Scalar) or operand is None:
            return None
        dtype = typed.decided[operand].dtype
        if not is_param(dtype):
            return dtype
        stored = {self._param(ref).dtype or DType.F32 for ref in refs(dtype)}
        return self._join(list(stored), operand)


def _entry_points(policy: _Policy) -> dict:
    """Every specialization the program needs, from its entry points; (model, defun) ->
    the one at f32 (and integer) arguments, which names its public method."""
    program, graphs = policy.program, policy.graphs
    top = program.top.name
    called = {
        n.attrs["target"]
        for (model, _), g in graphs.items()
        if model == top
        for n in walk(g.nodes)
        if n.kind is Kind.CALL and not n.attrs.get("library")
    }
    for defun in program.top.defuns:
        if defun == "forward" or defun not in called:
            graph = graphs[top, defun]
            policy.specialize(graph, policy.kinds.natural_signature(graph))
    with_forward: set = set()  # models with a forward in policy.order[:seen]
    seen = 0
    for model in program.models.values():
        # A sub-model used only inside gradients (inlined there) still gets its forward.
        with_forward.update(
            t.model for t in policy.order[seen:] if t.graph.name == "forward"
        )
        seen = len(policy.order)
        if model.name not in with_forward:
            policy.natural(graphs[model.name, "forward"])
    return {
        (model.name, defun): policy.natural(graphs[model.name, defun])
        for model in program.all_models()
        for defun in model.defuns
    }


def _lowered(policy: _Policy, natural: dict) -> Lowered:
    # after the public methods, which read parameters too
    storage = _storage(policy.program, list(policy.order))
    masks = {
        typed.graph: policy.kinds.reaching(typed.graph, ArgKind.MASK)
        for typed in policy.order
    }
    fed = {typed.graph: _fed(typed.graph) for typed in policy.order}
    return Lowered(policy.precision, list(policy.order), storage, natural, masks, fed)


def _outlined(policy: _Policy, calls: dict) -> None:
    """Type the calls `outline` made of library uses (graph -> [CALL], in trace order):
    each caller keeps the decisions its other nodes had before the whole-graph rules
    (a call's value has the dtype its use had: the function computes the same ops on
    the same dtypes), those of the use's dropped nodes go, and the rules run again with
    the calls as readers. Each function's specialization takes its place in `order`
    where its first call's use was typed, as if the calls had been traced."""
    typed_before = list(policy.order)
    for typed in typed_before:
        made = calls.get(typed.graph)
        if made:
            present = _present(typed.graph)
            typed.decided = {n: d for n, d in policy.raw[typed].items() if n in present}
            typed.callee = {n: c for n, c in typed.callee.items() if n in present}
            for node in made:
                policy._call(typed, node)
            _call_reasons(typed)
            _finish(policy, typed)
    # a function's specialization -> where its first call's use was typed
    first: dict = {}
    for typed in typed_before:
        for node in calls.get(typed.graph, ()):
            callee, at = typed.callee[node], policy.position[typed, node]
            first[callee] = min(first.get(callee, at), at)
    functions = sorted(policy.order[len(typed_before) :], key=first.__getitem__)
    policy.order = []
    for index, typed in enumerate(typed_before):
        while functions and first[functions[0]][0] <= index:
            policy.order.append(functions.pop(0))
        policy.order.append(typed)
    policy.order += functions


def _finish(policy: _Policy, typed: Typed) -> None:
    """The rules that read the whole graph's decisions: an `if` of parameter reads
    settled, fills made as read, negations after the cast."""
    policy._settle(typed)
    # found once: a fill made in bf16 reads its operands for their shapes only (a
    # constant op's are LIKE), so how each value is read stays as it was
    reads = _reads_in_bf16(typed)
    if policy.precision == DType.BF16:
        _fills_as_read(typed, reads)
    _negate_after_cast(typed, reads)


def _after_out_f32(typed: Typed, node: Node) -> bool:
    """Whether a node reads the f32 result of an :out :f32 matmul, or a value that does."""
    for operand in node.inputs:  # a loop, not a generator: asked of most ops in bf16
        reason = typed.decision(operand).reason if isinstance(operand, Node) else None
        if reason is not None and reason.why in (Why.OUT_F32, Why.AFTER_OUT_F32):
            return True
    return False


def _call_reasons(typed: Typed) -> None:
    """A value that read an :out :f32 result only through a library use, now a call, reads
    the call's value, which has no reason: no parameter or bf16 value has reached it yet,
    as for any call's reader. Its dtypes stay (the reason decides none of them)."""
    for node in walk(typed.graph.nodes):
        decision = typed.decided[node]
        if decision.reason == AFTER_OUT_F32 and not _after_out_f32(typed, node):
            typed.decided[node] = Decision(decision.dtype, decision.compute, NOT_YET)


def _present(graph: Graph) -> set:
    """The values a graph holds now: its arguments, its nodes, its regions' inputs."""
    found = set(graph.inputs)
    for node in walk(graph.nodes):
        found.add(node)
        for region in node.regions:
            found.update(region.inputs)
    return found


def _any_high(program: Program) -> bool:
    """Whether a parameter of the program is :numerics :high."""
    return any(p.numerics_high for m in program.all_models() for p in m.params.values())


def _callers_kinds(done: dict, graph: Graph, signature: tuple) -> tuple:
    """The natural signature, with a bool argument where every call made so far (the entry
    points' and what they call, in `done`) passes a bool: a mask the public method would
    otherwise take as a float and cast, making it additive (bert's attention). Looked up
    by defun: scanning every specialization made, once per defun, was quadratic."""
    called = [s for s, _ in done.get((graph.model, graph.name), {})]
    if not called:
        return signature
    return tuple(
        (
            DType.BOOL
            if dtype is DType.F32 and all(s[k] is DType.BOOL for s in called)
            else dtype
        )
        for k, dtype in enumerate(signature)
    )


class _Reaching:
    """Which arguments of each graph reach an operand of a kind, found once per graph and
    kind: an entry point's arguments that reach an index are integer tensors, those that
    reach a condition (where's) boolean ones, and its other tensor arguments f32."""

    def __init__(self, program: Program, graphs: dict):
        self.program = program
        self.graphs = graphs
        self.found: dict = {}  # Graph -> ArgKind -> its inputs that reach one

    def natural_signature(self, graph: Graph) -> tuple:
        ints = self.reaching(graph, ArgKind.IDS)
        conditions = self.reaching(graph, ArgKind.BOOL_TENSOR)
        return tuple(
            (
                DType.INT
                if node in ints
                else DType.BOOL if node in conditions else DType.F32
            )
            for node in graph.inputs
        )

    def reaching(self, graph: Graph, kind: ArgKind) -> set:
        """Arguments that reach an operand of `kind` (one of `REACHED`), through ops that
        keep dtypes and through calls."""
        if graph not in self.found:
            self.found[graph] = self._reached(graph)
        return self.found[graph][kind]

    def _reached(self, graph: Graph) -> dict:
        """Each kind of `REACHED` -> the arguments that reach an operand of it: all the
        kinds in one walk of the graph."""
        found = {kind: set() for kind in REACHED}
        for node in walk(graph.nodes):
            for operand, kinds in zip(node.inputs, self._wants(node, graph)):
                for kind in kinds:
                    found[kind] |= _origins(operand, graph)
        return found

    def _wants(self, node: Node, graph: Graph) -> list:
        """For each input of `node`, the kinds of `REACHED` it is an operand of, or reaches
        one of in its callee."""
        if node.kind in CALLS:
            callee = _callee_graph(self.program, self.graphs, node, graph.model)
            reached = [(kind, self.reaching(callee, kind)) for kind in REACHED]
            return [
                [kind for kind, found in reached if callee.inputs[k] in found]
                for k in range(len(node.inputs))
            ]
        if node.kind is not Kind.OP:
            return ()
        return [(k,) if k in REACHED else () for k in node.op.kinds(len(node.inputs))]


def _gives_int(op, floats: list, dtypes: list) -> bool:
    """An int64 result: the op's, or a sum of integers or booleans, as torch's."""
    summed = op.result is Result.SUM and not floats and set(dtypes) & INTEGERS
    return op.result is Result.INT or bool(summed)


def _one_dtype(node: Node, outputs: list) -> list:
    """A choice's branches give one dtype: the constructor built one of the two models, and
    a join would cast the other's value, which that instance never computes so. The
    dtypes that decide."""
    outputs = [d for d in outputs if d is not None]
    if "choice" in node.attrs and len(set(outputs)) > 1:
        raise SourceError(
            node.span,
            f"the models of the choice '{node.attrs['choice']}' give values of "
            f"different dtypes here ({outputs[0]} and {outputs[1]}): cast one's "
            "forward to the other's dtype",
        )
    return outputs


def _deciding_outputs(node: Node) -> list:
    """The branch outputs that decide an `if`'s dtype: not a backward `if`'s zeros where a
    branch reads the value not (docs/LANGUAGE.md, gradient), where another branch gives
    its contribution."""
    outputs = [r.outputs[0] for r in node.regions]
    absent = node.attrs.get("absent") or ()
    given = [o for k, o in enumerate(outputs) if k not in absent]
    return given or outputs


def _decide_if(typed: Typed, node: Node, joined) -> None:
    """The `if` has the join of the outputs that decide; zeros that did not are made in it."""
    typed.decided[node] = Decision(joined)
    given = _deciding_outputs(node)
    for zeros in (r.outputs[0] for r in node.regions):
        if all(zeros is not o for o in given) and joined in (DType.F32, DType.BF16):
            typed.decided[zeros] = Decision(joined, joined, typed.decided[zeros].reason)


def _fills_as_read(typed: Typed, reads: dict) -> None:
    """A fill of ones or zeros that no parameter or bf16 value reached, read only by ops
    that read it in bf16 (and loops that carry it so), is made in bf16 (which holds it
    exactly), not in f32 and cast down: a gradient's seed under the bf16 policy. Its
    readers compute as they did. `reads`: `_reads_in_bf16`'s."""
    for node in walk(typed.graph.nodes):
        decision = typed.decided[node]
        if (
            node.kind is Kind.OP
            and node.op.constant
            and decision.reason.why is Why.NOT_YET
            and all(reads.get(node, [False]))
        ):
            typed.decided[node] = Decision(DType.BF16, DType.BF16, decision.reason)


def _reads_in_bf16(typed: Typed) -> dict:
    """node -> whether each read of it reads it in bf16; a region's output and the graph's
    are reads that are not."""
    reads: dict = {}
    for node in walk(typed.graph.nodes):
        for operand, bf16 in zip(node.inputs, _reads_bf16(typed, node)):
            reads.setdefault(operand, []).append(bf16)
        for out in (o for region in node.regions for o in region.outputs):
            reads.setdefault(out, []).append(False)
    output = typed.graph.output
    for out in output if isinstance(output, tuple) else (output,):
        reads.setdefault(out, []).append(False)
    return reads


def _reads_bf16(typed: Typed, node: Node) -> list:
    """Whether an op or a cast reads each input as data in bf16, or a loop carries it
    so."""
    count = len(node.inputs)
    if node.kind is Kind.CAST:
        return [node.attrs["dtype"] == DType.BF16] * count
    if node.kind is Kind.FOR:
        return [dtype == DType.BF16 for dtype in typed.decided[node].dtype]
    if node.kind is not Kind.OP or typed.decided[node].compute != DType.BF16:
        return [False] * count
    return [k not in UNCAST for k in node.op.kinds(count)]


def _callee_graph(program: Program, graphs: dict, node: Node, owner: str) -> Graph:
    """The graph a call or a sub-model's forward runs, called from a defun of `owner`."""
    if node.kind is Kind.CALL:
        return graphs[ir.callee_key(node, owner)]
    model = program.submodel(
        program.model(owner), node.attrs["target"], node.attrs.get("item")
    )
    return graphs[model, "forward"]


def _read_in(typed: Typed, node: Node, index: int):
    """How `node` reads its input `index` of a parameter read: None for its shape only,
    the CALL kind where it passes the read on."""
    if node.kind in CALLS or node.kind is Kind.ITEM:
        return Kind.CALL
    if node.kind is Kind.FOR:
        return typed.decided[node].dtype[index]
    if node.kind is Kind.CAST:
        return DType.F32  # a cast of a parameter reads it in f32 (its storage)
    if _kind(node.op, index) in UNCAST:
        return None
    return typed.decided[node].compute


NOT_YET = Reason(Why.NOT_YET)
AFTER_OUT_F32 = Reason(Why.AFTER_OUT_F32)
POLICY = Reason(Why.POLICY)
CONTAGION = Reason(Why.CONTAGION)
OUT_F32 = Reason(Why.OUT_F32)
CALLED_IN = Reason(Why.CALLED_IN)


def _marked(node: Node) -> Reason:
    """Why a node under a with-numerics mode computes as it does: its own form's mark, or
    its defun's call inside one."""
    return Reason(Why.MARK, node.frames[-1]) if node.frames else CALLED_IN


def _negate_after_cast(typed: Typed, reads: dict) -> None:
    """A negation of an f32 value that every reader reads in bf16 computes in bf16, on its
    operand cast down: the cast is written before the negation, not after it, which is
    the code a bf16 operand gives, so the two specializations can share one method.
    The bits are the same on every target: rounding to nearest even is symmetric, so
    round(-x) is -round(x), and the gradient of a negation is a negation, exact in bf16.
    A 0-d one read beside a tensor is converted by the reader's kernel: it stays.
    `reads`: `_reads_in_bf16`'s."""
    for node in reversed(list(walk(typed.graph.nodes))):
        decided = typed.decided[node]
        if (
            node.kind is Kind.OP
            and node.op.negates(node.inputs)
            and decided.reason == NOT_YET
            and typed.decision(node.inputs[0]).dtype == DType.F32
            and node.shape.dims != ()
            and all(reads.get(node, [False]))
        ):
            typed.decided[node] = Decision(DType.BF16, DType.BF16, Reason(Why.NEGATED))


def _storage(program: Program, used: list) -> dict:
    """A parameter's `:dtype` is its storage; else trained parameters stay f32 and a frozen
    one is stored in the dtype every reader reads (6.7)."""
    readers: dict = {}

    def read(dtype, read_as) -> None:
        if is_param(dtype):
            for ref in refs(dtype):
                readers.setdefault(_key(ref), set()).add(read_as)

    for typed in used:
        for node in walk(typed.graph.nodes):
            if node.kind is Kind.CAST:
                read(typed.decision(node.inputs[0]).dtype, DType.F32)
            if node.kind in CALLS or node.kind is Kind.CAST:
                continue
            kinds = node.op.kinds(len(node.inputs)) if node.kind is Kind.OP else ()
            for index, operand in enumerate(node.inputs):
                if kinds and kinds[index] is ArgKind.LIKE:
                    continue  # its shape read: any storage has it (a gradient's ones)
                dtype = (
                    typed.decision(operand).dtype if isinstance(operand, Node) else None
                )
                if is_param(dtype):
                    decided = typed.decided[node]
                    read(
                        dtype,
                        (
                            decided.dtype[index]  # a loop's initial value, carried
                            if node.kind is Kind.FOR
                            else decided.compute
                        ),
                    )
            for region in node.regions:  # a branch's or an iteration's value, stored
                for index, out in enumerate(region.outputs):
                    stored = (
                        typed.decision(out).dtype if isinstance(out, Node) else None
                    )
                    if is_param(stored):
                        read(stored, output_dtype(typed, node, index))
    storage = {}
    for model in program.all_models():
        for param in model.params.values():
            if param.is_module:
                continue
            read_as = readers.get((model.name, param.name), set())
            frozen_bf16 = not param.trainable and read_as == {DType.BF16}
            storage[model.name, param.name] = param.dtype or (
                DType.BF16 if frozen_bf16 else DType.F32
            )
    return storage


def _key(param: ParamRef) -> tuple:
    return param.model, param.name


def calling(roots, callees=lambda typed: typed.callee.values()) -> set:
    """The specializations `roots` are and call, directly or not (`callees`: those one
    calls)."""
    reached: set = set()
    pending = list(roots)
    while pending:
        typed = pending.pop()
        if typed not in reached:
            reached.add(typed)
            pending.extend(callees(typed))
    return reached


def _drop_passed(policy: _Policy, typed: Typed, loop: Node, start: int) -> None:
    """After a loop whose value starts as none, the specializations its body made on the
    way to its dtypes that the last pass calls not (a layer at the f32 start): kept, one
    would be the group's method (plan/sharing.py) and decide the others' entry casts."""
    if None not in loop.inputs:
        return
    made = policy.order[start:]
    body = walk(loop.regions[0].nodes)
    kept = calling(typed.callee[n] for n in body if n in typed.callee)
    policy.order[start:] = [t for t in made if t in kept]
    for dropped in (t for t in made if t not in kept):
        del policy.done[dropped.model, dropped.graph.name][
            dropped.signature, dropped.ambient
        ]


def _carried(before, after, node: Node) -> list:
    """A carried value's dtypes before and after an iteration, both a tensor's: a layer
    that returns a number (its const) is known to do so only here. A value that starts as
    none has the dtype its layers give (the first reads it not; `_for` types it f32, which
    any join absorbs, until they say)."""
    if before is None and None in node.inputs:
        before = after
    if None in (before, after):
        raise SourceError(
            node.span,
            "a carried value must be a tensor: an iteration here gives a number",
        )
    return [before, after]


def _promoted(typed: Typed, data: list, node: Node) -> list:
    """For each input of an op, whether it is a 0-d tensor that another data input with
    axes (or of a rank not known) decides the dtype beside; kept in `typed.promoted`
    where one is, for the plan's casts. `data`: whether each input is a tensor read as
    data."""
    # as torch's type promotion has it, a 0-d value never decides the dtype of an op that
    # reads a tensor with axes
    zero = [d and i.shape.dims == () for d, i in zip(data, node.inputs)]
    axes = any(d and not z for d, z in zip(data, zero))
    promoted = [axes and z for z in zero]
    if any(promoted):
        typed.promoted[node] = promoted
    return promoted


def _kind(op, index: int) -> str:
    return op.args[min(index, len(op.args) - 1)].kind


def _check_kind(node: Node, kind: str, operand, dtype: Optional[str]) -> None:
    if kind is ArgKind.IDS and dtype != DType.INT:
        got = (
            "a number" if isinstance(operand, Scalar) else f"{_describe(dtype)} tensor"
        )
        raise SourceError(
            node.span, f"'{node.op.name}' needs an integer tensor of indices, got {got}"
        )
    if kind is ArgKind.BOOL_TENSOR and dtype != DType.BOOL:
        raise SourceError(
            node.span, f"'{node.op.name}' needs a boolean condition, such as (> x 0)"
        )
    if (
        kind is ArgKind.MATRIX
        and dtype not in (DType.F32, DType.BF16)
        and not is_param(dtype)
    ):
        got = (
            "a number" if isinstance(operand, Scalar) else f"{_describe(dtype)} tensor"
        )
        raise SourceError(
            node.span, f"'{node.op.name}' needs a float tensor, got {got}"
        )
    if (
        kind is ArgKind.TENSOR
        and dtype in (DType.INT, DType.BOOL)
        and node.op.result is Result.FLOAT
    ):
        raise SourceError(
            node.span,
            f"'{node.op.name}' needs a float tensor, got {_describe(dtype)} tensor",
        )


def _describe(dtype: Optional[str]) -> str:
    return {DType.INT: "an integer", DType.BOOL: "a boolean"}.get(dtype, "a float")


def _origins(operand, graph: Graph) -> set:
    """The arguments a value is a reshaped, sliced or gathered copy of."""
    return {node for node in _copied(operand) if node.kind is Kind.INPUT}


def _fed(graph: Graph) -> set:
    """The values an operand that takes booleans reads, and those they are copies of."""
    found: set = set()
    for node in walk(graph.nodes):
        if node.kind is Kind.OP:
            for operand, kind in zip(node.inputs, node.op.kinds(len(node.inputs))):
                if kind.takes_bool:
                    found |= _copied(operand)
    return found


def _copied(operand) -> set:
    """`operand` and the values it is a reshaped, sliced or gathered copy of."""
    found, pending = set(), [operand]
    while pending:
        node = pending.pop()
        if not isinstance(node, Node) or node in found:
            continue
        found.add(node)
        if node.kind is Kind.OP and node.op.result is Result.KEEP:
            kinds = node.op.kinds(len(node.inputs))
            pending.extend(i for i, k in zip(node.inputs, kinds) if k in DATA_KINDS)
    return found


def verify(typed: Typed) -> None:
    """Check a specialization's invariants (tests run it after the policy): its graph's, and a
    decision for every value, with a compute dtype and a reason for every op and cast, a
    callee for every call."""
    ir.verify(typed.graph, REGISTRY)
    for node in [*typed.graph.inputs, *walk(typed.graph.nodes)]:
        assert node in typed.decided, f"{node!r} has no dtype"
        decided = typed.decided[node]
        if node.kind in (Kind.OP, Kind.CAST):
            assert None not in (decided.compute, decided.reason), f"{node!r} undecided"
        if node.kind in CALLS:
            assert node in typed.callee, f"{node!r} calls no specialization"
