"""Each form's shape, declared once, as Hy's pattern macros declare theirs: its positional
parts and what each must be, its body, and its `:key` keywords and what each value must be.
`match` checks a form against its shape, so that a wrong number of arguments, a part of the
wrong kind and a wrong keyword are reported here, in one wording, at the item they are
about. resolve reads the definitions (SHAPES' first half), trace the special forms (SPECIAL);
what a part means (a const's value, an initializer, a branch) is theirs to check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sx2torch.errors import SourceError
from sx2torch.syntax import keywords as keyword_args
from sx2torch.syntax.program import PRECISIONS, RUN_KEYS
from sx2torch.syntax.read import (
    Boolean,
    Datum,
    Keyword,
    List,
    String,
    Symbol,
    Vector,
    shown,
)


@dataclass(frozen=True)
class Kind:
    """What a part, or a keyword's value, must be: a datum of one of `types` (a keyword one
    of `choices`, where given); `what` names it in the diagnostic."""

    types: tuple
    what: str
    choices: tuple = ()

    def fits(self, datum: Datum) -> bool:
        return isinstance(datum, self.types) and (
            not self.choices or datum.name in self.choices
        )


def name(what: str) -> Kind:
    return Kind((Symbol,), what)


def choice(*choices: str) -> Kind:
    return Kind((Keyword,), " or ".join(f":{c}" for c in choices), choices)


FLAG = Kind((Boolean,), "true or false")
DOC = Kind((String,), "a docstring")


@dataclass(frozen=True)
class Part:
    """A positional part: `label` as the usage writes it, and what it must be (None: any
    datum). An optional part is the last, and is taken where given."""

    label: str
    kind: Optional[Kind] = None
    optional: bool = False


def named(label: str, what: str) -> Part:
    return Part(label, name(what))


def listed(label: str, what: str) -> Part:
    """A part written as a list, whose items its reader checks."""
    return Part(label, Kind((List,), what))


@dataclass(frozen=True)
class Shape:
    parts: tuple = ()
    # the items after the parts, at least `least` of them, as the usage writes one
    body: Optional[str] = None
    least: int = 0
    # `:key value` pairs after the parts: key -> what its value must be (None: any datum);
    # None where the form takes no keywords ({}: it takes them, and knows none)
    keys: Optional[dict] = None
    example: str = ""  # a form as written, shown after the usage

    def usage(self, head: str) -> str:
        words = [head]
        words += [f"[{p.label}]" if p.optional else p.label for p in self.parts]
        if self.body is not None:
            words.append(f"{self.body} ...")
        if self.keys:
            words.append("&key " + " ".join(f":{k}" for k in self.keys))
        example = f", as {self.example}" if self.example else ""
        return f"({' '.join(words)}){example}"


@dataclass(frozen=True)
class Matched:
    """A form's parts in the shape's order (None for an optional part not given), its body,
    and its keywords {key: value}."""

    parts: tuple
    body: tuple
    keys: dict


def match(datum: List, shape: Optional[Shape] = None) -> Matched:
    """`datum`, a form whose head names its shape in SHAPES (or of `shape`), checked
    against that shape."""
    head = datum.items[0].name
    shape = shape or SHAPES[head]
    items = datum.items[1:]
    required = sum(not p.optional for p in shape.parts)
    count = len(items)
    if shape.keys is not None:  # the parts are the items before the first keyword
        count = next((k for k, i in enumerate(items) if isinstance(i, Keyword)), count)
        fits = count >= required
    elif shape.body is not None:
        fits = count >= required + shape.least
    else:
        fits = required <= count <= len(shape.parts)
    if not fits:
        raise SourceError(
            datum.span,
            f"wrong number of arguments: expected {shape.usage(head)}, got {count}",
        )
    given = items[: min(len(shape.parts), count)]
    for part, item in zip(shape.parts, given):
        if part.kind is not None and not part.kind.fits(item):
            raise SourceError(
                item.span, f"expected {part.kind.what}, got {shown(item)}"
            )
    parts = (*given, *[None] * (len(shape.parts) - len(given)))
    rest = items[len(given) :]
    if shape.keys is None:
        return Matched(parts, rest, {})
    keys = keyword_args.keywords(rest, keyword_args.form(head, shape.keys))
    for key, value in keys.items():
        kind = shape.keys[key]
        if kind is not None and not kind.fits(value):
            raise SourceError(
                value.span, f":{key} must be {kind.what}, got {shown(value)}"
            )
    return Matched(parts, (), keys)


CONST = Shape((named("NAME", "a constant name"), Part("VALUE"), Part("DOC", DOC, True)))

# The definitions, which resolve reads. A docstring before a body is the body's reader's:
# it is the docstring only where more follows.
DEFINITIONS = {
    "defconst": CONST,
    "defflag": CONST,
    "defparam": Shape(
        (
            named("NAME", "a parameter name"),
            Part("INIT"),
            Part("DOC", DOC, optional=True),
        ),
        keys={
            "numerics": choice("high"),
            "trainable": FLAG,
            "persistent": FLAG,
            "dtype": choice(*PRECISIONS),
            "when": None,
        },
    ),
    "defun": Shape(
        (
            named("NAME", "a function name"),
            listed(
                "(ARG ... &key (K DEFAULT) ...)",
                "an argument list such as (x &key (eps 1e-6))",
            ),
        ),
        body="[DOC] BODY",
    ),
    "defmodel": Shape(
        (
            named("NAME", "a model name"),
            listed("(&key (K DEFAULT) ...)", "a key list such as (&key (d 128))"),
        ),
        body="[DOC] FORM",
    ),
    "tie": Shape(
        (
            named("NAME", "a parameter's name"),
            named("TARGET", "a parameter's name"),
        ),
        example="(tie lm-head.weight wte.weight)",
    ),
    # the other keys' values are read by resolve/runs.py
    "defrun": Shape(
        (named("NAME", "a run name"),),
        keys={
            **dict.fromkeys(RUN_KEYS),
            "precision": choice(*PRECISIONS),
            "loss": name("the name of the loss defun"),
            "generate": Kind(
                (Boolean, Symbol), "true, false, or the argument of forward that grows"
            ),
            "tp-reduce": choice(*PRECISIONS),
        },
    ),
    "require": Shape(
        (named("LIBRARY", "a library name"),), example="(require sexpgpu/nn)"
    ),
    # the initializers with a form of their own
    "stack": Shape((Part("N"), Part("(MODEL :k v ...)"))),
    "sequential": Shape((Part("(MODEL :k v ...)"),), body="(MODEL :k v ...)"),
    "module-list": Shape((Part("(MODEL :k v ...)"),), body="(MODEL :k v ...)"),
    "concat": Shape((Part("[INIT ...]"),), keys={"axis": None}),
    "repeat": Shape((Part("N"), Part("INIT"))),
    "pow": Shape((Part("BASE"), Part("INIT"))),
    "tensor": Shape((Part("[VALUE ...]"),)),
    "weight-norm": Shape(
        (Part("(MODEL :k v ...)"),),
        keys={"name": name("a parameter's name"), "dim": None},
        example="(weight-norm (Conv1d d d k) :name weight :dim 2)",
    ),
}

# The special forms, which trace's handlers trace (sx2torch/trace/forms.py): no defun may
# take one of their names.
SPECIAL = {
    "let": Shape(
        (listed("((NAME EXPR) ...)", "the bindings ((NAME EXPR) ...)"),),
        body="BODY",
        least=1,
    ),
    "with-numerics": Shape(
        (
            listed(
                "(OPTION VALUE)",
                "one option, (:sensitivity :high) or (:precision :bf16)",
            ),
        ),
        body="BODY",
        least=1,
        example="(with-numerics (:precision :bf16) (matmul x w))",
    ),
    "cast": Shape(
        (Part("X"), Part("DTYPE", choice("f32", "bf16", "i64", "i32", "bool"))),
        example="(cast x :bf16)",
    ),
    "gradient": Shape(
        (
            Part("Y"),
            named("X", "a name (an argument, a let local or a parameter)"),
        ),
    ),
    "chain": Shape((named("LAYERS", "the name of a stack"), Part("X")), body="ARG"),
    "nth": Shape((named("STACK", "the name of a stack"), Part("I")), body="X"),
    "for": Shape(
        (
            listed("(I LAYER STACK)", "(I LAYER STACK) or (LAYER STACK)"),
            listed("((NAME INIT) ...)", "the carried values, ((NAME INIT) ...)"),
        ),
        body="BODY",
        least=1,
    ),
    "if": Shape((Part("CONDITION"), Part("THEN"), Part("ELSE"))),
    "and": Shape((Part("CONDITION"),), body="CONDITION", least=1),
    "or": Shape((Part("CONDITION"),), body="CONDITION", least=1),
    "not": Shape((Part("CONDITION"),)),
    "in": Shape(
        (
            Part("X"),
            Part(
                "[A B ...]",
                Kind((Vector, Symbol), "a vector of choices, [A B ...], or a list"),
            ),
        )
    ),
}

SHAPES = {**DEFINITIONS, **SPECIAL}
