"""A defrun: its precision, and for training its loss, optimizer, steps, schedule and
inputs; checked against the top model's defuns once the file is read."""

from __future__ import annotations

from typing import Optional

from sx2torch.errors import SourceError
from sx2torch.resolve.values import expect_symbol, read_keywords
from sx2torch.syntax.forms import match
from sx2torch.syntax import scalars
from sx2torch.syntax.program import OPTIMIZER_KEYS, Input, Model, Optimizer, Run
from sx2torch.syntax.read import Boolean, Datum, List, Number, Symbol, Vector, shown


def defrun(datum: List, runs: list) -> Run:
    form = match(datum)
    (name,), options = form.parts, form.keys
    if any(r.name == name.name for r in runs):
        raise SourceError(name.span, f"run '{name.name}' is already defined")
    run = Run(name.name, "f32", name.span, keys=options)
    if "precision" in options:
        run.precision = options["precision"].name
    run.loss = options.get("loss")
    if "optimizer" in options:
        run.optimizer = _optimizer(options["optimizer"], OPTIMIZER_KEYS)
    for key in ("steps", "batch-size", "seq-len"):
        if key in options:
            setattr(run, key.replace("-", "_"), _count(options[key], f":{key}"))
    if "grad-clip" in options:
        run.grad_clip = _number(options["grad-clip"], ":grad-clip", above=0)
    if "schedule" in options:
        run.warmup, run.cooldown = _schedule(options["schedule"])
    if "inputs" in options:
        run.inputs = _inputs(options["inputs"])
    if "generate" in options:
        given = options["generate"]
        run.generate = given.name if isinstance(given, Symbol) else given.value
    if "tp-reduce" in options:
        run.tp_reduce = options["tp-reduce"].name
    if run.loss is None:
        for key in [
            k for k in options if k not in ("precision", "generate", "tp-reduce")
        ]:
            raise SourceError(
                options[key].span, f"defrun :{key} needs :loss (the defun to train)"
            )
    return run


def _optimizer(datum: Datum, kinds: dict) -> Optimizer:
    """`(adamw :lr 3e-4 ...)` or `(muon :lr 0.02 ... :adamw (adamw ...))`."""
    usage = " or ".join(f"({kind} :lr X ...)" for kind in kinds)
    if not isinstance(datum, List) or not datum.items:
        raise SourceError(datum.span, f"expected an optimizer such as {usage}")
    head = expect_symbol(datum.items[0], "an optimizer name")
    if head.name not in kinds:
        known = ", ".join(kinds)
        raise SourceError(
            head.span, f"unknown optimizer '{head.name}' (known: {known})"
        )
    options = read_keywords(
        datum.items[1:], dict.fromkeys(kinds[head.name]), f"({head.name} ...)"
    )
    optimizer = Optimizer(head.name, {})
    for key, value in options.items():
        what = f":{key} of {head.name}"
        if key == "adamw":
            optimizer.rest = _optimizer(value, {"adamw": OPTIMIZER_KEYS["adamw"]})
            continue
        if key == "betas":
            if not isinstance(value, Vector) or len(value.items) != 2:
                raise SourceError(value.span, f"{what} must be a vector [B1 B2]")
            setting = tuple(_number(b, what, at_least=0, below=1) for b in value.items)
        elif key == "nesterov":
            if not isinstance(value, Boolean):
                raise SourceError(value.span, f"{what} must be true or false")
            setting = value.value
        elif key == "ns-steps":
            setting = _count(value, what)
        elif key in ("weight-decay", "momentum"):
            setting = _number(
                value, what, at_least=0, below=1 if key == "momentum" else None
            )
        else:  # lr, eps
            setting = _number(value, what, above=0)
        optimizer.settings[key.replace("-", "_")] = setting
    if head.name == "muon" and optimizer.rest is None:
        optimizer.rest = Optimizer("adamw", {})
    return optimizer


