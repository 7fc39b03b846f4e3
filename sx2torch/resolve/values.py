"""A definition's parts as resolve reads them, past the shape syntax/forms.py checks: its
head, symbols, `:key value` options, and the compile-time numbers and shapes it gives in
terms of a model's consts."""

from __future__ import annotations

from typing import Optional

from sx2torch.errors import SourceError, Span
from sx2torch.syntax import keywords as keyword_args
from sx2torch.syntax import scalars
from sx2torch.syntax.program import Model
from sx2torch.syntax.read import Datum, List, Symbol, Vector, shown
from sx2torch.syntax.scalars import Scalar


def form_head(datum: Datum, what: str) -> str:
    if (
        not isinstance(datum, List)
        or not datum.items
        or not isinstance(datum.items[0], Symbol)
    ):
        raise SourceError(
            datum.span, f"expected {what} such as (defun ...), got {_describe(datum)}"
        )
    return datum.items[0].name


def _describe(datum: Datum) -> str:
    return shown(datum)


def expect_symbol(datum: Datum, what: str) -> Symbol:
    if not isinstance(datum, Symbol):
        raise SourceError(datum.span, f"expected {what}, got {_describe(datum)}")
    return datum


def read_keywords(items: tuple, allowed, where: str) -> dict:
    """`:key value` pairs -> {key: Datum}, rejecting unknown and repeated keys."""
    return keyword_args.keywords(items, keyword_args.form(where, allowed))


def evaluate(model: Model, datum: Datum) -> Scalar:
    """A compile-time number read in `model`, whose names are known so far."""
    return scalars.evaluate(datum, built_from(model, datum), model.names)


def evaluate_or_none(model: Model, datum: Datum) -> Scalar:
    """A const's value, a &key's default or an instance's argument: a number known at
    compile time, or `none`, Python's None, which only a key that takes it reads (take's
    :padding-idx: torch's padding_idx=None, a config's pad_token_id=None)."""
    if (
        isinstance(datum, Symbol)
        and datum.name == "none"
        and "none" not in model.consts
    ):
        return Scalar.lit(None)
    return evaluate(model, datum)


def built_from(model: Model, datum: Datum):
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
