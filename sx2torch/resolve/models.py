"""A model's definitions: defmodel, and the forms inside a model (defconst, defflag,
defparam, defun, tie), each added to the model's tables once."""

from __future__ import annotations

from sx2torch.errors import SourceError
from sx2torch.resolve.initializers import check_size, initializer
from sx2torch.resolve.values import (
    arity,
    choice,
    evaluate,
    expect_symbol,
    form_head,
    read_keywords,
)
from sx2torch.syntax.names import FORMS, mangle
from sx2torch.syntax.program import PRECISIONS, Const, Defun, Model, Param, Tie
from sx2torch.syntax.read import Boolean, List, String, Symbol, shown


def model_form(model: Model, datum: List, head: str) -> None:
    if head in ("defconst", "defflag"):
        _define(model, _defconst(model, datum), model.consts)
    elif head == "defparam":
        param = _defparam(model, datum)
        _check_key(model, param)
        _define(model, param, model.params)
    elif head == "defun":
        _define(model, _defun(datum), model.defuns)
    elif head == "tie":
        arity(datum, 2, 2, "(tie NAME TARGET), as (tie lm-head.weight wte.weight)")
        names = [expect_symbol(d, "a parameter's name") for d in datum.items[1:]]
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


def _defconst(model: Model, datum: List) -> Const:
    head = datum.items[0].name
    arity(datum, 2, 3, f"({head} NAME VALUE [DOC])")
    name = expect_symbol(datum.items[1], "a constant name")
    value = evaluate(model, datum.items[2])
    if len(datum.items) == 4 and not isinstance(datum.items[3], String):
        raise SourceError(datum.items[3].span, "a docstring must be a string")
    flag = head == "defflag"
    if flag and not isinstance(datum.items[2], Boolean):
        raise SourceError(
            datum.items[2].span, f"a flag is true or false, got {shown(datum.items[2])}"
        )
    return Const(name.name, value, name.span, flag)


def _defparam(model: Model, datum: List) -> Param:
    arity(datum, 2, None, "(defparam NAME INIT &key :numerics :trainable :dtype :when)")
    name = expect_symbol(datum.items[1], "a parameter name")
    options = read_keywords(
        datum.items[3:],
        {"numerics": None, "trainable": None, "dtype": None, "when": None},
        "defparam",
    )
    param = Param(name.name, initializer(model, datum.items[2]), name.span)
    check_size(param.init, datum.items[2])
    if "when" in options:
        when = options.pop("when")
        param.when = evaluate(model, when)
        if not isinstance(param.when.value, bool):
            raise SourceError(
                when.span,
                ":when takes a condition on the consts, such as (in layer-idx [0 1])",
            )
    if "numerics" in options:
        param.numerics_high = (
            choice(options["numerics"], ("high",), ":numerics") == "high"
        )
    if "trainable" in options:
        flag = options["trainable"]
        if not isinstance(flag, Boolean):
            raise SourceError(
                flag.span, f":trainable must be true or false, got {shown(flag)}"
            )
        param.trainable = flag.value
    if "dtype" in options:
        param.dtype = choice(options["dtype"], PRECISIONS, ":dtype")
    if param.is_module and len(options):
        raise SourceError(
            datum.items[3].span,
            "a sub-model parameter takes no :numerics, :trainable or :dtype",
        )
    return param


def _defun(datum: List) -> Defun:
    arity(datum, 2, None, "(defun NAME (ARG ... &key (K DEFAULT) ...) [DOC] BODY ...)")
    name = expect_symbol(datum.items[1], "a function name")
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
            symbol, default = (
                expect_symbol(item.items[0], "an argument name"),
                item.items[1],
            )
        else:
            symbol, default = expect_symbol(item, "an argument name"), None
        if symbol.name in seen:
            raise SourceError(symbol.span, f"argument '{symbol.name}' given twice")
        seen.add(symbol.name)
        (keys.append((symbol, default)) if in_keys else args.append(symbol))
    return args, keys


def defmodel(datum: List) -> Model:
    arity(datum, 2, None, "(defmodel NAME (&key (K DEFAULT) ...) [DOC] FORM ...)")
    name = expect_symbol(datum.items[1], "a model name")
    params = datum.items[2]
    if not isinstance(params, List):
        raise SourceError(params.span, "expected a key list such as (&key (d 128))")
    args, keys = _lambda_list(params.items)
    if args:
        raise SourceError(args[0].span, "a model takes only &key arguments")
    model = Model(name.name, name.span)
    for symbol, default in keys:
        model.consts[symbol.name] = Const(
            symbol.name, evaluate(model, default), symbol.span
        )
    body = datum.items[3:]
    if body and isinstance(body[0], String):
        model.doc, body = body[0].value, body[1:]
    for form in body:
        model_form(model, form, form_head(form, "a definition"))
    if "forward" not in model.defuns:
        raise SourceError(name.span, f"model '{name.name}' defines no 'forward' defun")
    return model
