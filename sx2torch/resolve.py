"""The resolve pass: top-level data -> a Program of models, consts, params, defuns and runs.

Checks what can be checked without tracing bodies: the shape of every
definition, duplicates, defrun keys, recursion, and that `forward` exists.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from sx2torch.limits import MAX_ELEMENTS, MAX_LAYERS
from sx2torch.syntax import keywords as keyword_args
from sx2torch.syntax import scalars
from sx2torch.errors import SourceError, Span
from sx2torch.syntax.names import FORMS, mangle
from sx2torch.syntax.program import (
    PRECISIONS,
    RUN_KEYS,
    OPTIMIZER_KEYS,
    Const,
    Init,
    Param,
    Tie,
    Defun,
    Model,
    Optimizer,
    Input,
    Run,
    Program,
)
from sx2torch.ops.initializers import INITIALIZERS, sizes
from sx2torch.syntax.scalars import Scalar, ScalarOp
from sx2torch.syntax.read import (
    Boolean,
    Datum,
    Keyword,
    List,
    Number,
    String,
    Symbol,
    Vector,
    shown,
)


def run(data: list, top_name: str) -> Program:
    top = Model(top_name, Span(1, 1), is_top=True)
    models: dict[str, Model] = {}
    runs: list[Run] = []
    for datum in data:
        head = _head(datum, "a top-level form")
        if head == "defmodel":
            model = _defmodel(datum)
            if model.name in models:
                raise SourceError(
                    datum.items[1].span, f"model '{model.name}' is already defined"
                )
            if model.name == top_name:
                raise SourceError(
                    datum.items[1].span,
                    f"a defmodel cannot be named '{top_name}': the file's top model has that name",
                )
            models[model.name] = model
        elif head == "defrun":
            runs.append(_defrun(datum, runs))
        elif head == "require":
            _require(datum)
        else:
            _model_form(top, datum, head)
    program = Program(top, models, runs)
    for model in models.values():
        _share_defuns(top, model)
    for model in program.all_models():
        _check_params(program, model)
    for model in program.all_models():
        _check_ties(program, model)
    for each in runs:
        _check_run(top, each)
    _check_containment(program)
    _check_built(program)
    if "forward" not in top.defuns:
        raise SourceError(
            Span(1, 1),
            "the file defines no 'forward' defun: expected (defun forward (x ...) ...)",
        )
    return program


def _share_defuns(top: Model, model: Model) -> None:
    """The top-level defuns a sub-model calls (and those they call) become its own, unless
    it defines the name itself."""
    pending = list(model.defuns.values())
    while pending:
        for name in _heads(pending.pop().body):
            if name in top.defuns and name not in model.names():
                model.defuns[name] = replace(top.defuns[name], shared=True)
                pending.append(model.defuns[name])


def _heads(data) -> set:
    """The names a body calls: the heads of its lists, at any depth."""
    found: set = set()
    pending = list(data)
    while pending:
        datum = pending.pop()
        if isinstance(datum, (List, Vector)):
            items = datum.items
            if isinstance(datum, List) and items and isinstance(items[0], Symbol):
                found.add(items[0].name)
            pending.extend(items)
    return found


def _head(datum: Datum, what: str) -> str:
    if (
        not isinstance(datum, List)
        or not datum.items
        or not isinstance(datum.items[0], Symbol)
    ):
        raise SourceError(
            datum.span, f"expected {what} such as (defun ...), got {_describe(datum)}"
        )
    return datum.items[0].name


def _evaluate(model: Model, datum: Datum) -> Scalar:
    """A compile-time number read in `model`, whose names are known so far."""
    return scalars.evaluate(datum, _built_from(model, datum), model.names)


def _built_from(model: Model, datum: Datum):
    """`model.lookup_const` for a number that decides what is built, which a flag may not:
    setting the flag on the built module would change nothing there."""

    def lookup(name: str) -> Optional[Scalar]:
        const = model.consts.get(name)
        if const is not None and const.flag:
            raise SourceError(
                _symbol_in(datum, name) or datum.span,
                f"'{name}' is a flag, read when the module runs, so it cannot decide what "
                "the constructor builds (a shape, a :when, a sub-model's argument, a "
                "const): define it with defconst",
            )
        return model.lookup_const(name)

    return lookup


def _symbol_in(datum: Datum, name: str) -> Optional[Span]:
    if isinstance(datum, Symbol):
        return datum.span if datum.name == name else None
    items = datum.items if isinstance(datum, (List, Vector)) else ()
    return next(filter(None, (_symbol_in(i, name) for i in items)), None)


def _describe(datum: Datum) -> str:
    return shown(datum)


def _model_form(model: Model, datum: List, head: str) -> None:
    if head in ("defconst", "defflag"):
        _define(model, _defconst(model, datum), model.consts)
    elif head == "defparam":
        param = _defparam(model, datum)
        _check_key(model, param)
        _define(model, param, model.params)
    elif head == "defun":
        _define(model, _defun(datum), model.defuns)
    elif head == "tie":
        _arity(datum, 2, 2, "(tie NAME TARGET), as (tie lm-head.weight wte.weight)")
        names = [_symbol(d, "a parameter's name") for d in datum.items[1:]]
        model.ties.append(Tie(*names))
    elif head in ("defmodel", "defrun", "require") and not model.is_top:
        raise SourceError(datum.span, f"'{head}' belongs at the top level of the file")
    else:
        raise SourceError(datum.items[0].span, f"unknown definition form '{head}'")


def _check_key(model: Model, param: Param) -> None:
    """A parameter's state_dict key is its name as an identifier, so two names that
    meet in one identifier (`a-b`, `a_b`) cannot both be parameters."""
    key = mangle(param.name)
    other = model.keys.setdefault(key, param)
    if other.name != param.name:
        raise SourceError(
            param.span,
            f"'{param.name}' and '{other.name}' (line {other.span.line}) would both "
            f"have the state_dict key '{key}': rename one",
        )


def _define(model: Model, definition, table: dict) -> None:
    for other in (model.consts, model.params, model.defuns):
        if definition.name in other:
            first = other[definition.name].span
            raise SourceError(
                definition.span,
                f"'{definition.name}' is already defined in this model, at line {first.line}, column {first.col}",
            )
    table[definition.name] = definition


def _symbol(datum: Datum, what: str) -> Symbol:
    if not isinstance(datum, Symbol):
        raise SourceError(datum.span, f"expected {what}, got {_describe(datum)}")
    return datum


def _arity(datum: List, low: int, high: Optional[int], usage: str) -> None:
    n = len(datum.items) - 1
    if n < low or (high is not None and n > high):
        raise SourceError(datum.span, f"wrong number of arguments: expected {usage}")


def _keywords(items: tuple, allowed, where: str) -> dict:
    """`:key value` pairs -> {key: Datum}, rejecting unknown and repeated keys."""
    return keyword_args.keywords(items, keyword_args.form(where, allowed))


def _choice(datum: Datum, choices: tuple, what: str) -> str:
    if isinstance(datum, Keyword) and datum.name in choices:
        return datum.name
    options = " or ".join(f":{c}" for c in choices)
    raise SourceError(datum.span, f"{what} must be {options}, got {shown(datum)}")


def _defconst(model: Model, datum: List) -> Const:
    head = datum.items[0].name
    _arity(datum, 2, 3, f"({head} NAME VALUE [DOC])")
    name = _symbol(datum.items[1], "a constant name")
    value = _evaluate(model, datum.items[2])
    if len(datum.items) == 4 and not isinstance(datum.items[3], String):
        raise SourceError(datum.items[3].span, "a docstring must be a string")
    flag = head == "defflag"
    if flag and not isinstance(datum.items[2], Boolean):
        raise SourceError(
            datum.items[2].span, f"a flag is true or false, got {shown(datum.items[2])}"
        )
    return Const(name.name, value, name.span, flag)


def _defparam(model: Model, datum: List) -> Param:
    _arity(
        datum, 2, None, "(defparam NAME INIT &key :numerics :trainable :dtype :when)"
    )
    name = _symbol(datum.items[1], "a parameter name")
    options = _keywords(
        datum.items[3:],
        {"numerics": None, "trainable": None, "dtype": None, "when": None},
        "defparam",
    )
    param = Param(name.name, _init(model, datum.items[2]), name.span)
    _check_size(param.init, datum.items[2])
    if "when" in options:
        when = options.pop("when")
        param.when = _evaluate(model, when)
        if not isinstance(param.when.value, bool):
            raise SourceError(
                when.span,
                ":when takes a condition on the consts, such as (in layer-idx [0 1])",
            )
    if "numerics" in options:
        param.numerics_high = (
            _choice(options["numerics"], ("high",), ":numerics") == "high"
        )
    if "trainable" in options:
        flag = options["trainable"]
        if not isinstance(flag, Boolean):
            raise SourceError(
                flag.span, f":trainable must be true or false, got {shown(flag)}"
            )
        param.trainable = flag.value
    if "dtype" in options:
        param.dtype = _choice(options["dtype"], PRECISIONS, ":dtype")
    if param.is_module and len(options):
        raise SourceError(
            datum.items[3].span,
            "a sub-model parameter takes no :numerics, :trainable or :dtype",
        )
    return param


def _check_size(init: Init, datum: Datum) -> None:
    if init.kind == "stack" and init.count.value > MAX_LAYERS:
        raise SourceError(
            datum.span,
            f"a stack has at most {MAX_LAYERS:,} layers, got {init.count.value:,}",
        )
    if init.kind in ("model", "stack"):
        return
    elements = 1
    for size in sizes(init):
        elements *= size.value
    if elements > MAX_ELEMENTS:
        raise SourceError(
            datum.span,
            f"a parameter has at most {MAX_ELEMENTS:,} elements, got {elements:,}",
        )


def _init(model: Model, datum: Datum) -> Init:
    head = _head(datum, "an initializer such as (normal [d d])")
    if head == "stack":
        return _stack(model, datum)
    if head in COMPOSITE:
        return COMPOSITE[head](model, datum)
    if head not in INITIALIZERS:
        return Init("model", _instance_args(model, datum), model=head, span=datum.span)
    positional, defaults = INITIALIZERS[head].positional, INITIALIZERS[head].keys
    n = len(positional)
    items = datum.items[1:]
    if len(items) < n or any(isinstance(i, Keyword) for i in items[:n]):
        raise SourceError(
            datum.span,
            f"wrong number of arguments: expected ({head} {' '.join(p.upper() for p in positional)}{' &key ...' if defaults else ''})",
        )
    args = {}
    for key, item in zip(positional, items[:n]):
        if key == "shape":
            args[key] = shape(_built_from(model, item), item, model.names)
        else:
            args[key] = _evaluate(model, item)
    keywords = _keywords(items[n:], defaults, head)
    for key, item in keywords.items():
        args[key] = _evaluate(model, item)
    for key, default in defaults.items():
        args.setdefault(key, Scalar.lit(default))
    for key in INITIALIZERS[head].counts:
        scalars.expect_int(args[key], items[0].span, f"{head}'s size")
    _check_ranges(head, args, keywords, datum)
    return Init(head, args)


def _stack(model: Model, datum: List) -> Init:
    """`(stack N (MODEL :k v ...))`, or `(stack (i N) ...)` whose instances read the layer
    index `i`."""
    _arity(datum, 2, 2, "(stack N (MODEL :k v ...))")
    size, index = datum.items[1], None
    if isinstance(size, List) and len(size.items) == 2:  # (stack (i N) ...)
        index = _symbol(size.items[0], "the layer index's name")
        size = size.items[1]
    count = scalars.expect_int(
        _evaluate(model, size),
        size.span,
        "a stack size",
    )
    if count.value < 0:
        raise SourceError(
            datum.items[1].span,
            f"a stack size must not be negative, got {count.value}",
        )
    inner = _init(_with_index(model, index), datum.items[2])
    if inner.kind != "model":
        raise SourceError(
            datum.items[2].span,
            "stack takes a sub-model instance, such as (block :d d)",
        )
    return Init(
        "stack", inner.args, inner.model, count, inner.span, index and index.name
    )


def _with_index(model: Model, index: Optional[Symbol]) -> Model:
    """`model`, where a stack's instance arguments may read its layer index (0 when checked)."""
    if index is None:
        return model
    seen = Model(model.name, model.span, None, dict(model.consts), model.params)
    seen.consts[index.name] = Const(
        index.name, Scalar(ScalarOp.LAYER, (index.name,), 0), index.span
    )
    return seen


