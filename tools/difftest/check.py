"""The oracles: one program compiled for every target and run against the interpreter.

    compile      a generated program compiles (a diagnostic on it is counted, not a failure);
                 no internal error
    twice        compiling it again gives the same bytes
    load         the module takes the interpreter's state_dict strictly
    interpret    the interpreter evaluates it (else a bug of ours, or of the generator)
    run          every public method of the compiled module runs
    dtype        each method's result has the interpreter's dtype and shape
    value        and its values: bit-exact where the data make them exact (every op in
                 generate.EXACT and the f32 evaluation equal to an f64 one), else within
                 BOUNDS of it, or, for a program in f32 throughout, no further from the
                 f64 evaluation than the interpreter's (within BOUNDS), as `backward`
    targets      the targets agree: bit for bit where the data make results exact, else
                 within BOUNDS
    backward     `loss.backward()` on the module (loss = sum(out * r)) gives the parameters'
                 and the input's gradients torch.autograd gives on the interpreter, within
                 BOUNDS, or no further from the f64 evaluation's than the interpreter's
                 (within BOUNDS): a gradient summing many bf16 terms that cancel is noisy
                 in both, and the training backward is not the rules' symbolic one

Data are small dyadic numbers: inputs odd multiples of 1/16 in (-2, 2); a parameter k/8 in
[-1, 1] (exact in bf16) or, one in three, k/1024 (which bf16 rounds), so a parameter
read in the wrong dtype changes bits.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field

import torch

from sx2torch import compiler, interpret
from sx2torch.errors import SourceError
from sx2torch.interpret import evaluate, ops
from sx2torch.interpret.model import method as method_name
from tools.difftest import generate

TARGETS = compiler.TARGETS
KNOWN_OPS = set(ops.OPS) | set(evaluate.DEFINED) | {"cast", "gradient"}
HEAD = re.compile(r"\(([^\s()\[\]:;]+)")
HELD = ("metal", "cpu")  # targets that hold bf16 values in f32 tensors
ORACLES = ("compile", "twice", "load", "interpret", "run", "dtype", "value")
ORACLES += ("targets", "backward")
B, D = 2, 4
# (relative, absolute) error allowed where results are not exact: a result computed in
# f32 throughout, and one with a bf16 value anywhere (one bf16 rounding flipped upstream
# moves a result by 2^-8 of its size, and a few ops can double that).
BOUNDS = {"f32": (1e-4, 1e-5), "bf16": (2**-4, 2**-5)}
# A source with a bf16 value somewhere: a bf16 policy, region or parameter, or an op that
# computes in bf16 under either precision (newton-schulz iterates in bf16).
BF16_WORDS = (":bf16", "(newton-schulz ")


@dataclass
class Outcome:
    counts: dict = field(
        default_factory=dict
    )  # (oracle, target) -> "pass" | "fail" | ...
    failures: list = field(default_factory=list)  # (oracle, target, message)
    exact: list = field(default_factory=list)  # per method: compared bit for bit
    bound: str = "f32"  # BOUNDS' key: "bf16" where any value may be bf16

    def note(self, oracle, target, ok: bool, message: str = "") -> bool:
        self.counts[oracle, target] = "pass" if ok else "fail"
        if not ok:
            self.failures.append((oracle, target, message[:400]))
        return ok


def exact_ops(source: str) -> bool:
    """Every op the program calls gives exact results on the campaign's data."""
    used = {h for h in HEAD.findall(source) if h in KNOWN_OPS}
    return used <= generate.EXACT


def compile_module(source: str, target: str, formatted: bool = False) -> str:
    """The module's code; unformatted, it is the same code as valid Python, in a fraction
    of the time (the pipeline through emit, before black)."""
    options = compiler.Options(target=target)
    if formatted:
        return compiler.compile_source(source, "model.lisp", options)
    return compiler.run(compiler.Unit(source, "model.lisp", options), until="emit").code


