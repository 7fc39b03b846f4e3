"""einsum: `torch.einsum` of an equation written as a string, `(einsum "bhqd,bhkd->bhqk" q
k)`. It computes in the dtype the policy gives it, as matmul does: under `:bf16` torch's
kernel on bf16 operands (its contractions are bf16 GEMMs, f32 accumulation, one rounding);
the held targets compute it in f32 and round once. Its derivative by each operand is an
einsum too, of the output's gradient and the other operands, back to that operand's
subscripts.
"""

from __future__ import annotations

import re
from typing import Optional

import sx2torch.build as b
from sx2torch.errors import SourceError
from sx2torch.ops.rank import RankRule, ShapeError, shown
from sx2torch.ops.registry import Arg, Op, register

# one operand's subscripts: letters, with at most one "..." among them
_SUBSCRIPTS = re.compile(r"[a-zA-Z]*(\.\.\.)?[a-zA-Z]*")


def check_equation(text: str) -> Optional[str]:
    """Why `text` is no equation this op takes (None where it is one)."""
    text = text.replace(" ", "")
    if text.count("->") != 1:
        return (
            f'einsum\'s equation needs its output written after "->", such as '
            f'"ij,jk->ik", got "{text}"'
        )
    inputs, output = text.split("->")
    for subscripts in inputs.split(",") + [output]:
        if not _SUBSCRIPTS.fullmatch(subscripts):
            return (
                f'einsum\'s subscripts are letters and at most one "...", got '
                f'"{subscripts}" in "{text}"'
            )
    letters = re.sub(r"[^a-zA-Z]", "", inputs)
    stray = [c for c in output.replace("...", "") if c not in letters]
    if stray or len(set(output.replace("...", ""))) != len(output.replace("...", "")):
        return (
            f"einsum's output \"{output}\" names each of its inputs' letters at most "
            f'once, got "{text}"'
        )
    if "..." in output and "..." not in inputs:
        return f'einsum\'s output has "..." where no input has one: "{text}"'
    return None


def parse(text: str) -> tuple:
    """(the inputs' subscripts, the output's), each "..." written as "." (one position)."""
    inputs, output = text.replace(" ", "").replace("...", ".").split("->")
    return tuple(inputs.split(",")), output


def _written(subscripts) -> str:
    return ",".join(subscripts).replace(".", "...")


def _shape(shapes, attrs):
    """The output's sizes from the letters' sizes; the "..." axes where every operand that
    has them has a known rank, broadcast as torch broadcasts them."""
    inputs, output = parse(attrs["equation"])
    if len(inputs) != len(shapes):
        raise ShapeError(
            f'einsum\'s equation "{attrs["equation"]}" names {len(inputs)} operands, '
            f"got {len(shapes)}"
        )
    sizes: dict = {}
    dots: Optional[list] = []
    for k, (subscripts, shape) in enumerate(zip(inputs, shapes)):
        if shape is None:
            if "." in subscripts:
                dots = None
            continue
        named = len(subscripts.replace(".", ""))
        if len(shape) != named if "." not in subscripts else len(shape) < named:
            raise ShapeError(
                f'einsum\'s operand {k + 1} "{subscripts.replace(".", "...")}" has '
                f"{named} axes, got a value of shape {shown(shape)}"
            )
        at = subscripts.find(".")
        extra = len(shape) - named
        if at >= 0 and dots is not None:
            dots = _broadcast(dots, list(shape[at : at + extra]))
        after = subscripts[at + 1 :] if at >= 0 else ""
        pairs = zip(subscripts[:at] if at >= 0 else subscripts, shape)
        pairs = list(pairs) + list(zip(after, shape[len(shape) - len(after) :]))
        for letter, size in pairs:
            if size is not None and sizes.get(letter) in (None, 1):
                sizes[letter] = size
    if "." in output and dots is None:
        return None
    made = []
    for c in output:
        made += dots if c == "." else [sizes.get(c)]
    return tuple(made)


def _broadcast(a: list, b_: list) -> list:
    """Two "..." parts' sizes as torch broadcasts them (None where unknown)."""
    if len(a) < len(b_):
        a, b_ = b_, a
    b_ = [1] * (len(a) - len(b_)) + b_
    return [y if x == 1 else x if y == 1 or x == y else None for x, y in zip(a, b_)]


def _grad(t, n, g):
    """The gradient by operand k: the einsum of g and the other operands back to k's
    subscripts (with ones of k's shape where k has letters nothing else has: a sum's
    broadcast back), summed back over the "..." axes the output broadcast."""
    inputs, output = parse(n.attrs["equation"])
    grads = []
    for k, subscripts in enumerate(inputs):
        letters = subscripts.replace(".", "")
        if len(set(letters)) != len(letters):
            raise SourceError(
                n.span,
                f"einsum's derivative by an operand that repeats a letter (\""
                f'{subscripts.replace(".", "...")}", a diagonal) has no rule yet, and '
                "(gradient ...) needs one here",
            )
        others = [s for j, s in enumerate(inputs) if j != k]
        operands = [g, *(x for j, x in enumerate(n.inputs) if j != k)]
        if set(letters) - set(output + "".join(others)):
            others.append(subscripts)
            operands.append(t.op("ones-like", [n.inputs[k]]))
        equation = f"{_written([output, *others])}->{_written([subscripts])}"
        grad = t.op("einsum", operands, equation=equation)
        grads.append(t.op("sum-to", [grad, n.inputs[k]]) if "." in subscripts else grad)
    return grads


register(
    Op(
        "einsum",
        (Arg("equation", "equation"), Arg("x", "matrix")),
        lambda a, ctx: b.call("torch.einsum", b.string(ctx.attrs["equation"]), *a),
        arity=(2, None),
        grad=_grad,
        autocasts=True,
        rank=RankRule("the output's subscripts", _shape),
        mixes=True,
        doc=(
            'torch.einsum of the EQUATION, a string such as "bhqd,bhkd->bhqk" with its '
            'output written after "->" (letters, and at most one "..." per operand), '
            "over the operands X ...: computes in the dtype the policy gives it, as "
            "matmul. Its derivative by each operand is an einsum of the gradient and the "
            "other operands (not for an operand that repeats a letter)"
        ),
    )
)