def _concat(model: Model, datum: List) -> Init:
    """`(concat [INIT ...])`: parts end to end along their first axis, as `torch.cat`; its
    size there is the sum of theirs, kept in terms of the consts."""
    _arity(datum, 1, 1, "(concat [INIT ...])")
    items = datum.items[1]
    if not isinstance(items, Vector) or not items.items:
        raise SourceError(
            items.span,
            "concat takes a vector of initializers, such as (concat [(zeros [1]) (full [3] -1.5)])",
        )
    parts = []
    for item in items.items:
        head = _head(item, "an initializer such as (zeros [n])")
        if head not in INITIALIZERS:
            raise SourceError(
                item.span,
                f"concat's parts are tensor initializers such as (zeros [n]), got '{head}'",
            )
        part = _init(model, item)
        shape = [s.value for s in sizes(part)]
        if not shape:
            raise SourceError(
                item.span, f"concat's parts must have an axis, got a 0-D {part.kind}"
            )
        first = [s.value for s in sizes(parts[0])] if parts else shape
        if shape[1:] != first[1:]:
            raise SourceError(
                item.span,
                f"concat's parts must agree in all sizes but the first, got a {part.kind} of shape {shape} after one of shape {first}",
            )
        parts.append(part)
    size = sizes(parts[0])[0]
    for part in parts[1:]:
        size = scalars.fold(ScalarOp.ADD, size, sizes(part)[0], datum.span)
    return Init(
        "concat", {"parts": tuple(parts), "shape": (size, *sizes(parts[0])[1:])}
    )


