"""A model's definitions: defmodel, and the forms inside a model (defconst, defflag,
defparam, defun, tie), each added to the model's tables once."""

from __future__ import annotations

from sx2torch.errors import SourceError
from sx2torch.resolve.initializers import check_size, initializer
from sx2torch.resolve.values import (
    evaluate,
    evaluate_or_none,
    expect_symbol,
    form_head,
)
from sx2torch.syntax.forms import match
from sx2torch.syntax.names import FORMS, mangle
from sx2torch.syntax.program import Const, Defun, Model, Param, Tie
from sx2torch.syntax.read import Boolean, Keyword, List, String, Symbol, shown
from sx2torch.syntax.scalars import RUN_VALUE, Scalar


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
        model.ties.append(Tie(*match(datum).parts))
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
    name, given, _ = match(datum).parts
    value = evaluate_or_none(model, given)
    flag = datum.items[0].name == "defflag"
    if flag and not isinstance(given, Boolean):
        raise SourceError(given.span, f"a flag is true or false, got {shown(given)}")
    return Const(name.name, value, name.span, flag)


def _defparam(model: Model, datum: List) -> Param:
    form = match(datum)
    (name, init, doc), options = form.parts, form.keys
    param = Param(name.name, initializer(model, init), name.span)
    if doc is not None:
        param.doc = doc.value
    check_size(param.init, init)
    if "when" in options:
        when = options.pop("when")
        param.when = evaluate(model, when)
        if not isinstance(param.when.value, bool):
            raise SourceError(
                when.span,
                ":when takes a condition on the consts, such as (in layer-idx [0 1])",
            )
    if "numerics" in options:  # :high, the one choice
        param.numerics_high = True
    if "trainable" in options:
        param.trainable = options["trainable"].value
    if "dtype" in options:
        param.dtype = options["dtype"].name
    if param.is_module and len(options):
        raise SourceError(
            datum.items[3 + (doc is not None)].span,
            "a sub-model parameter takes no :numerics, :trainable or :dtype",
        )
    return param


def _defun(datum: List) -> Defun:
    form = match(datum)
    (name, params), body = form.parts, form.body
    if name.name in FORMS:  # traced by their handlers, never called
        raise SourceError(
            name.span, f"a defun cannot be named '{name.name}': that is a special form"
        )
    args, keys = _lambda_list(params.items)
    doc = None
    if len(body) > 1 and isinstance(body[0], String):
        doc, body = body[0].value, body[1:]
    if not body:
        raise SourceError(datum.span, f"defun '{name.name}' has no body")
    return Defun(name.name, args, keys, doc, tuple(body), name.span)


def _lambda_list(items: tuple, model: bool = False) -> tuple:
    """A lambda list's arguments and &key arguments. A model's &key may be written
    without a default (`in-features`: every instance passes it) and under another key
    than the name it is read by (`((:bias has-bias) true)`); each &key is then
    (symbol, default or None, the key's name or None)."""
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
        key = None
        if in_keys:
            if isinstance(item, Symbol) and not model:
                raise SourceError(
                    item.span, f"a &key argument needs a default: ({item.name} DEFAULT)"
                )
            if isinstance(item, Symbol):
                symbol, default = item, None
            elif not isinstance(item, List) or len(item.items) != 2:
                raise SourceError(item.span, "expected (NAME DEFAULT) after &key")
            else:
                symbol, default = item.items
                if model and isinstance(symbol, List):
                    symbol, key = _aliased(symbol)
                symbol = expect_symbol(symbol, "an argument name")
        else:
            symbol, default = expect_symbol(item, "an argument name"), None
        if symbol.name in seen:
            raise SourceError(symbol.span, f"argument '{symbol.name}' given twice")
        seen.add(symbol.name)
        if in_keys:
            keys.append((symbol, default, key) if model else (symbol, default))
        else:
            args.append(symbol)
    return args, keys


def _aliased(datum: List) -> tuple:
    """`(:bias has-bias)`: the name read in the model and the key its instances pass."""
    if len(datum.items) != 2 or not isinstance(datum.items[0], Keyword):
        raise SourceError(
            datum.span,
            "expected (:KEY NAME): the key instances pass, then the name read",
        )
    return datum.items[1], datum.items[0].name


def defmodel(datum: List) -> Model:
    form = match(datum)
    (name, params), body = form.parts, form.body
    args, keys = _lambda_list(params.items, model=True)
    if args:
        raise SourceError(
            args[0].span,
            "a model takes only &key arguments (an instance may pass them in order, "
            "before its keywords)",
        )
    model = Model(name.name, name.span)
    passed: dict = {}  # the keys instances pass, each once
    for symbol, default, key in keys:
        if passed.setdefault(key or symbol.name, symbol) is not symbol:
            raise SourceError(
                symbol.span,
                f"model '{name.name}' takes the key :{key or symbol.name} twice",
            )
        value = (
            Scalar.lit(RUN_VALUE)
            if default is None
            else evaluate_or_none(model, default)
        )
        model.consts[symbol.name] = Const(
            symbol.name, value, symbol.span, key=key, required=default is None
        )
    if body and isinstance(body[0], String):
        model.doc, body = body[0].value, body[1:]
    for form in body:
        model_form(model, form, form_head(form, "a definition"))
    if "forward" not in model.defuns:
        raise SourceError(name.span, f"model '{name.name}' defines no 'forward' defun")
    return model
