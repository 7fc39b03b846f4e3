"""The plan pass: typed specializations -> one frozen `Plan` per specialization on the
compile's target, and the module's methods, decided before anything is named.

A `Plan` is what emission prints for one specialization: its layout (statements,
precision blocks, hoisted casts, liveness: sx2torch/plan/layout.py), every cast spelled
(sx2torch/plan/spelled.py), the arguments it casts down at entry and the specialization
whose code serves it. `Plans` adds the module's decisions: which specializations share a
method (sharing.py, decided once for every target on a held target's plans, where every
rounding is written out: a cuda method that computes two specializations through its
tensors' dtypes, `x * torch.sigmoid(x)` on f32 and on bf16, cannot be one method there,
whose tensors are all f32), which one is public, which are emitted and which are named
with their dtypes, the library functions the methods call, the consts they read, and
the modules the code imports (`math` where a written number calls a function of it). The
names pass (sx2torch/emit/naming.py) names what this decides, the imports' names taken;
emission prints it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sx2torch.ir import LIBRARY, Kind, Node, walk
import sx2torch.plan.functions as shared_functions
from sx2torch.plan.casts import may_be_none
from sx2torch.plan.layout import Layout, Structure
from sx2torch.plan.sharing import Sharing
from sx2torch.plan.spelled import Cast, Spelled, rounding, rounds
from sx2torch.plan.targets import Target, or_bool, or_none
from sx2torch.policy import Lowered, Typed
from sx2torch.policy.rules import calling
from sx2torch.syntax.program import Init, Program
from sx2torch.syntax.scalars import UNARY, Scalar, ScalarOp

# the target whose plans decide which specializations share a method (see the docstring)
DECIDING = Target("cpu")
# The scalar ops Python writes as functions of `math` (int is Python's own), which
# sx2torch/emit/scalars.py writes as `math.floor(...)`: a module that computes one imports it.
MATH = frozenset(op for op in UNARY if op is not ScalarOp.INT)


@dataclass(frozen=True)
class Plan:
    """One specialization's method as emission writes it."""

    typed: Typed
    layout: Layout  # its statements, blocks, hoisted casts and liveness on the target
    spelled: Spelled  # each cast spelled, the results rounded on store
    code: Typed  # the specialization whose method serves it (itself, where its own)
    entry: dict  # argument index -> the Cast it is cast down with at entry

    @property
    def saves_bf16(self) -> bool:
        """Whether its method saves its held bf16 values for the backward in 2 bytes
        (`@sx.saves_bf16`): on a held target, where it rounds a value (at entry or
        inside), which autograd may save."""
        rounds = self.spelled.rounds() or any(map(rounding, self.entry.values()))
        return self.layout.target.held and rounds


@dataclass(frozen=True)
class Plans:
    """The pass's output."""

    target: Target
    plans: dict  # Typed -> Plan, for every specialization, in the policy's order
    public: dict  # (model, defun) -> the specialization named as the source names it
    # (model, defun) -> its specializations the program calls, in the policy's order
    emitted: dict
    specialized: frozenset  # the specializations named with their dtypes
    library: tuple  # the library's specializations the methods call, by function
    # the top-level defuns' codes written as module-level functions (plan/functions.py)
    functions: tuple
    read_consts: dict  # model -> the consts its methods read (stored as attributes)
    # the modules the code imports beyond the preamble's: {"math"} where it calls math's
    imports: frozenset = frozenset()

    def function(self, typed: Typed) -> bool:
        """Whether the code serving `typed` is a module-level function, called by name."""
        code = self.plans[typed].code
        return code.model == LIBRARY or code in self.functions


def run(program: Program, lowered: Lowered, target: Target) -> Plans:
    structures = _structures(lowered)
    layouts = {
        typed: Layout(typed, target, lowered, structure=structures[typed.graph])
        for typed in lowered.specializations
    }
    judge = target if target.held else DECIDING
    by_defun = defuns(lowered)
    deciding = layouts if judge is target else _deciding(lowered, by_defun, structures)
    sharing = Sharing(lowered, judge, deciding)
    group = sharing.run(by_defun)  # Typed -> its Group
    public, called, names = _publics(program, lowered, by_defun, group, sharing)
    optional = _optional(called)
    entry = {
        typed: _entry(lowered.natural[key], typed)
        for key, typed in public.items()
        if typed is not None and typed is not lowered.natural[key]
    }
    # A method serving bf16 arguments it reads only cast down casts them at entry.
    for rep in (g.rep for g in dict.fromkeys(group.values())):
        found = sharing.entry(group[rep])
        if found:
            cast = frozenset(rep.graph.inputs[i] for i in found)
            layouts[rep] = Layout(
                rep, target, lowered, cast, structure=structures[rep.graph]
            )
            entry[rep] = sorted(set(entry.get(rep) or []) | set(found))
    rounded = Rounded(layouts, entry)
    plans = {
        typed: Plan(
            typed,
            layouts[typed],
            Spelled(layouts[typed]),
            group[typed].rep,
            {
                index: _down(target, lowered, typed, index, optional, rounded)
                for index in entry.get(typed) or ()
            },
        )
        for typed in lowered.specializations
    }
    emitted = {
        key: [t for t in specs if t in called] for key, specs in by_defun.items()
    }
    methods = _methods(program, emitted)
    plans, defined = shared_functions.pooled(plans, names, methods)
    library = _library(lowered, plans, methods)
    functions = tuple(rep for reps in library.values() for rep in reps)
    codes = [plans[t].code for t in methods]
    return Plans(
        target,
        plans,
        public,
        emitted,
        _specialized(methods, group, public, library, defined),
        functions,
        defined,
        *_consts_and_imports(program, codes, functions),
    )