def instantiate(code: str):
    namespace: dict = {}
    exec(compile(code, "<difftest>", "exec"), namespace)
    return namespace[namespace["__all__"][0]]()


def dyadic_state(shapes: dict, rng: random.Random) -> dict:
    state = {}
    for name, tensor in shapes.items():
        fine = rng.random() < 1 / 3
        scale, top = (1024, 1024) if fine else (8, 8)
        n = tensor.numel()
        values = [rng.randint(-top, top) / scale for _ in range(n)]
        state[name] = torch.tensor(values, dtype=torch.float32).reshape(tensor.shape)
    return state


def inputs(names: list, rng: random.Random) -> list:
    made = []
    for name in names:
        if name == "ids":
            made.append(torch.tensor([rng.randrange(D) for _ in range(B)]))
        elif name == "keep":  # attention's mask from its first B columns: each row sees
            # its own key (no row all masked) and not the next one (the mask matters)
            keep = [
                col == row or col != (row + 1) % B and rng.random() < 0.5
                for row in range(B)
                for col in range(D)
            ]
            made.append(torch.tensor(keep).reshape(B, D))
        else:
            odd = [(2 * rng.randint(-16, 15) + 1) / 16 for _ in range(B * D)]
            made.append(torch.tensor(odd).reshape(B, D))
    return made