def _repeat(model: Model, datum: List) -> Init:
    """`(repeat N INIT)`: a 1-D initializer N times over, as `torch.tensor([0.5, 1.0]).repeat(n)`."""
    _arity(datum, 2, 2, "(repeat N INIT)")
    count = scalars.expect_int(
        _evaluate(model, datum.items[1]), datum.items[1].span, "repeat's count"
    )
    if count.value < 0:
        raise SourceError(
            datum.items[1].span,
            f"repeat's count must not be negative, got {count.value}",
        )
    part = _init(model, datum.items[2])
    if part.kind in ("model", "stack") or len(sizes(part)) != 1:
        raise SourceError(datum.items[2].span, "repeat takes a 1-D tensor initializer")
    size = scalars.fold(ScalarOp.MUL, count, sizes(part)[0], datum.span)
    return Init("repeat", {"count": count, "part": part, "shape": (size,)})


def _pow(model: Model, datum: List) -> Init:
    """`(pow BASE INIT)`: a number raised to each value of a tensor initializer, as
    `(1 / 1024) ** torch.linspace(0, 1, n)` (rotary frequencies)."""
    _arity(datum, 2, 2, "(pow BASE INIT)")
    base = _evaluate(model, datum.items[1])
    if isinstance(base.value, (bool, str)):
        raise SourceError(datum.items[1].span, "pow's base must be a number")
    part = _init(model, datum.items[2])
    if part.kind in ("model", "stack"):
        raise SourceError(datum.items[2].span, "pow takes a tensor initializer")
    return Init("pow", {"base": base, "part": part, "shape": sizes(part)})


