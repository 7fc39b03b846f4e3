"""The pipeline: one table of passes, each with what it does, how its output is checked and
how it is printed, read by the compiler, by `--dump-after` and by `explain` alike.

    read -> resolve -> trace -> gradient -> cache -> ranks -> policy -> shard -> plan -> names -> emit -> format
"""

from __future__ import annotations

import ast
import gc
import shlex
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import PurePath
from typing import Callable, Optional, get_args

import sx2torch.cache as cache
import sx2torch.dump as dump
import sx2torch.format as format
import sx2torch.gradient as gradient
import sx2torch.ir as ir
import sx2torch.lint as lint
import sx2torch.plan as plan
import sx2torch.policy as policy
import sx2torch.ranks as ranks
import sx2torch.resolve as resolve
import sx2torch.shard as shard
import sx2torch.trace as trace
import sx2torch.build as b
from sx2torch.emit import functions as library
from sx2torch.emit import module, naming
from sx2torch.errors import UsageError
from sx2torch.ops import REGISTRY
from sx2torch.ops.rank import Tail
from sx2torch.plan.targets import Target
from sx2torch.policy import Lowered
from sx2torch.syntax import read
from sx2torch.syntax.program import Program, Run
from sx2torch.version import __version__

TARGETS = ("cuda", "metal", "cpu")
STDIN = "<stdin>"  # the file name of a source read from standard input


@dataclass(frozen=True)
class Options:
    run: Optional[str] = None
    target: str = "cuda"
    source_lines: bool = False  # `# file.lisp:LINE` after each statement, for debugging
    dump_after: Optional[str] = None  # a pass's name: print its output instead

    def __post_init__(self):
        # the command line's choices, for every interface that makes Options
        if self.target not in TARGETS:
            raise UsageError(
                f"target {self.target!r}: expected one of {', '.join(TARGETS)}"
            )
        if self.dump_after is not None and self.dump_after not in DUMPS:
            raise UsageError(
                f"dump_after {self.dump_after!r}: expected one of {', '.join(DUMPS)}"
            )
        if self.run is not None and not isinstance(self.run, str):
            raise UsageError(f"run: expected a defrun's name, got {self.run!r}")


@dataclass
class Unit:
    """One source on its way through the passes: each pass reads what the passes before it
    left here and sets its own part."""

    text: str
    filename: str
    options: Options
    data: Optional[list] = None  # read
    program: Optional[Program] = None  # resolve
    chosen: Optional[Run] = None  # trace: the defrun compiled for
    graphs: Optional[dict] = None  # trace, then gradient
    lowered: Optional[Lowered] = None  # policy
    plans: Optional[plan.Plans] = None  # plan
    tp: Optional[shard.Plan] = None  # shard: the tensor-parallel plan
    names: Optional[naming.Naming] = None  # names
    code: Optional[str] = None  # emit, then format

    @property
    def precision(self) -> str:
        return self.chosen.precision if self.chosen else "f32"

    @property
    def target(self) -> Target:
        return Target(self.options.target)

    @property
    def shown(self) -> Optional[str]:
        """The file name the `--source-lines` comments give, when they are asked for."""
        return _shown(self.filename) if self.options.source_lines else None


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[[Unit], None]
    # the output's invariants: what the pass promises is there (tests run it after each)
    verify: Callable[[Unit], None]
    dump: Optional[Callable[[Unit], str]] = None  # what `--dump-after NAME` prints


def _read(unit: Unit) -> None:
    unit.data = read.run(unit.text)


def _verify_data(unit: Unit) -> None:
    assert all(isinstance(datum, get_args(read.Datum)) for datum in unit.data)


def _resolve(unit: Unit) -> None:
    unit.program = resolve.run(unit.data, top_model_name(unit.filename))


def _verify_program(unit: Unit) -> None:
    assert unit.program.top.name == top_model_name(unit.filename)
    assert unit.program.top not in unit.program.models.values()


