"""What needs every model read: sub-model instances' keys, each instance as its arguments
build it, ties, and that no model contains itself."""

from __future__ import annotations

from typing import Optional

from sx2torch.errors import SourceError, Span
from sx2torch.limits import MAX_ELEMENTS, MAX_LAYERS
from sx2torch.ops.initializers import sizes
from sx2torch.syntax import scalars
from sx2torch.syntax.program import Model, Program
from sx2torch.syntax.scalars import Scalar


def check_params(program: Program, model: Model) -> None:
    """Each instance's arguments named by the consts they set: the positional ones in its
    model's lambda list's order, the keywords by each &key's key; every required &key
    given, each list-valued one a list."""
    for init in (
        i for p in model.params.values() if p.is_module for i in p.init.instances
    ):
        if init.model not in program.models or init.model == model.name:
            raise SourceError(init.span, f"unknown initializer or model '{init.model}'")
        sub = program.models[init.model]
        init.args = _named(sub, init)
        for key, (span, value) in init.args.items():
            const = sub.consts[key]
            default = const.value.value
            _check_none(sub, const, span, value.value)
            if isinstance(default, tuple) != isinstance(value.value, tuple):
                what = "a list" if isinstance(default, tuple) else "not a list"
                shown = scalars.text(Scalar.lit(default), None)
                raise SourceError(
                    span,
                    f"{sub.name}'s :{const.argument} is {what}"
                    + ("" if const.required else f" (its default is {shown})")
                    + f", got {scalars.text(Scalar.lit(value.value), None)}",
                )
        if init.weight_norm is not None:
            _check_weight_norm(sub, init.weight_norm)


def _check_none(sub: Model, const, span, value) -> None:
    """`none` is passed only to a key whose default is none, which reads a row or none
    (torch's padding_idx): an integer there, or none."""
    default = const.value.value
    if value is None and (default is not None or const.required):
        raise SourceError(
            span,
            f"{sub.name}'s :{const.argument} takes a number, not none (only a key whose "
            "default is none takes it)",
        )
    if default is None and not const.required and value is not None:
        what = f"{sub.name}'s :{const.argument} (a row, or none)"
        scalars.expect_int(Scalar.lit(value), span, what)


def _check_weight_norm(sub: Model, norm) -> None:
    """What torch's weight_norm needs of the instance: NAME one of its model's trained
    tensor parameters, always made, an f32 master (its readers cast it), and DIM one of
    its axes."""
    param = sub.params.get(norm.name.name)
    if param is None or param.is_module:
        tensors = [p.name for p in sub.params.values() if not p.is_module]
        raise SourceError(
            norm.name.span,
            f"weight-norm's :name must name a parameter of {sub.name}, got "
            f"'{norm.name.name}' (its parameters: {', '.join(tensors) or 'none'})",
        )
    why = [
        reason
        for refused, reason in (
            (not param.trainable, "a frozen buffer"),
            (param.when is not None, "made only where its :when holds"),
            (param.dtype == "bf16", "stored in bf16 (:dtype :bf16)"),
        )
        if refused
    ]
    if why:
        raise SourceError(
            norm.name.span,
            "weight-norm takes a trained f32 parameter that every instance makes; "
            f"{sub.name}'s '{param.name}' is {why[0]}",
        )
    rank = len(sizes(param.init))
    if not -rank <= norm.dim.value < rank:
        raise SourceError(
            norm.span,
            f"weight-norm's :dim must be an axis of {sub.name}'s '{param.name}' "
            f"(rank {rank}), got {norm.dim.value}",
        )