def _methods(program: Program, emitted: dict) -> list:
    """The specializations emitted, class by class, in the order of each model's defuns."""
    return [
        typed
        for model in program.all_models()
        for defun in model.defuns
        for typed in emitted.get((model.name, defun), [])
    ]


def _down(
    target: Target,
    lowered: Lowered,
    typed: Typed,
    index: int,
    optional: set,
    rounded: "Rounded",
) -> Cast:
    """The cast of argument `index` down at entry: of a float only where it reaches a mask,
    which a caller may pass as booleans; of a tensor only where a caller may pass None
    (`optional`: (Typed, index))."""
    have = "f32"
    if typed.graph.inputs[index] in lowered.masks[typed.graph]:
        have = or_bool(have)
    if (typed, index) in optional:
        have = or_none(have)
    held = target.held and rounded.argument(typed, index)
    return Cast(target.entry(have, held), "bf16")


class Rounded:
    """Whether every read of a specialization's argument sends back a rounded gradient on a
    held target, so that a rounding at its entry would round none: a cast (`sx.as_f32` or a
    rounding), a store (whose hook rounds what its op sends back), an op that cannot change
    a bf16 value whose result's reads do so in turn, or a call whose callee's reads do (or
    which casts it at entry itself; a callee that returns it, or such an op of it, passes
    the question on to the call's reads). Not where the argument, or such an op of it, is
    returned by the method asked about or given to a region or a loop: the gradient of that
    read comes back as the caller sends it, from outside the module an f32 gradient that
    cuda's autograd would round to the bf16 output's dtype."""

    def __init__(self, layouts: dict, entry: dict):
        self.layouts = layouts
        self.entry = entry
        self.found: dict = {}  # (Typed, index) -> ROUNDED, RETURNED or None
        self.reads: dict = {}  # Typed -> its values' uncast reads, given and returned

    def argument(self, typed: Typed, index: int) -> bool:
        return self._argument(typed, index) is ROUNDED

    def _argument(self, typed: Typed, index: int) -> Optional[str]:
        key = (typed, index)
        if key not in self.found:
            self.found[key] = self._value(typed, typed.graph.inputs[index])
        return self.found[key]

    def _value(self, typed: Typed, value: Node) -> Optional[str]:
        """ROUNDED; RETURNED where some of its reads are the method's output, every
        other read rounding; None where a read sends its gradient back unrounded. The
        values an exact op makes of it are visited in a worklist, not by recursion: a
        chain of them may be long."""
        readers, given, returned = self._reads(typed)
        found, pending, seen = {ROUNDED}, [value], {value}
        while pending and None not in found:
            value = pending.pop()
            if value in given:
                return None
            if value in returned:
                found.add(RETURNED)
            for node, index in readers.get(value, ()):
                read = self._read(typed, node, index)
                if read is PASSED and node not in seen:
                    seen.add(node)
                    pending.append(node)
                elif read is not PASSED:
                    found.add(read)
        return None if None in found else min(found)

    def _read(self, typed: Typed, node: Node, index: int) -> Optional[str]:
        """What a read finds; PASSED where its node's value carries the gradient back as
        it is, so that value's reads decide."""
        if node.kind is Kind.OP and rounds(typed, node):
            return ROUNDED
        if node.kind in (Kind.OP, Kind.CAST):
            return PASSED
        if node.kind not in (Kind.CALL, Kind.SUBMODEL):
            return None
        callee = typed.callee[node]
        if index in (self.entry.get(callee) or ()):
            return ROUNDED
        if len(node.inputs) != len(callee.graph.inputs):
            return None
        found = self._argument(callee, index)
        if found is RETURNED and not isinstance(callee.graph.output, tuple):
            return PASSED
        return found if found is ROUNDED else None

    def _reads(self, typed: Typed) -> tuple:
        """value -> its reads read uncast, (node, index) each; the values given to a
        region as its output; the values returned."""
        if typed not in self.reads:
            conversions = self.layouts[typed].conversions
            readers: dict = {}
            given: set = set()
            for node in walk(typed.graph.nodes):
                for index, operand in enumerate(node.inputs):
                    if isinstance(operand, Node) and not conversions.conversion(
                        node, index
                    ):
                        readers.setdefault(operand, []).append((node, index))
                given.update(o for r in node.regions for o in r.outputs)
            output = typed.graph.output
            returned = set(output) if isinstance(output, tuple) else {output}
            self.reads[typed] = readers, given, returned
        return self.reads[typed]