def _trace(unit: Unit) -> None:
    unit.chosen = choose_run(unit.program, unit.options.run)
    unit.graphs = trace.run(unit.program)


def _verify_graphs(unit: Unit) -> None:
    defuns = {
        (model.name, defun)
        for model in unit.program.all_models()
        for defun in model.defuns
    }
    assert set(unit.graphs) == defuns, "a defun without its graph"
    for graph in unit.graphs.values():
        ir.verify(graph, REGISTRY)


def _gradient(unit: Unit) -> None:
    gradient.run(unit.program, unit.graphs)


def _verify_expanded(unit: Unit) -> None:
    _verify_graphs(unit)
    for graph in unit.graphs.values():
        left = [n for n in ir.walk(graph.nodes) if n.kind is ir.Kind.GRADIENT]
        assert not left, f"{graph.name}: {left!r} not expanded"


def _cache(unit: Unit) -> None:
    cache.run(unit.program, unit.graphs, unit.chosen)


def _ranks(unit: Unit) -> None:
    ranks.run(unit.program, unit.graphs)


def _verify_shapes(unit: Unit) -> None:
    _verify_expanded(unit)
    for graph in unit.graphs.values():
        tails = [n for n in ranks.valued(graph) if isinstance(n.shape.dims, Tail)]
        assert not tails, f"{graph.name}: {tails!r} left a tail, not a final shape"


def _policy(unit: Unit) -> None:
    unit.lowered = policy.run(unit.program, unit.graphs, unit.precision)


def _verify_lowered(unit: Unit) -> None:
    for typed in unit.lowered.specializations:
        policy.verify(typed)


def _shard(unit: Unit) -> None:
    reduce = unit.chosen.tp_reduce if unit.chosen else "f32"
    unit.tp = shard.run(unit.program, unit.graphs, reduce)


def _verify_plan(unit: Unit) -> None:
    paths = [entry.path for entry in unit.tp.entries]
    assert len(paths) == len(set(paths)), "a module planned twice"
    assert set(unit.tp.styles.values()) <= {shard.COLWISE, shard.ROWWISE, shard.GATHER}


def _plan(unit: Unit) -> None:
    unit.plans = plan.run(unit.program, unit.lowered, unit.target)


def _verify_plans(unit: Unit) -> None:
    plan.verify(unit.plans, unit.lowered)


def _names(unit: Unit) -> None:
    unit.names = naming.run(unit.program, unit.plans)
    library.name(unit.plans, unit.names)


def _verify_names(unit: Unit) -> None:
    names = unit.names
    for model in unit.program.all_models():
        assert model.name in names.classes and model.name in names.attrs, model.name
    for typed in unit.lowered.specializations:
        assert typed in names.locals, typed.graph.name


def _emit(unit: Unit) -> None:
    tree = module.run(
        unit.program,
        unit.lowered,
        unit.plans,
        unit.names,
        _header(unit),
        unit.target,
        unit.shown,
        unit.chosen,
        unit.tp,
    )
    unit.code = b.code(tree)


def _verify_code(unit: Unit) -> None:
    compile(unit.code, unit.filename, "exec")


def _verify_module(unit: Unit) -> None:
    """The code, and the plan's imports are what it reads: a call of math's where the plan
    found one, so the names pass took `math` exactly where the module imports it."""
    _verify_code(unit)
    calls = any(
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "math"
        for node in ast.walk(ast.parse(unit.code))
    )
    assert calls == (
        "math" in unit.plans.imports
    ), "the plan's imports are not the code's"


def _format(unit: Unit) -> None:
    unit.code = format.run(unit.code)