def _tensor(model: Model, datum: List) -> Init:
    """`(tensor [0.5 1.0])`: a 1-D tensor of those values, as floats."""
    _arity(datum, 1, 1, "(tensor [VALUE ...])")
    items = datum.items[1]
    if not isinstance(items, Vector) or not items.items:
        raise SourceError(
            items.span, "tensor takes a vector of numbers, such as (tensor [0.5 1.0])"
        )
    values = tuple(_evaluate(model, item) for item in items.items)
    for value, item in zip(values, items.items):
        if isinstance(value.value, (bool, str)):
            raise SourceError(
                item.span, f"tensor's values must be numbers, got {shown(item)}"
            )
    return Init("tensor", {"values": values, "shape": (Scalar.lit(len(values)),)})


# The initializers with a form of their own (sx2torch/ops/initializers.py emits them).
COMPOSITE = {"concat": _concat, "repeat": _repeat, "pow": _pow, "tensor": _tensor}


def _check_ranges(head: str, args: dict, keywords: dict, datum: List) -> None:
    """What torch would refuse when the module is built, with the consts at their defaults."""
    for key, value in args.items():
        if isinstance(value, Scalar) and isinstance(value.value, (bool, str)):
            where = keywords[key] if key in keywords else datum.items[2]
            raise SourceError(
                where.span,
                f"{head}'s {key} must be a number, got {shown(where)}",
            )
    for key in INITIALIZERS[head].counts:
        if args[key].value < 0:
            raise SourceError(
                datum.items[1].span,
                f"{head}'s size must not be negative, got {args[key].value}",
            )
    if head == "normal" and args["std"].value < 0:
        raise SourceError(
            keywords["std"].span,
            f":std must not be negative, got {args['std'].value}",
        )
    if head == "uniform" and args["low"].value > args["high"].value:
        low, high = args["low"].value, args["high"].value
        raise SourceError(
            keywords.get("low", keywords.get("high")).span,
            f":low must not be greater than :high, got :low {low} and :high {high}",
        )