def _named(sub: Model, init) -> dict:
    """An instance's arguments by the names its model reads them by."""
    consts = list(sub.consts.values())
    by_key = {const.argument: const.name for const in consts}
    named: dict = {}
    for key, (span, value) in init.args.items():
        if isinstance(key, int) and key >= len(consts):
            raise SourceError(
                span,
                f"model '{sub.name}' takes at most {len(consts)} arguments before its "
                f"keywords, got {key + 1}",
            )
        if not isinstance(key, int) and key not in by_key:
            known = ", ".join(f":{k}" for k in by_key) or "none"
            raise SourceError(
                span, f"model '{sub.name}' has no key :{key} (known: {known})"
            )
        name = consts[key].name if isinstance(key, int) else by_key[key]
        if name in named:
            raise SourceError(
                span, f"{sub.name}'s :{sub.consts[name].argument} is given twice"
            )
        named[name] = (span, value)
    missing = [c.argument for c in consts if c.required and c.name not in named]
    if missing:
        raise SourceError(
            init.span,
            f"model '{sub.name}' needs "
            + ", ".join(f":{k}" for k in missing)
            + f" (it has no default): ({sub.name} "
            + " ".join(c.argument.upper() for c in consts if c.required)
            + " ...)",
        )
    return named


def check_built(program: Program) -> None:
    """Every sub-model instance as its arguments build it: its consts computed from them as
    its constructor computes them, each parameter's sizes and each stack's count must be
    integers within the limits (`(block :n 5e-324)` made torch fail when the module was
    built). Reported at the top model's instance that builds it; a stack whose layers read
    its index is checked at its first and last layer."""
    pending = [(program.top, {}, None)]
    seen = set()
    while pending:
        model, given, where = pending.pop()
        if (model.name, tuple(given.items())) in seen:
            continue
        seen.add((model.name, tuple(given.items())))
        built = _Built(model, where)
        env = {}
        for const in model.consts.values():
            if const.name in given:
                env[const.name] = given[const.name]
            else:
                env[const.name] = built.compute(const.value, env)
        for param in model.params.values():
            if param.when is not None and not built.compute(param.when, env):
                continue
            init, at = param.init, where or param.init.span
            if not param.is_module:
                if where is not None:  # the top model's sizes: initializers.check_size
                    built.sizes(param, [built.compute(z, env) for z in sizes(init)])
                    built.fan_in(param, env)
                continue
            choice = init.kind == "choice"
            when = built.compute(init.args["when"], env) if choice else None
            for init in init.built(when):
                count = built.compute(init.count, env) if init.kind == "stack" else 1
                if where is not None and init.kind == "stack":
                    built.count(param, count)
                layers = sorted({0, count - 1}) if init.index and count > 0 else [None]
                for layer in layers if count > 0 else []:
                    inside = {**env, init.index: layer} if init.index else env
                    args = {
                        k: built.compute(v, inside) for k, (_, v) in init.args.items()
                    }
                    pending.append((program.models[init.model], args, at))


class _Built:
    """The diagnostics of one model as an instance's arguments build it."""

    def __init__(self, model: Model, where: Optional[Span]):
        self.model, self.where = model, where

    def fail(self, what: str) -> SourceError:
        return SourceError(
            self.where, f"building '{self.model.name}' with these arguments: {what}"
        )

    def compute(self, scalar: Scalar, env: dict):
        try:
            value = scalars.compute(scalar, env)
        except (ArithmeticError, LookupError, TypeError, ValueError) as error:
            raise self.fail(
                f"{scalars.text(scalar, _leaf_name)} cannot be computed ({error})"
            )
        if isinstance(value, complex):
            raise self.fail(f"{scalars.text(scalar, _leaf_name)} is not a real number")
        return value

    def sizes(self, param, shape: list) -> None:
        for size in shape:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise self.fail(
                    f"parameter '{param.name}' has a size {size!r}, not a non-negative integer"
                )
        elements = 1
        for size in shape:
            elements *= size
        if elements > MAX_ELEMENTS:
            raise self.fail(
                f"parameter '{param.name}' has {elements:,} elements, past the limit of {MAX_ELEMENTS:,}"
            )

    def fan_in(self, param, env: dict) -> None:
        """A bias's fan-in, whose 1 / math.sqrt the constructor computes (torch's layers
        with no input features draw a zero bias; these stop there)."""
        if param.init.kind == "fan-in-uniform":
            fan_in = self.compute(param.init.args["fan-in"], env)
            if not fan_in > 0:
                raise self.fail(
                    f"parameter '{param.name}' has a fan-in of {fan_in!r}, not a positive number"
                )

    def count(self, param, count) -> None:
        if (
            not isinstance(count, int)
            or isinstance(count, bool)
            or not 0 <= count <= MAX_LAYERS
        ):
            raise self.fail(
                f"stack '{param.name}' has {count!r} layers, not an integer from 0 to {MAX_LAYERS:,}"
            )