PASSES = (
    Pass("read", _read, _verify_data, lambda unit: dump.data(unit.data)),
    Pass("resolve", _resolve, _verify_program, lambda unit: dump.program(unit.program)),
    Pass("trace", _trace, _verify_graphs, lambda unit: dump.graphs(unit.graphs)),
    Pass(
        "gradient", _gradient, _verify_expanded, lambda unit: dump.graphs(unit.graphs)
    ),
    Pass("cache", _cache, _verify_expanded, lambda unit: dump.graphs(unit.graphs)),
    Pass(
        "ranks",
        _ranks,
        _verify_shapes,
        lambda unit: dump.graphs(unit.graphs, shapes=True),
    ),
    Pass("policy", _policy, _verify_lowered, lambda unit: dump.lowered(unit.lowered)),
    Pass("shard", _shard, _verify_plan, lambda unit: dump.plan(unit.tp)),
    Pass("plan", _plan, _verify_plans, lambda unit: dump.plans(unit.plans)),
    Pass("names", _names, _verify_names, lambda unit: dump.names(unit.names)),
    Pass("emit", _emit, _verify_module, lambda unit: unit.code),
    Pass("format", _format, _verify_code),
)
DUMPS = tuple(p.name for p in PASSES if p.dump)  # the choices of `--dump-after`


def run(unit: Unit, until: Optional[str] = None, verify: bool = False) -> Unit:
    """Run the passes over `unit`, through the one named `until` (default: all of them),
    checking each one's output after it when `verify` is set."""
    with _no_cycle_collection():
        for step in PASSES:
            step.run(unit)
            if verify:
                step.verify(unit)
            if step.name == until:
                break
    return unit


def top_model_name(filename: str) -> str:
    """The file's stem; `model` for a name in angle brackets (`<stdin>`, `<string>`), which
    names no file."""
    if filename.startswith("<") and filename.endswith(">"):
        return "model"
    return PurePath(filename).stem or "model"


@dataclass(frozen=True)
class Compiled:
    code: str
    warnings: list  # lint.Finding, in source order


def compile_source(
    text: str, filename: str, options: Optional[Options] = None, verify: bool = False
) -> str:
    """Compile one SexpGPU source text to a formatted Python module, or print the output
    of the pass `options.dump_after` names."""
    return compile_module(text, filename, options, verify).code


def compile_module(
    text: str, filename: str, options: Optional[Options] = None, verify: bool = False
) -> Compiled:
    """The module and the warnings about its source (none for a dump)."""
    options = options or Options()
    unit = run(Unit(text, filename, options), until=options.dump_after, verify=verify)
    if options.dump_after:
        dumped = next(p for p in PASSES if p.name == options.dump_after).dump(unit)
        return Compiled(dumped, [])
    return Compiled(unit.code, lint.find(unit.program, unit.lowered, unit.data))


@contextmanager
def _no_cycle_collection():
    """The passes make many objects and few cycles; the cycle collector's passes over all
    of them made a compile's time grow faster than the source (1.5x per line at 16x, and
    black's pass too). What the cycles hold is freed by the next collection after it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def choose_run(program: Program, name: Optional[str]):
    if name is None:
        return program.runs[0] if program.runs else None
    for run in program.runs:
        if run.name == name:
            return run
    known = ", ".join(r.name for r in program.runs) or "none"
    raise UsageError(
        f"--run {name}: the file has no defrun of that name (known: {known})"
    )


def _shown(filename: str) -> str:
    """The file's name, safe inside a comment: no line breaks, only printable ASCII."""
    return PurePath(filename).name.encode("unicode_escape").decode("ascii")


def flags(run: Optional[str], target: str, source_lines: bool) -> list:
    """The command-line flags that compile a source again as it was compiled."""
    return [
        *(["--run", run] if run else []),
        "--target",
        target,
        *(["--source-lines"] if source_lines else []),
    ]


def _header(unit: Unit) -> str:
    """Says what was compiled and how; `sx2torch check` reads the flags back."""
    run = unit.chosen.name if unit.chosen else None
    options = unit.options
    again = shlex.join(flags(run, options.target, options.source_lines))
    return (
        f"Generated by sx2torch {__version__} from {_shown(unit.filename)}: run {run or '(none)'}, precision {unit.precision}, target {options.target}.\n"
        f"Do not edit: change the source and compile it again (flags: {again})."
    )