def _instance_args(model: Model, datum: List) -> dict:
    """`(MODEL :k v ...)` -> {k: (span, Scalar)}; the keys are checked once every model is read."""
    items = datum.items[1:]
    if items and not isinstance(items[0], Keyword):
        raise SourceError(
            items[0].span,
            "a sub-model takes only keyword arguments, such as (block :d d)",
        )
    every_key = {item.name: None for item in items[::2] if isinstance(item, Keyword)}
    pairs = _keywords(items, every_key, "a sub-model instance")
    keys = {item.name: item.span for item in items[::2]}
    return {key: (keys[key], _evaluate(model, value)) for key, value in pairs.items()}


def shape(lookup, datum: Datum, known=None) -> tuple:
    if not isinstance(datum, Vector):
        raise SourceError(
            datum.span,
            "a shape must be a vector of integers and constants, such as [d (* 4 d)]",
        )
    sizes = tuple(
        scalars.expect_int(scalars.evaluate(item, lookup, known), item.span, "a size")
        for item in datum.items
    )
    for item, size in zip(datum.items, sizes):
        if size.value < 0:
            raise SourceError(
                item.span, f"a size must not be negative, got {size.value}"
            )
    return sizes


def _defun(datum: List) -> Defun:
    _arity(datum, 2, None, "(defun NAME (ARG ... &key (K DEFAULT) ...) [DOC] BODY ...)")
    name = _symbol(datum.items[1], "a function name")
    if name.name in FORMS:  # traced by their handlers, never called
        raise SourceError(
            name.span, f"a defun cannot be named '{name.name}': that is a special form"
        )
    params = datum.items[2]
    if not isinstance(params, List):
        raise SourceError(
            params.span, "expected an argument list such as (x &key (eps 1e-6))"
        )
    args, keys = _lambda_list(params.items)
    body = datum.items[3:]
    doc = None
    if len(body) > 1 and isinstance(body[0], String):
        doc, body = body[0].value, body[1:]
    if not body:
        raise SourceError(datum.span, f"defun '{name.name}' has no body")
    return Defun(name.name, args, keys, doc, tuple(body), name.span)


def _lambda_list(items: tuple) -> tuple:
    args: list[Symbol] = []
    keys: list[tuple] = []
    seen: set[str] = set()
    in_keys = False
    for item in items:
        if isinstance(item, Symbol) and item.name == "&key":
            if in_keys:
                raise SourceError(item.span, "&key given twice")
            in_keys = True
            continue
        if in_keys:
            if isinstance(item, Symbol):
                raise SourceError(
                    item.span, f"a &key argument needs a default: ({item.name} DEFAULT)"
                )
            if not isinstance(item, List) or len(item.items) != 2:
                raise SourceError(item.span, "expected (NAME DEFAULT) after &key")
            symbol, default = _symbol(item.items[0], "an argument name"), item.items[1]
        else:
            symbol, default = _symbol(item, "an argument name"), None
        if symbol.name in seen:
            raise SourceError(symbol.span, f"argument '{symbol.name}' given twice")
        seen.add(symbol.name)
        (keys.append((symbol, default)) if in_keys else args.append(symbol))
    return args, keys


def _defmodel(datum: List) -> Model:
    _arity(datum, 2, None, "(defmodel NAME (&key (K DEFAULT) ...) [DOC] FORM ...)")
    name = _symbol(datum.items[1], "a model name")
    params = datum.items[2]
    if not isinstance(params, List):
        raise SourceError(params.span, "expected a key list such as (&key (d 128))")
    args, keys = _lambda_list(params.items)
    if args:
        raise SourceError(args[0].span, "a model takes only &key arguments")
    model = Model(name.name, name.span)
    for symbol, default in keys:
        model.consts[symbol.name] = Const(
            symbol.name, _evaluate(model, default), symbol.span
        )
    body = datum.items[3:]
    if body and isinstance(body[0], String):
        model.doc, body = body[0].value, body[1:]
    for form in body:
        _model_form(model, form, _head(form, "a definition"))
    if "forward" not in model.defuns:
        raise SourceError(name.span, f"model '{name.name}' defines no 'forward' defun")
    return model


