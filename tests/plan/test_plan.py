"""The printed plan (sx2torch/plan/printed.py) that sharing compares: two specializations'
plans print the same exactly where their held code is the same but for the names of their
locals, and the plan pass decides which share a method without writing any code."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sx2torch import compiler
from sx2torch.compiler import Options, Unit
import sx2torch.build as b
from sx2torch.emit import method, module, naming
from sx2torch.emit.method import ClassContext
from sx2torch.ir import Kind
from sx2torch.plan.casts import Conversions
from sx2torch.plan.layout import Layout, Yield
from sx2torch.plan.methods import DECIDING, Plan, defuns
from sx2torch.plan.printed import printed
from sx2torch.plan.sharing import Sharing, View
from sx2torch.plan.spelled import Spelled
from sx2torch.plan.targets import Target

from cases import SOURCES


def _named(text: str, name: str = "model.lisp", target: str = "cpu"):
    """The unit of a compile run through `names`."""
    return compiler.run(Unit(text, name, Options(target=target)), until="names")


def _held_code(typed, layout, unit, methods) -> str:
    """The method MethodEmitter writes on the deciding target from `layout`, its calls by
    `methods`: the reference the printed plan is checked against."""
    plan = Plan(typed, layout, Spelled(layout), typed, {})
    plans = replace(
        unit.plans, plans={**unit.plans.plans, typed: plan}, specialized=frozenset()
    )
    names = replace(
        unit.names,
        methods=methods,
        locals={
            **unit.names.locals,
            typed: naming._LocalNaming(layout, unit.plans.imports).run(),
        },
    )
    ctx = ClassContext(DECIDING, plans, names, names.attrs.get(typed.model, {}))
    return b.code(module._method(typed, "method", ctx))


SHARED = [s for s in SOURCES if s.stem in ("specializations", "public-methods")] + [
    s for s in SOURCES if s.parent.name == "examples"
]


@pytest.mark.parametrize("source", SHARED, ids=[s.stem for s in SHARED])
def test_plans_print_the_same_exactly_where_the_held_code_is_the_same(source):
    """Every pair of specializations of a defun, each as it runs on its own arguments and
    on the other's (sharing's View): the plans print the same iff the held code does."""
    unit = _named(source.read_text(), source.name)
    lowered = unit.lowered
    methods = {t: f"m{i}" for i, t in enumerate(lowered.specializations)}
    compared = 0
    for specs in defuns(lowered).values():
        for a in specs:
            own = Layout(a, DECIDING, lowered)
            for other in specs:
                view = Layout(
                    a, DECIDING, lowered, conversions=View(a, DECIDING, lowered, other)
                )
                theirs = Layout(other, DECIDING, lowered)
                for mine in (own, view):
                    same_plan = printed(mine, methods) == printed(theirs, methods)
                    same_code = _held_code(a, mine, unit, methods) == _held_code(
                        other, theirs, unit, methods
                    )
                    assert same_plan == same_code, (a.graph.name, a.signature)
                    compared += same_plan
    assert compared


SOURCE = """
(defun same (x) (relu x))
(defun differs (x) (* x x))
(defun forward (x)
  (let ((b (cast x :bf16)))
    (+ (same x) (cast (same b) :f32) (differs x) (cast (differs b) :f32))))