# what `Rounded` finds of a value's reads ("returned" sorts first: it outweighs "rounded";
# PASSED: the read's own value decides)
RETURNED, ROUNDED, PASSED = "returned", "rounded", "passed"


def _specialized(
    methods: list, group: dict, public: dict, library: dict, functions: tuple
) -> frozenset:
    """The specializations named with their dtypes: a method's that another serves than the
    public one (and the one serving it), and a library function's or a module-level
    function's (`functions`) where the methods call two bodies of it."""
    found = {
        t
        for typed in methods
        for t in (typed, group[typed].rep)
        if public[typed.model, typed.graph.name] is None
        or group[typed] is not group[public[typed.model, typed.graph.name]]
    }
    found |= {rep for reps in library.values() if len(reps) > 1 for rep in reps}
    return frozenset(found) | shared_functions.several(functions)


def verify(plans: Plans, lowered: Lowered) -> None:
    """Every specialization has a plan on the target, served by a method whose own it is."""
    assert list(plans.plans) == lowered.specializations
    for typed, plan in plans.plans.items():
        assert plan.typed is typed and plan.layout.target == plans.target
        assert plans.plans[plan.code].code is plan.code, typed.graph.name
        assert set(plan.entry) <= set(range(len(typed.graph.inputs)))


def _structures(lowered: Lowered) -> dict:
    """Graph -> its Structure, which all its layouts share (plan/layout.py)."""
    graphs = dict.fromkeys(typed.graph for typed in lowered.specializations)
    return {graph: Structure(graph) for graph in graphs}


def _deciding(lowered: Lowered, by_defun: dict, structures: dict) -> dict:
    """The layouts on a held target that sharing compares, those of the defuns with several
    specializations: it reads no other, a defun's one specialization being its method.
    (Each Layout of a long expression is a sixth of its compile.)"""
    return {
        typed: Layout(typed, DECIDING, lowered, structure=structures[typed.graph])
        for typed in lowered.specializations
        if len(by_defun[typed.model, typed.graph.name]) > 1
    }


def defuns(lowered: Lowered) -> dict:
    """(model, defun) -> its specializations, in order: found once, not by a scan per defun."""
    found: dict = {}
    for typed in lowered.specializations:
        found.setdefault((typed.model, typed.graph.name), []).append(typed)
    return found


def _library(lowered: Lowered, plans: dict, methods: list) -> dict:
    """Library function -> its specializations whose code the methods' code calls, in the
    policy's order."""
    reached, pending = set(), [plans[t].code for t in methods]
    while pending:
        for callee in pending.pop().callee.values():
            rep = plans[callee].code
            if rep.model == LIBRARY and rep not in reached:
                reached.add(rep)
                pending.append(rep)
    found: dict = {}
    for typed in lowered.specializations:
        if typed in reached:
            found.setdefault(typed.graph.name, []).append(typed)
    return found


def _consts_and_imports(program: Program, codes: list, functions: tuple) -> tuple:
    """The consts the methods' codes read and the modules the code imports, from the
    numbers each code written writes, found once for both."""
    numbers = {
        typed: list(_scalars(_graph_parts(typed.graph)))
        for typed in dict.fromkeys([*codes, *functions])
    }
    written = [*codes, *functions]
    return _read_consts(codes, numbers), _imports(program, written, numbers)


def _read_consts(emitted, numbers: dict) -> dict:
    """model -> the consts the emitted methods read (a sub-model's through it, `layer.d`);
    `numbers`: each one's written numbers."""
    found: dict = {}
    for typed in emitted:
        for value in numbers[typed]:
            if value.op is ScalarOp.CONST:
                owner = value.args[2] if len(value.args) > 2 else typed.model
                found.setdefault(owner, set()).add(value.args[0])
    return found