def _number(
    datum: Datum,
    what: str,
    *,
    above: Optional[float] = None,
    at_least: Optional[float] = None,
    below: Optional[float] = None,
):
    if not isinstance(datum, Number):
        raise SourceError(datum.span, f"{what} must be a number, got {shown(datum)}")
    value = datum.value
    bounds = [
        (above is None or value > above, f"greater than {above}"),
        (at_least is None or value >= at_least, f"at least {at_least}"),
        (below is None or value < below, f"less than {below}"),
    ]
    for ok, bound in bounds:
        if not ok:
            raise SourceError(datum.span, f"{what} must be {bound}, got {shown(datum)}")
    return value


def _count(datum: Datum, what: str) -> int:
    if (
        not isinstance(datum, Number)
        or not isinstance(datum.value, int)
        or datum.value < 1
    ):
        raise SourceError(
            datum.span, f"{what} must be a positive integer, got {shown(datum)}"
        )
    return datum.value


def _schedule(datum: Datum) -> tuple:
    """`(:warmup 0.1 :cooldown 0.5)`: fractions of the steps, together at most 1."""
    if not isinstance(datum, List):
        raise SourceError(
            datum.span,
            f":schedule must be a list such as (:warmup 0.1 :cooldown 0.5), got {shown(datum)}",
        )
    options = read_keywords(
        datum.items, {"warmup": None, "cooldown": None}, ":schedule"
    )
    warmup, cooldown = (
        _number(options[key], f":{key}", at_least=0, below=1) if key in options else 0.0
        for key in ("warmup", "cooldown")
    )
    if warmup + cooldown > 1:
        raise SourceError(datum.span, ":warmup and :cooldown add up to more than 1")
    return warmup, cooldown


def _inputs(datum: Datum) -> list:
    """`((x [64 d]) (labels [64] :high 10))`: one entry per argument of the loss."""
    usage = "((x [64 d]) (labels [64] :high 10))"
    if not isinstance(datum, List) or not datum.items:
        raise SourceError(datum.span, f":inputs must be a list such as {usage}")
    inputs = []
    for entry in datum.items:
        if not isinstance(entry, List) or len(entry.items) < 2:
            raise SourceError(
                entry.span, f"expected an input such as (x [64 d]), got {shown(entry)}"
            )
        name = expect_symbol(entry.items[0], "an argument name")
        shape = entry.items[1]
        if not isinstance(shape, Vector):
            raise SourceError(
                shape.span, f"expected a shape such as [64 d], got {shown(shape)}"
            )
        options = read_keywords(entry.items[2:], {"high": None}, "an input")
        inputs.append(Input(name, shape.items, options.get("high")))
    return inputs


def check_run(top: Model, run: Run) -> None:
    """What needs the whole file: the loss defun, its arguments, the input shapes."""
    if run.loss is None:
        return
    defun = top.defuns.get(run.loss.name)
    if defun is None:
        known = ", ".join(top.defuns) or "none"
        raise SourceError(
            run.loss.span, f"unknown defun '{run.loss.name}' for :loss (known: {known})"
        )
    args = [a.name for a in defun.args]
    if run.inputs is None:
        if len(args) != 2:
            raise SourceError(
                run.loss.span,
                f"defun '{defun.name}' takes {len(args)} arguments; on token data the loss "
                "takes (inputs targets): give :inputs for other data",
            )
        for key in ("batch-size", "seq-len"):
            if key not in run.keys:
                raise SourceError(
                    run.span,
                    f"defrun '{run.name}' trains on token data: it needs :{key}",
                )
        return
    names = [i.name.name for i in run.inputs]
    if names != args:
        raise SourceError(
            run.keys["inputs"].span,
            f":inputs names ({' '.join(names)}) must be the arguments of '{defun.name}' ({' '.join(args)})",
        )
    for each in run.inputs:
        each.shape = tuple(_size(top, d, "a size") for d in each.shape)
        if not each.shape or min(each.shape) < 1:
            raise SourceError(
                each.name.span,
                f"input '{each.name.name}' needs a shape of positive sizes",
            )
        if each.high is not None:
            each.high = _size(top, each.high, ":high")
            if each.high < 1:
                raise SourceError(
                    each.name.span, f"input '{each.name.name}' needs :high above 0"
                )


def _size(top: Model, datum: Datum, what: str) -> int:
    """An integer written as a literal, a const of the top model, or arithmetic on them."""
    value = scalars.evaluate(datum, top.lookup_const)
    return scalars.expect_int(value, datum.span, what).value