(defrun train :precision :bf16)
"""


def test_the_plan_groups_specializations_without_writing_code(monkeypatch):
    """A held target's relu of a bf16 value is written as of an f32 one (it cannot leave
    bf16 values), so `same` is one method; `differs` rounds its bf16 product, so it is two.
    """

    def refuse(*args):
        raise AssertionError("naming wrote a method")

    monkeypatch.setattr(method.MethodEmitter, "__init__", refuse)
    for target in ("cuda", "cpu", "metal"):
        names = _named(SOURCE, target=target).names
        by_defun = {}
        for typed, name in names.methods.items():
            by_defun.setdefault(typed.graph.name, set()).add(name)
        assert by_defun["same"] == {"same"}
        assert by_defun["differs"] == {"differs", "differs_bf16"}


def test_a_plan_notes_the_rounding_its_code_writes():
    lowered = _named(SOURCE).lowered
    specs = defuns(lowered)["model", "differs"]
    f32, bf16 = sorted(specs, key=lambda t: "bf16" in t.signature)
    methods = {}
    plans = [printed(Layout(t, DECIDING, lowered), methods) for t in (f32, bf16)]
    assert [" rounds" in plan for plan in plans] == [False, True]
    assert plans[0] == plans[1].replace(" rounds", "")


def test_names_and_emit_read_the_plan_deciding_nothing(monkeypatch):
    """Past the plan pass no layout is built, no read's cast decided and no cast spelled:
    the names pass and emission read the plan (the names pass built a layout at four sites,
    and emission spelled each cast as it wrote it)."""
    for target in ("cuda", "cpu"):
        unit = compiler.run(Unit(SOURCE, "model.lisp", Options(target=target)), "plan")
        with monkeypatch.context() as patched:
            for owner, name in [
                (Layout, "__init__"),
                (Conversions, "__init__"),
                (Spelled, "__init__"),
                (Target, "spelling"),
            ]:
                patched.setattr(owner, name, _refuse)
            names = [p.name for p in compiler.PASSES]
            rest = compiler.PASSES[names.index("plan") + 1 :]
            for step in rest:
                step.run(unit)
        assert "def differs_bf16(self, x):" in unit.code


def _refuse(*args, **kwargs):
    raise AssertionError("decided after the plan pass")


def test_each_op_s_promotion_and_reads_in_bf16_are_found_once(monkeypatch):
    """The policy finds each op's 0-d promotion as it types it and keeps it for the
    plan's casts, and how each value is read in bf16 once per specialization for both
    whole-graph rules that ask: neither is found again per layout or per rule."""
    import sx2torch.policy.rules as rules

    counted: dict = {"promoted": [], "reads": []}
    promoted, reads_in_bf16 = rules._promoted, rules._reads_in_bf16

    def promoted_counted(*args):
        counted["promoted"].append(args[-1])  # the op node
        return promoted(*args)

    def reads_counted(typed):
        counted["reads"].append(typed)
        return reads_in_bf16(typed)

    monkeypatch.setattr(rules, "_promoted", promoted_counted)
    monkeypatch.setattr(rules, "_reads_in_bf16", reads_counted)
    source = (
        "(defun forward (x)\n  (+ x (* (sum x) x) (sin x)))\n"
        "(defrun train :precision :bf16)\n"
    )
    unit = compiler.run(Unit(source, "m.lisp", Options(run="train")), until="plan")
    (forward,) = unit.lowered.specializations
    ops = [n for n in forward.graph.nodes if n.kind is Kind.OP]
    assert sorted(map(id, counted["promoted"])) == sorted(map(id, ops))
    assert counted["reads"] == [forward]
    # the 0-d sum beside x is converted by the product's kernel: kept for the plan
    assert list(forward.promoted.values()) == [[True, False]]


def test_the_layout_walks_only_the_reads_that_cast(monkeypatch):
    """A layout's counts of casts, its hoists and its spellings read the casts its
    conversions found as they were made, not each read's conversion again (three walks of
    every read of a long expression, most of which cast nothing)."""
    source = (
        "(defparam w (normal [4]))\n"
        "(defun forward (x)\n  (+ x (* 2.0 x) (sin x) (* w x) (* w x)))\n"
        "(defrun train :precision :bf16)\n"
    )
    unit = compiler.run(Unit(source, "m.lisp", Options(run="train")), until="policy")
    (forward,) = unit.lowered.specializations
    asked: list = []
    conversion = Conversions.conversion

    def counted(self, node, index):
        asked.append((node, index))
        return conversion(self, node, index)

    monkeypatch.setattr(Conversions, "conversion", counted)
    layout = Layout(forward, Target("cuda"), unit.lowered)
    spelled = Spelled(layout)
    assert asked == []
    # the products read w and x cast down, w's cast written at the top and x's before the
    # return, each once and read by name; the f32 sum before them cast where it is read
    products = [  # the two products by w
        n
        for n in forward.graph.nodes
        if any(getattr(i, "kind", None) is Kind.PARAM for i in n.inputs)
    ]
    casts = layout.conversions.casts
    assert [casts[n] for n in products] == [
        [(0, ("f32", "bf16")), (1, ("f32", "bf16"))]
    ] * 2
    assert [h.operand.name for h in spelled.hoists] == ["w", "x"]
    assert [type(c).__name__ for c in spelled.reads.values()] == ["Hoist"] * 4 + [
        "Cast"
    ]


def test_a_plan_is_printed_once_and_follows_its_callees_groups(monkeypatch):
    """Sharing prints a specialization's plan once per layout and stand-ins of its callees
    (grouping, the casts at entry and the views' comparisons all ask for it). BERT's groups
    are taken into later ones after their callers' plans were printed: those plans print
    again with the later stand-ins, as a fresh printing does (a plan kept by its layout
    alone cast four arguments at entry that the program's callers pass in bf16)."""
    import sx2torch.plan.sharing as sharing_module

    (source,) = [s for s in SHARED if s.stem == "bert"]
    unit = compiler.run(Unit(source.read_text(), source.name, Options()), "policy")
    lowered = unit.lowered
    by_defun = defuns(lowered)
    layouts = {
        t: Layout(t, DECIDING, lowered)
        for t in lowered.specializations
        if len(by_defun[t.model, t.graph.name]) > 1
    }
    counted: list = []

    def printed_counted(layout, methods, **text):
        callees = layout.typed.callee.values()
        counted.append((layout, *(methods[c] for c in callees)))
        return printed(layout, methods, **text)

    monkeypatch.setattr(sharing_module, "printed", printed_counted)
    sharing = Sharing(lowered, DECIDING, layouts)
    sharing.run(by_defun)
    for group in dict.fromkeys(sharing.group.values()):
        sharing.entry(group)
    own = [key for key in counted if key[0] in layouts.values()]
    assert len(own) == len(set(own))
    assert len({key[0] for key in own}) < len(own)  # a callee's stand-in changed
    for typed, layout in layouts.items():
        assert sharing.plan_of(typed) == printed(layout, sharing.stand_ins)


# A defun called outside and inside a bf16 region (its ambient precision): outside, the
# product in its own region is a statement; inside, the region is the method's own.
AMBIENT = """
(defun g (x)
  (+ (with-numerics (:precision :bf16) (* x x)) 1.0))
(defun forward (x)
  (+ (g x) (with-numerics (:precision :bf16) (g x))))
(defrun train :precision :f32)
"""
# A topk in a bf16 region, on f32 and on bf16 arguments: its gather of topk's own values
# is found only where neither reads its operand cast (the one torch.topk call).
TOPK = """
(defun pick (x)
  (with-numerics (:precision :bf16)
    (let (([top chosen] (topk x 2)))
      (+ top chosen))))
(defun forward (x)
  (+ (pick x) (pick (cast x :bf16))))
(defrun train :precision :bf16)
"""
LAID = [("ambient", AMBIENT), ("topk", TOPK)] + [
    (s.stem, s.read_text()) for s in SHARED if s.stem in ("mixtral", "bert")
]


def _laid(layout: Layout) -> tuple:
    """What a layout decides, comparable across layouts of a graph made apart (whose
    region ends are other objects): its printed plan, its statements in order, and the
    last statement that reads each value."""

    def key(statement):
        return (
            (statement.node, statement.region)
            if isinstance(statement, Yield)
            else statement
        )

    order = sorted(layout.order, key=layout.order.get)
    methods = {c: c.graph.name for c in layout.typed.callee.values()}
    last = {
        key(v) if not isinstance(v, tuple) else v: at
        for v, at in layout.last_read.items()
    }
    return printed(layout, methods), [key(s) for s in order], last


@pytest.mark.parametrize("name, text", LAID, ids=[name for name, _ in LAID])
@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_a_layout_from_its_graph_s_shared_structure_is_the_one_made_alone(
    name, text, target
):
    """The plan pass lays each graph out several times from one Structure, which finds
    its statements once per ambient precision and set of topk's gathers: each plan's
    layout is the one made from the graph alone (a structure that kept its first
    statements for every ambient, or every set of gathers, wrote these two programs'
    second method as the first)."""
    unit = compiler.run(Unit(text, f"{name}.lisp", Options(target=target)), "plan")
    plans = unit.plans.plans
    for typed, plan in plans.items():
        alone = Layout(
            typed, plan.layout.target, unit.lowered, plan.layout.conversions.entry
        )
        assert alone.structure is not plan.layout.structure
        assert _laid(plan.layout) == _laid(alone), (typed.graph.name, typed.signature)
    shared = [p.layout.structure for p in plans.values()]
    assert len(set(shared)) < len(shared)  # some graph laid out twice