def run(
    source: str, methods: dict, seed: int, exact_ops: bool, twice: bool, targets=None
) -> Outcome:
    """Every oracle on one program; `exact_ops`: it uses only ops whose results the data
    make exact; `twice`: also compile it a second time (same bytes); `targets`: those to
    compile for (default: all)."""
    code = re.sub(r";[^\n]*", "", source)  # a corpus file's header says what it found
    out = Outcome(bound="bf16" if any(w in code for w in BF16_WORDS) else "f32")
    codes = {}
    for target in targets or TARGETS:
        try:
            codes[target] = compile_module(source, target)
        except SourceError as error:
            out.counts["compile", target] = "diagnostic"
            out.failures.append(("diagnostic", target, error.message))
            return out
        except Exception as error:  # noqa: BLE001: the finding
            out.note("compile", target, False, f"{type(error).__name__}: {error}")
            return out
        out.note("compile", target, True)
    if twice:
        target = list(codes)[seed // 10 % len(codes)]  # campaigns twice every 10th
        out.note("twice", target, compile_module(source, target) == codes[target])
    rng = random.Random(seed)
    torch.manual_seed(seed)
    try:
        model = interpret.load(source, "model.lisp")
        state = dyadic_state(model.state_dict(), rng)
        model = interpret.load(source, "model.lisp", state=state)
    except Exception as error:  # noqa: BLE001
        out.note("interpret", "-", False, f"load: {type(error).__name__}: {error}")
        return out
    modules = {}
    for target, code in codes.items():
        try:
            modules[target] = instantiate(code)
            modules[target].load_state_dict(state, strict=True)
            out.note("load", target, True)
        except Exception as error:  # noqa: BLE001
            out.note("load", target, False, f"{type(error).__name__}: {error}")
    for method, names in methods.items():
        args = inputs(names, rng)
        _method(out, model, modules, method, args, exact_ops)
    return out


def _method(out: Outcome, model, modules: dict, method: str, args: list, exact_ops):
    try:
        want = model(method, *args)
    except Exception as error:  # noqa: BLE001
        out.note("interpret", method, False, f"{type(error).__name__}: {error}")
        return
    if not isinstance(want, torch.Tensor):
        out.note("interpret", method, False, f"the result is not a tensor: {want!r}")
        return
    out.note("interpret", method, True)
    exact = exact_ops and _exact(model, method, args)
    out.exact.append(exact)
    # the held targets compute bf16 functions as the rules do, cuda's code run here as
    # torch's CPU kernels do (interpret.ops.FUNCTIONS)
    held_want = want
    if out.bound == "bf16":
        held_want = model.evaluate(method, args, rounded_once=True)
    results, widened = {}, []

    def wide():
        if not widened:
            xi = [_wide(a) for a in args]
            widened.append(model.evaluate(method, xi, precision="f64"))
        return widened[0]

    for target, module in modules.items():
        try:
            got = getattr(module, method_name(method))(*[a.clone() for a in args])
        except Exception as error:  # noqa: BLE001
            out.note(
                "run", f"{target}:{method}", False, f"{type(error).__name__}: {error}"
            )
            continue
        out.note("run", f"{target}:{method}", True)
        results[target] = got
        where = f"{target}:{method}"
        wanted = held_want if target in HELD else want
        expected = held(wanted.dtype) if target in HELD else wanted.dtype
        same = got.dtype == expected
        same = same and got.shape == wanted.shape
        shown = (
            f"got {got.dtype} {tuple(got.shape)}, want {expected} {tuple(wanted.shape)}"
        )
        if same and target in HELD and wanted.dtype == torch.bfloat16:
            same = _holds_bf16(got)
            shown = "a bf16 value held in f32 that is not rounded to bf16"
        if out.note("dtype", where, same, shown):
            out.note("value", where, *_value(got, wanted, exact, out.bound, wide))
    kernels_agree = _equal(held_want, want)[0]
    _targets(out, method, results, exact, kernels_agree)
    if "cuda" in results and results["cuda"].requires_grad and want.is_floating_point():
        _backward(out, model, modules["cuda"], method, args, want)


def _value(got, want, exact, bound, wide) -> tuple:
    """The value oracle: `got` within `bound` of the interpreter's `want`, or, for a result
    computed in f32 throughout, no further from the f64 evaluation (`wide()`) than `want`
    is, each entry, within `bound`. The rules fix the ops, not the order of an f32 sum's
    terms nor torch's kernels (a fused matmul, cumsum's scan), so where f32 roundings
    compound (a gradient through a loop, then sin), the module and the interpreter may
    round apart by more than the bound; one no further from the exact value than the
    interpreter computed what the rules say as well as it did. Not where a bf16 value may
    be: there the f64 evaluation is not what the rules compute, and a module that skips
    a bf16 rounding would come closer to it."""
    ok, message = _close(got, want, exact, bound)
    if not ok and not exact and bound == "f32":
        ok = _no_further(got, want, wide(), bound)
    return ok, message


def _holds_bf16(got) -> bool:
    """A held target's f32 tensor holds bf16 values (a NaN is one, rounded or not)."""
    rounded = got.to(torch.bfloat16).float()
    return torch.allclose(got, rounded, rtol=0, atol=0, equal_nan=True)


def _targets(out: Outcome, method: str, results: dict, exact, kernels_agree: bool):
    """Each target's result against the first's, of the same kind (held or not) where the
    interpreter's two readings of the bf16 functions differ: there cuda's code run here and
    a held target compute apart, and one ulp of an rsqrt can grow past any bound."""
    for target in results:
        alike = [t for t in results if kernels_agree or (t in HELD) == (target in HELD)]
        if alike[0] != target:
            same = _close(results[target], results[alike[0]], exact, out.bound)
            out.note("targets", f"{target}:{method}", *same)


def _wide(a):
    return a.double() if a.is_floating_point() else a


def _exact(model, method, args) -> bool:
    """The f32 evaluation equals the f64 one: no rounding in f32 arithmetic happened."""
    wide = model.evaluate(method, [_wide(a) for a in args], precision="f64")
    if model.precision == "f32":
        narrow = model(method, *args)
    else:
        narrow = model.evaluate(method, args, precision="f32")
    return bool(
        torch.isfinite(wide).all() and torch.equal(narrow.double(), wide.double())
    )


def held(dtype):
    """The dtype a held-in-f32 target (metal, cpu) keeps a value of `dtype` in."""
    return torch.float32 if dtype == torch.bfloat16 else dtype


def _equal(got, want) -> tuple:
    same = held(got.dtype) == held(want.dtype) and torch.equal(
        torch.nan_to_num(got.detach().float()), torch.nan_to_num(want.detach().float())
    )
    return same, "" if same else _diff(got, want)


def _close(got, want, exact, bound) -> tuple:
    if exact:
        return _equal(got, want)
    a, b = got.detach().double(), want.detach().double()
    rel, abs_ = BOUNDS[bound]
    finite = torch.isfinite(b)
    if not torch.equal(finite, torch.isfinite(a)):
        return False, "finite in one, not the other: " + _diff(got, want)
    scale = b[finite].abs().max().item() if finite.any() else 0.0
    ok = bool(
        ((a - b).abs()[finite] <= abs_ * (1 + scale) + rel * b.abs()[finite]).all()
    )
    return ok, "" if ok else _diff(got, want)


def _diff(got, want) -> str:
    a, b = got.detach().double(), want.detach().double()
    worst = (a - b).abs().nan_to_num(math.inf).max().item() if a.numel() else 0.0
    return f"max |diff| {worst:.3g}: got {a.flatten()[:6].tolist()}, want {b.flatten()[:6].tolist()}"


def _backward(out: Outcome, model, module, method: str, args: list, want):
    weights = torch.linspace(-1, 1, want.numel()).reshape(want.shape)
    params, leaves = dict(module.named_parameters()), model.tensors()
    names = [k for k in params if k in leaves and leaves[k].requires_grad]
    x = [_leaf(a) for a in args]
    module.zero_grad()
    (getattr(module, method_name(method))(*x).float() * weights).sum().backward()
    xi = [_leaf(a) for a in args]
    value = model.evaluate(method, xi, detach=False)
    wanted = [leaves[k] for k in names] + [a for a in xi if a.requires_grad]
    loss = (value.float() * weights).sum()
    grads = _gradients(loss, wanted)
    got = [params[k].grad for k in names] + [a.grad for a in x if a.requires_grad]
    wide = None
    for k, (name, g, w) in enumerate(zip(names + ["input"] * len(args), got, grads)):
        if g is None and w is None:
            continue
        g = torch.zeros_like(w) if g is None else g
        w = torch.zeros_like(g) if w is None else w
        ok, message = _close(g.float(), w.float(), False, out.bound)
        if not ok:
            wide = wide or _wide_gradients(model, method, args, weights, names)
            ok = wide[k] is not None and _no_further(g, w, wide[k], out.bound)
        if not ok:
            out.note("backward", f"cuda:{method}", False, f"{name}: {message}")
            return
    out.note("backward", f"cuda:{method}", True)


def _wide_gradients(model, method, args, weights, names) -> list:
    """The gradients `_backward` compares, of the interpreter's f64 evaluation."""
    xi = [_leaf(_wide(a)) for a in args]
    value = model.evaluate(method, xi, precision="f64", detach=False)
    leaves = model.tensors()
    wanted = [leaves[k] for k in names] + [a for a in xi if a.requires_grad]
    loss = (value.double() * weights.double()).sum()
    return _gradients(loss, wanted)


def _gradients(loss, wanted) -> list:
    """d loss / d each of `wanted`; None for all where the value is a constant (the
    gradient of a linear Y, which the rules' backward computes from no input)."""
    if not loss.requires_grad:
        return [None] * len(wanted)
    return list(torch.autograd.grad(loss, wanted, allow_unused=True))


def _no_further(got, want, wide, bound) -> bool:
    """`got` is no further from `wide` than `want` is, each entry, within `bound`."""
    a, b, t = got.detach().double(), want.detach().double(), wide.detach().double()
    rel, abs_ = BOUNDS[bound]
    slack = abs_ * (1 + t.abs().max().item()) + rel * t.abs()
    return bool(((a - t).abs() <= (b - t).abs() + slack).all())


def _leaf(a):
    return a.clone().requires_grad_(a.is_floating_point())
