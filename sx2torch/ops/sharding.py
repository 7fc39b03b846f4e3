"""How a value split across devices along one axis passes through an op: the registry's
`shards` field, which the tensor-parallel analysis (sx2torch/shard.py) reads.

A rule is `rule(axes, shapes, attrs)`. `axes` holds, for each input, the axis along which
it is split, counted from the end (-1: the last; ranks are often unknown when the file
compiles, a sub-model's input's among them), or None where every device holds all of it;
`shapes` the inputs' sizes where their rank is known, else None (a compile-time number's
is ()). It returns the output's split axis, None where every device holds all of the
output, or PARTIAL where each holds a partial sum of it (the split axis contracted: a
row-parallel product, which a reduction completes), or `Heads` where it splits the
features into heads (the axis, and each head's sizes). It raises Refused, saying why, where
the op needs what the other devices hold; the analysis then keeps the weights whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sx2torch.ops.rank import known

PARTIAL = "partial"


class Refused(Exception):
    """The op reads across the split axis; the message says how."""


@dataclass(frozen=True)
class Heads:
    """What a rule returns where it splits the features into heads: the heads' axis, now
    the split one, and each head's sizes (the reshape's sizes after its -1, scalars): a
    device's share of the features must hold whole heads, which the plan records so that
    the runtime can check it against the sizes the module was built with."""

    axis: int
    sizes: tuple


def _split(axes) -> list:
    return [a for a in axes if a is not None]


def _one_axis(axes) -> Optional[int]:
    split = _split(axes)
    if not split:
        return None
    if PARTIAL in split:
        raise Refused("it reads a partial sum before its reduction")
    if len(set(split)) > 1:
        raise Refused("its operands are split along different axes")
    return split[0]


def pointwise(axes, shapes, attrs) -> Optional[int]:
    """Elementwise with broadcasting: the split axis keeps its place from the right; an
    operand every device holds whole may only broadcast along it (size 1 or no such axis).
    """
    axis = _one_axis(axes)
    if axis is None:
        return None
    for a, dims in zip(axes, shapes):
        if a is None and dims is None:
            raise Refused("an operand every device holds whole has an unknown rank")
        if a is None and len(dims) >= -axis and dims[axis] != 1:
            raise Refused("an operand every device holds whole spans the split axis")
    return axis


def along(key: str):
    """An op along its :axis that keeps the rank (a slice, a concat): a split along another
    axis stays where it is, if every operand is split so."""

    def rule(axes, shapes, attrs) -> Optional[int]:
        axis = _one_axis(axes)
        if axis is None:
            return None
        if len(_split(axes)) < len(axes):
            raise Refused("an operand every device holds whole meets split ones")
        at = known(attrs.get(key))
        ranks = {len(s) for s in shapes if s is not None}
        if at is not None and at >= 0 and ranks:
            at -= ranks.pop()
        if at is None or at >= 0 or at == axis:
            raise Refused("it may work along the split axis")
        return axis

    return rule


def transpose(axes, shapes, attrs) -> Optional[int]:
    (axis,) = axes
    if axis is None:
        return None
    perm = [known(p) for p in attrs["perm"]]
    if None in perm:
        raise Refused("its permutation is not a literal")
    rank = len(perm)
    return [p % rank for p in perm].index(axis % rank) - rank


def reshape(axes, shapes, attrs) -> Optional[int]:
    """A reshape of a value split along its last axis that keeps the axes before it (0)
    and writes -1 for it: heads split from the features ([0 0 -1 hd]) or, of one split
    along its heads, merged back ([0 0 -1]). Each device's -1 is its own share of whole
    heads. (The value's rank is the count of 0s and one, as the program calls it.)"""
    (axis,) = axes
    if axis is None:
        return None
    sizes = [known(s) for s in attrs["shape"]]
    if -1 not in sizes or any(s != 0 for s in sizes[: sizes.index(-1)]):
        raise Refused("it does not keep the axes before the split one (0) and write -1")
    k = sizes.index(-1)
    rest = sizes[k + 1 :]
    if axis == -1 and rest and all(s is None or s > 0 for s in rest):
        # the features split into heads, the heads split
        return Heads(k - len(sizes), tuple(attrs["shape"][k + 1 :]))
    if axis == -2 and not rest and (shapes[0] is None or len(shapes[0]) == k + 2):
        return -1  # [..., heads, head] merged into the features
    raise Refused("it does not split the last axis into heads nor merge them back")


def linear(axes, shapes, attrs):
    """F.linear(x, w, bias), w [out, in]: w split by rows (and the bias with it) splits the
    output's features (column-parallel); x split along its features with w by columns
    gives a partial sum (row-parallel)."""
    x, w, *bias = axes
    if x is None and w == -2 and bias in ([], [None], [-1]):
        return -1
    if x == -1 and w == -1 and bias in ([], [None]):
        return PARTIAL
    if not _split(axes):
        return None
    raise Refused("its operands are not split as a row- or column-parallel product")


def attention(axes, shapes, attrs) -> Optional[int]:
    """Per head: Q, K and V split along their head axis [..., H, T, D] (whole heads)."""
    q, k, v, *mask = axes
    if not _split(axes):
        return None
    if (q, k, v) != (-3, -3, -3) or mask not in ([], [None]):
        raise Refused("Q, K and V are not all split along their head axis")
    if mask and (shapes[3] is None or len(shapes[3]) >= 3 and shapes[3][-3] != 1):
        raise Refused("its mask may span the heads")
    return -3