def _imports(program: Program, written: list, numbers: dict) -> frozenset:
    """{"math"} where a number the module writes calls a function of math: a const's value,
    a parameter's initializer or condition, a sub-model's arguments or a stack's count (the
    constructors write every model's), or a number of a method or library function
    written (`written`; `numbers`: the numbers of each one's graph), its &key defaults
    included."""
    if any(value.op in MATH for typed in written for value in numbers[typed]):
        return frozenset({"math"})
    parts: list = [[default for _, default in typed.graph.keys] for typed in written]
    for model in program.all_models():
        parts.append([const.value for const in model.consts.values()])
        parts.append([[param.init, param.when] for param in model.params.values()])
    calls = any(value.op in MATH for value in _scalars(parts))
    return frozenset({"math"}) if calls else frozenset()


def _graph_parts(graph) -> list:
    """What of a graph holds numbers: its output, its nodes' inputs and attributes, its
    regions' outputs."""
    parts: list = [graph.output]
    for node in walk(graph.nodes):
        parts += [node.inputs, node.attrs]
        parts += [region.outputs for region in node.regions]
    return parts


def _scalars(value):
    """Every Scalar in `value` (nested in tuples, lists, dicts and initializers), each
    one's operands after it."""
    pending = [value]
    while pending:
        value = pending.pop()
        if isinstance(value, Node):  # most of a graph's parts: no number
            continue
        if isinstance(value, Scalar):
            yield value
            pending.extend(value.args)
        elif isinstance(value, (tuple, list)):
            pending.extend(value)
        elif isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, Init):
            pending.extend([value.args, value.count])


def _publics(
    program: Program, lowered: Lowered, by_defun: dict, group: dict, sharing: Sharing
):
    """(model, defun) -> its public specialization, the specializations emitted (those
    the program runs, the public ones and what they call), and the top-level defuns
    written as module-level functions. A public method the program does not run may call
    a natural specialization, which is then public itself. The top model has none of a
    module-level function's that it does not call."""
    names = shared_functions.shared(program, lowered)
    called = _called(program, lowered, group, names)
    top = program.top.name
    while True:
        public = {
            key: (
                None
                if key[0] == top
                and key[1] in names
                and not called.intersection(by_defun.get(key, []))
                else _public(natural, by_defun.get(key, []), called, group, sharing)
            )
            for key, natural in lowered.natural.items()
        }
        grown = _closure(called | {t for t in public.values() if t is not None}, group)
        if grown == called:
            return public, called, names
        called = grown


def _called(program: Program, lowered: Lowered, group: dict, names: frozenset) -> set:
    """The specializations the program runs: the top model's public methods (its forward
    and the defuns it does not call itself, but the module-level functions) and what they
    call."""
    top = [t for t in lowered.specializations if t.model == program.top.name]
    inner = {c.graph.name for t in top for c in t.callee.values() if c.model == t.model}
    return _closure(
        {
            lowered.natural[program.top.name, defun]
            for defun in program.top.defuns
            if defun == "forward" or defun not in inner | names
        }
        - {None},
        group,
    )


def _optional(called: set) -> set:
    """(specialization, argument index) for the arguments a caller may pass None: an
    `if` with a `none` branch, or an argument of its own that may be None."""
    found: set = set()
    grown = True
    while grown:
        grown = False
        for typed in called:
            for node, callee in typed.callee.items():
                for index, operand in enumerate(node.inputs):
                    if (callee, index) not in found and may_be_none(
                        operand, typed, found
                    ):
                        found.add((callee, index))
                        grown = True
    return found


def _closure(roots: set, group: dict) -> set:
    """`roots` and every specialization they call, directly or not: the calls of the
    code that serves each."""
    return calling(roots, lambda typed: group[typed].rep.callee.values())


def _public(natural, specs: list, called: set, group: dict, sharing: Sharing):
    """The specialization named as the source names the defun: the natural one, unless
    the program calls the defun only with bf16 where the natural one takes f32 and other
    code: then the first of those, which casts its f32 arguments down at entry (None
    left as it is where a caller may pass it), serves callers from outside too. Its
    method may serve callers that pass more arguments in bf16, where it casts those at
    entry for the callers that pass them f32 (`Sharing.entry`)."""
    if natural is None or any(group[t] == group[natural] for t in specs if t in called):
        return natural
    for typed in specs:
        mates = [t for t in specs if group[t] == group[typed] and t in called]
        casts = _entry(natural, typed)
        if not mates or group[typed].rep is not typed or casts is None:
            continue
        served = set(casts) | set(sharing.entry(group[typed]))
        if all(_entry(natural, t) is not None for t in mates) and all(
            set(_entry(natural, t)) <= served for t in mates
        ):
            return typed
    return natural


def _entry(natural, typed) -> Optional[list]:
    """The arguments `typed` casts at entry to serve f32 callers, or None where it cannot."""
    if typed.ambient != natural.ambient:
        return None
    casts = []
    for index, (have, want) in enumerate(zip(natural.signature, typed.signature)):
        if have == want:
            continue
        if (have, want) != ("f32", "bf16"):
            return None
        casts.append(index)
    return casts