def _leaf_name(scalar: Scalar) -> str:
    return scalar.args[0]


def check_ties(program: Program, model: Model) -> None:
    """Each tie joins two trained parameters stored alike, made on every instance; a
    parameter is tied once, to one that is not tied itself."""
    tied: dict = {}  # name -> line
    targets: dict = {}
    for tie in model.ties:
        found = []
        for symbol in (tie.name, tie.target):
            steps = program.member(model, symbol.name)
            if steps is None:
                raise SourceError(
                    symbol.span,
                    f"'{symbol.name}' names no parameter: expected a parameter of this "
                    "model or of a sub-model instance, as lm-head.weight",
                )
            params = [m.params[member] for m, member in steps]
            last = params[-1]
            if any(p.when is not None for p in params) or not last.trainable:
                raise SourceError(
                    symbol.span,
                    f"'{symbol.name}' cannot be tied: a tie joins trained parameters made "
                    "on every instance (no :when, no :trainable false)",
                )
            if len(steps) > 1 and _weight_normed(*steps[-2:]):
                raise SourceError(
                    symbol.span,
                    f"'{symbol.name}' cannot be tied: it is weight-normed, computed "
                    "from its parametrization's two tensors where it is read",
                )
            found.append((symbol.name, last))
        (name, param), (target, other) = found
        if param.dtype != other.dtype or name == target:
            raise SourceError(
                tie.target.span,
                f"'{name}' cannot be tied to '{target}': it must be another parameter, "
                "stored in the same dtype (:dtype)",
            )
        again = name if name in tied else target if target in tied else None
        if again is None and name in targets:
            again = name
        if again is not None:
            raise SourceError(
                tie.name.span if again == name else tie.target.span,
                f"'{again}' is tied already, at line {tied.get(again, targets.get(again))}"
                ": a parameter is tied once, to one that is not tied itself",
            )
        tied[name] = tie.name.span.line
        targets[target] = tie.target.span.line


def _weight_normed(owner, member) -> bool:
    """Whether the parameter `member` of the instance `owner` holds is weight-normed."""
    (model, sub), (_, name) = owner, member
    norm = model.params[sub].init.weight_norm
    return norm is not None and norm.name.name == name


def check_containment(program: Program) -> None:
    """No model holds an instance of itself, directly or through other models."""
    finished: set = set()
    for root in program.models.values():
        stack = [(root, _holds(root))]
        path = [root.name]
        while stack:
            model, held = stack[-1]
            param, name = next(held, (None, None))
            if param is None:
                finished.add(model.name)
                stack.pop()
                path.pop()
                continue
            if name in finished:
                continue
            if name in path:
                route = " -> ".join(path[path.index(name) :] + [name])
                raise SourceError(
                    param.span, f"model '{name}' contains itself ({route})"
                )
            sub = program.models[name]
            stack.append((sub, _holds(sub)))
            path.append(sub.name)


def _holds(model: Model):
    """(param, model name) of each sub-model instance a model's parameters hold."""
    return iter(
        [
            (p, i.model)
            for p in model.params.values()
            if p.is_module
            for i in p.init.instances
        ]
    )