def _defrun(datum: List, runs: list) -> Run:
    _arity(datum, 1, None, "(defrun NAME :precision P)")
    name = _symbol(datum.items[1], "a run name")
    if any(r.name == name.name for r in runs):
        raise SourceError(name.span, f"run '{name.name}' is already defined")
    options = _keywords(datum.items[2:], dict.fromkeys(RUN_KEYS), "defrun")
    run = Run(name.name, "f32", name.span, keys=options)
    if "precision" in options:
        run.precision = _choice(options["precision"], PRECISIONS, ":precision")
    if "loss" in options:
        run.loss = _symbol(options["loss"], "the name of the loss defun")
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
    if "tp-reduce" in options:
        run.tp_reduce = _choice(options["tp-reduce"], PRECISIONS, ":tp-reduce")
    if run.loss is None:
        for key in [k for k in options if k not in ("precision", "tp-reduce")]:
            raise SourceError(
                options[key].span, f"defrun :{key} needs :loss (the defun to train)"
            )
    return run


def _optimizer(datum: Datum, kinds: dict) -> Optimizer:
    """`(adamw :lr 3e-4 ...)` or `(muon :lr 0.02 ... :adamw (adamw ...))`."""
    usage = " or ".join(f"({kind} :lr X ...)" for kind in kinds)
    if not isinstance(datum, List) or not datum.items:
        raise SourceError(datum.span, f"expected an optimizer such as {usage}")
    head = _symbol(datum.items[0], "an optimizer name")
    if head.name not in kinds:
        known = ", ".join(kinds)
        raise SourceError(
            head.span, f"unknown optimizer '{head.name}' (known: {known})"
        )
    options = _keywords(
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
    options = _keywords(datum.items, {"warmup": None, "cooldown": None}, ":schedule")
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
        name = _symbol(entry.items[0], "an argument name")
        shape = entry.items[1]
        if not isinstance(shape, Vector):
            raise SourceError(
                shape.span, f"expected a shape such as [64 d], got {shown(shape)}"
            )
        options = _keywords(entry.items[2:], {"high": None}, "an input")
        inputs.append(Input(name, shape.items, options.get("high")))
    return inputs


def _check_run(top: Model, run: Run) -> None:
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


def _require(datum: List) -> None:
    _arity(datum, 1, 1, "(require sexpgpu/nn)")
    library = _symbol(datum.items[1], "a library name")
    if library.name not in ("sexpgpu/nn", "sexpgpu/optim"):
        raise SourceError(
            library.span,
            f"unknown library '{library.name}' (known: sexpgpu/nn, sexpgpu/optim)",
        )


def _check_params(program: Program, model: Model) -> None:
    for param in model.params.values():
        if not param.is_module:
            continue
        if param.init.model not in program.models or param.init.model == model.name:
            raise SourceError(
                param.init.span, f"unknown initializer or model '{param.init.model}'"
            )
        sub = program.models[param.init.model]
        for key, (span, _) in param.init.args.items():
            if key not in sub.consts:
                known = ", ".join(f":{k}" for k in sub.consts) or "none"
                raise SourceError(
                    span, f"model '{sub.name}' has no key :{key} (known: {known})"
                )


def _check_built(program: Program) -> None:
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
                if where is not None:  # the top model's sizes: _check_size
                    built.sizes(param, [built.compute(z, env) for z in sizes(init)])
                continue
            count = built.compute(init.count, env) if init.kind == "stack" else 1
            if where is not None and init.kind == "stack":
                built.count(param, count)
            layers = sorted({0, count - 1}) if init.index and count > 0 else [None]
            for layer in layers if count > 0 else []:
                inside = {**env, init.index: layer} if init.index else env
                args = {k: built.compute(v, inside) for k, (_, v) in init.args.items()}
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
        except (ArithmeticError, TypeError, ValueError) as error:
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


def _check_ties(program: Program, model: Model) -> None:
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


def _check_containment(program: Program) -> None:
    """No model holds an instance of itself, directly or through other models."""
    finished: set = set()
    for root in program.models.values():
        stack = [(root, iter(root.params.values()))]
        path = [root.name]
        while stack:
            model, params = stack[-1]
            param = next(params, None)
            if param is None:
                finished.add(model.name)
                stack.pop()
                path.pop()
                continue
            if not param.is_module or param.init.model in finished:
                continue
            if param.init.model in path:
                route = " -> ".join(
                    path[path.index(param.init.model) :] + [param.init.model]
                )
                raise SourceError(
                    param.span, f"model '{param.init.model}' contains itself ({route})"
                )
            sub = program.models[param.init.model]
            stack.append((sub, iter(sub.params.values())))
            path.append(sub.name)
