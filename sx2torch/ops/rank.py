"""Rank rules: each op's output shape from its inputs' shapes, as far as they are known.

A shape is None where even the rank is unknown (a defun's argument), else a tuple with
one entry per axis: the size where it is a literal in the source, else None (a size
written with a const is not known: the constructor can change it). A rule sees the
shapes of the node's inputs (a compile-time number has shape ()) and the node's
attrs; it raises ShapeError only for a mismatch that no value of the unknowns fixes.

A rule that says `tails` also sees a `Tail` for a shape of unknown rank whose last sizes
are known, as `(matmul x w)` has w's last size whatever x's rank (None is then `Tail(())`),
so that a mismatch further down a chain of ops is found too; other rules see None there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

from sx2torch.syntax.scalars import Scalar, ScalarOp

Dims = Optional[tuple]


def rank_of(operand) -> Optional[int]:
    """An operand's rank where the ranks pass found it (a node's `shape`), else None."""
    shape = getattr(operand, "shape", None)
    dims = getattr(shape, "dims", None)
    return len(dims) if isinstance(dims, tuple) else None


class ShapeError(Exception):
    """A provable shape mismatch; the message is the diagnostic's."""


@dataclass(frozen=True)
class RankRule:
    doc: str  # the rank column of docs/OPS.md
    shape: Callable  # (input shapes, attrs) -> output shape
    tails: bool = False  # reads and gives a Tail where a rank is unknown


@dataclass(frozen=True)
class Tail:
    """A shape of unknown rank: its last axes' sizes (None where unknown), the rest unknown."""

    sizes: tuple


UNKNOWN = Tail(())  # a shape of which nothing is known, one for every such value


def tail(sizes: tuple) -> Optional[Tail]:
    """A Tail of these last sizes; None where none is known."""
    return Tail(sizes) if sizes else None


# a reshape's `...`: the input's axes but the last (sx2torch/trace/arguments.py makes it)
ELLIPSIS = Scalar.lit("...")


def known(scalar) -> Optional[int]:
    """A size or axis written as a literal; None where a const or &key argument decides it.
    (An op's definition may pass a plain Python value: the compiler wrote it.)"""
    if isinstance(scalar, Scalar):
        return scalar.value if scalar.op is ScalarOp.LIT else None
    return scalar


def value(attr):
    """An attribute's value at compile time, consts at their defaults: what the emission uses."""
    return attr.value if isinstance(attr, Scalar) else attr


def shown(dims) -> str:
    if isinstance(dims, Tail):
        return "[..." + "".join(f" {shown_size(d)}" for d in dims.sizes) + "]"
    return "[" + " ".join(map(shown_size, dims)) + "]"


def shown_size(size: Optional[int]) -> str:
    return "?" if size is None else str(size)


def _sizes(dims) -> tuple:
    return dims.sizes if isinstance(dims, Tail) else dims


def broadcast(*shapes) -> tuple:
    """torch's broadcast: an axis is its one size other than 1, if any is known. Of a Tail,
    a Tail: an axis before a Tail's known ones may be any size."""
    each = [_sizes(s) for s in shapes]  # found once, not per axis
    rank = max(map(len, each)) if each else 0
    out = []
    for axis in range(-1, -rank - 1, -1):  # from the last axis, as torch reports
        sizes = [
            own[axis] if -axis <= len(own) else (None if isinstance(s, Tail) else 1)
            for own, s in zip(each, shapes)
        ]
        fixed = [(size, s) for size, s in zip(sizes, shapes) if size not in (None, 1)]
        for size, s in fixed[1:]:
            if size != fixed[0][0]:
                raise ShapeError(
                    f"the shapes {shown(fixed[0][1])} and {shown(s)} do not broadcast: "
                    f"{fixed[0][0]} against {size} on axis {axis}"
                )
        out.append(fixed[0][0] if fixed else (1 if None not in sizes else None))
    if any(isinstance(s, Tail) for s in shapes):
        return tail(tuple(reversed(out)))
    return tuple(reversed(out))


def _axis(scalar, rank: int) -> Optional[int]:
    """A literal axis in range, counted from 0; None otherwise."""
    axis = known(scalar)
    return axis % rank if axis is not None and -rank <= axis < rank else None


def _same(shapes, attrs):
    return shapes[0]


def _broadcast(shapes, attrs):
    # `is`, not `in`: a Tail's equality is a dataclass's, a Python call per shape
    if any(s is None for s in shapes):
        return None
    # nothing known of any (an argument's rank unknown, and all it reaches): nor of theirs
    return None if all(s is UNKNOWN for s in shapes) else broadcast(*shapes)


def _reduced(shapes, attrs):
    (x,) = shapes
    axes, keepdims = attrs["axes"], value(attrs["keepdims"])
    if not axes:  # torch reduces over every axis for `dim=()` too
        if not keepdims:
            return ()
        return None if x is None else (1,) * len(x)
    if x is None:
        return None
    if not x:  # torch reduces a 0-d tensor over axis 0 or -1 to itself
        return ()
    rank = len(x)
    if len(axes) > rank:
        return None
    dropped = [_axis(a, rank) for a in axes]
    if None in dropped:
        kept = rank if keepdims else rank - len(axes)
        return (None,) * kept
    if len(set(dropped)) < len(dropped):
        return None  # torch rejects a repeated axis
    if keepdims:
        return tuple(1 if i in dropped else d for i, d in enumerate(x))
    return tuple(d for i, d in enumerate(x) if i not in dropped)


def _scalar(shapes, attrs):
    return ()


def product(a: tuple, b: tuple) -> Optional[tuple]:
    """torch.matmul's shape: a vector operand gains an axis that the result drops."""
    _with_axes(a, b)
    if not a or not b:
        return None
    inner = b[-2] if len(b) > 1 else b[0]
    if a[-1] is not None and inner is not None and a[-1] != inner:
        raise ShapeError(
            f"matmul of {shown(a)} and {shown(b)}: the inner sizes differ ({a[-1]} against {inner})"
        )
    rows = a[:-1][-1:]
    cols = b[-1:] if len(b) > 1 else ()
    return broadcast(a[:-2], b[:-2]) + rows + cols


def _with_axes(*operands) -> None:
    """torch refuses a 0-d operand of a matrix product when the module runs: say so when
    it compiles."""
    if () in operands:
        raise ShapeError(
            "a matrix product of a 0-d value (an element, a full reduction or a parameter "
            "of shape []): each operand needs an axis to multiply along; scale with * instead"
        )


def _matmul(shapes, attrs):
    a, b = shapes
    if isinstance(a, Tail) or isinstance(b, Tail):
        return _product_of_unknown_rank(a, b)
    return product(a, b)


def _product_of_unknown_rank(a, b) -> Optional[Tail]:
    """torch.matmul's shape where an operand's rank is unknown: the inner sizes are checked
    where both are known, and the result keeps the last sizes that are certain."""
    _with_axes(a, b)
    x, y = _sizes(a), _sizes(b)
    matrix = len(y) >= 2  # B is at least 2-D: of a Tail, only two known sizes say so
    vector = not isinstance(b, Tail) and len(y) == 1
    inner = y[-2] if matrix else (y[0] if vector else None)
    if x and x[-1] is not None and inner is not None and x[-1] != inner:
        raise ShapeError(
            f"matmul of {shown(a)} and {shown(b)}: the inner sizes differ ({x[-1]} against {inner})"
        )
    if vector:
        return tail(x[:-1])
    rows = x[-2:-1]  # A's rows, where A is surely at least 2-D
    return tail(rows + y[-1:]) if matrix else None


def _reshape(shapes, attrs):
    """A literal positive size is known; 0 keeps the input's size there; -1 is inferred;
    a first `...` keeps the input's axes but the last. A 0 that cannot be what a torch
    reader takes it for is refused: one past X's axes (x.shape[i] would raise), one beside
    `...`, and one after another size where the reshape changes the rank, whose position
    then names another axis of X than the one it stands in for (`[1 0 0 0 -1]` meant as an
    unsqueeze)."""
    (x,) = shapes
    shape = attrs["shape"]
    values = [known(s) for s in shape]
    if shape and shape[0] == ELLIPSIS:
        if 0 in values:
            raise ShapeError(
                "reshape's 0 keeps X's size at its position, which `...` leaves "
                "unknown: write the size"
            )
        rest = tuple(None if v is None or v < 0 else v for v in values[1:])
        return x[:-1] + rest if isinstance(x, tuple) else tail(rest)
    if isinstance(x, Tail):
        x = None
    for i, size in enumerate(values):
        if size != 0 or x is None:
            continue
        if i >= len(x):
            raise ShapeError(
                f"reshape's 0 at position {i} keeps X's size there, but X has "
                f"{len(x)} axes"
            )
        if len(shape) != len(x) and any(v != 0 for v in values[:i]):
            raise ShapeError(
                f"reshape's 0 at position {i} keeps X's axis {i} (unlike torch's 0), but "
                f"the sizes before it make the rank {len(shape)} from X's {len(x)}, so "
                "it is not that axis's place: write the size, or use unsqueeze, "
                "flatten or `...`"
            )
    sizes = [
        (x[i] if x is not None else None) if v == 0 else v for i, v in enumerate(values)
    ]
    inferred = [i for i, size in enumerate(sizes) if size is not None and size < 0]
    rest = [size for size in sizes if size is None or size >= 0]
    if len(inferred) == 1 and x and None not in x and None not in rest:
        whole, other = math.prod(x), math.prod(rest)
        if other and whole % other == 0:  # else torch refuses it; left unknown here
            sizes[inferred[0]] = whole // other
    return tuple(size if size is None or size >= 0 else None for size in sizes)


def _concat(shapes, attrs):
    ranks = [s for s in shapes if s is not None]
    if not ranks:
        return None
    rank = len(ranks[0])
    axis = _axis(attrs["axis"], rank)
    if axis is None or any(len(s) != rank for s in ranks):
        return (None,) * rank
    out = []
    for i in range(rank):
        sizes = [s[i] for s in shapes if s is not None]
        if i == axis:
            whole = len(ranks) == len(shapes) and None not in sizes
            out.append(sum(sizes) if whole else None)
        else:
            out.append(next((d for d in sizes if d is not None), None))
    return tuple(out)


def like(index: int, arg: str) -> RankRule:
    """The shape of input `index`, the argument named `arg`."""
    return RankRule(f"as {arg.upper()}", lambda shapes, attrs: shapes[index])


def _transpose(shapes, attrs):
    (x,) = shapes
    perm = attrs["perm"]
    if isinstance(x, Tail) and len(x.sizes) <= len(perm):  # PERM says the rank
        x = (None,) * (len(perm) - len(x.sizes)) + x.sizes
    too_many = isinstance(x, Tail) and len(x.sizes) > len(perm)
    if too_many or isinstance(x, tuple) and len(x) != len(perm):
        raise ShapeError(
            f"transpose of {shown(x)} by a permutation of {len(perm)} axes: "
            "PERM names each of X's axes once"
        )
    if not isinstance(x, tuple):
        return (None,) * len(perm)
    axes = [_axis(p, len(x)) for p in perm]
    literal = [known(p) for p in perm]
    if None not in literal and (None in axes or len(set(axes)) < len(axes)):
        raise ShapeError(
            f"transpose of {shown(x)} by [{' '.join(map(str, literal))}]: "
            "PERM names each of X's axes once"
        )
    return tuple(None if a is None else x[a] for a in axes)


def _swap_axes(shapes, attrs):
    (x,) = shapes
    if isinstance(x, Tail):
        return _swap_last_axes(x, attrs)
    a, b = (_axis(attrs[k], len(x)) for k in ("a", "b"))
    if a is None or b is None:
        return (None,) * len(x)
    swapped = list(x)
    swapped[a], swapped[b] = x[b], x[a]
    return tuple(swapped)


def _swap_last_axes(x: Tail, attrs) -> Optional[Tail]:
    """Of a Tail, a swap of two of its known axes, counted from the end."""
    a, b = (known(attrs[k]) for k in ("a", "b"))
    rank = len(x.sizes)
    if a is None or b is None or not (-rank <= a < 0 and -rank <= b < 0):
        return None
    swapped = list(x.sizes)
    swapped[a], swapped[b] = x.sizes[b], x.sizes[a]
    return Tail(tuple(swapped))


def _slice(shapes, attrs):
    (x,) = shapes
    step = known(attrs.get("step", 1))
    if step is not None and step < 1:
        raise ShapeError(f"slice :step {step}: torch's step is positive")
    if x is None or not x:
        return x
    axis = _axis(attrs["axis"], len(x))
    if axis is None:
        return (None,) * len(x)
    start, end = known(attrs["start"]), known(attrs["end"])
    bounded = attrs["end"] is None or end is not None
    size = x[axis]
    if size is not None and None not in (start, step) and bounded:
        size = len(range(size)[start:end:step])
    else:
        size = None
    return x[:axis] + (size,) + x[axis + 1 :]


def axis_in(op: str, key: str, scalar, rank: int, extra: int = 0) -> Optional[int]:
    """A literal axis of a value of known `rank` (+ `extra`: unsqueeze's new place), counted
    from 0; a diagnostic where it is out of range, as torch's IndexError would be when the
    module runs; None where a const decides it."""
    axis, span = known(scalar), max(rank + extra, 1)  # torch wraps a 0-d's as a 1-d's
    if axis is None:
        return None
    if not -span <= axis < span:
        raise ShapeError(
            f"{op} {key} {axis} is out of range for a value of rank {rank} "
            f"(axes {-span} to {span - 1})"
        )
    return axis % span


def _stack(shapes, attrs):
    """Equal shapes where known, a new axis of the count at :axis (-1: after the last)."""
    known_shapes = [x for x in shapes if x is not None]
    if not known_shapes:
        return None
    if any(len(x) != len(known_shapes[0]) for x in known_shapes):
        raise ShapeError(
            "stack of "
            + " and ".join(shown(x) for x in known_shapes)
            + ": torch stacks tensors of one shape"
        )
    sizes = [
        next((x[i] for x in known_shapes if x[i] is not None), None)
        for i in range(len(known_shapes[0]))
    ]
    for x in known_shapes:
        if any(None not in (a, b) and a != b for a, b in zip(x, sizes)):
            raise ShapeError(
                f"stack of {shown(x)} beside {shown(tuple(sizes))}: torch stacks tensors "
                "of one shape"
            )
    axis = axis_in("stack", ":axis", attrs["axis"], len(sizes), extra=1)
    if axis is None:
        return None
    return tuple(sizes[:axis]) + (len(shapes),) + tuple(sizes[axis:])


def _pad(shapes, attrs):
    """F.pad's constant mode: PADDING is (left, right) of the last axis, then of the one
    before, ...; each padded axis grows by both (a negative one trims)."""
    (x,) = shapes
    pads = [known(p) for p in attrs["padding"]]
    if len(pads) % 2:
        raise ShapeError(
            f"pad of {len(pads)} numbers: torch's padding is a (left, right) pair per axis"
        )
    if x is None:
        return None
    if len(pads) > 2 * len(x):
        raise ShapeError(
            f"pad of {len(pads) // 2} axes of a value of rank {len(x)} ({shown(x)})"
        )
    out = list(x)
    for i in range(len(pads) // 2):
        axis, left, right = len(x) - 1 - i, pads[2 * i], pads[2 * i + 1]
        grown = None if None in (out[axis], left, right) else out[axis] + left + right
        if grown is not None and grown < 0:
            raise ShapeError(f"pad of {shown(x)} trims axis {axis} below nothing")
        out[axis] = grown
    return tuple(out)


def needs(op: str, attrs, key: str) -> None:
    """A key without a default that torch's call cannot do without."""
    if attrs[key] is None:
        raise ShapeError(f"{op} needs :{key}")


def _unsqueeze(shapes, attrs):
    (x,) = shapes
    needs("unsqueeze", attrs, "axis")
    if x is None:
        return None
    axis = axis_in("unsqueeze", ":axis", attrs["axis"], len(x), extra=1)
    if axis is None:
        return None
    return x[:axis] + (1,) + x[axis:]


def _squeeze(shapes, attrs):
    """torch keeps an axis whose size is not 1: where the size is unknown, so is the rank."""
    (x,) = shapes
    if x is None:
        return None
    if attrs["axis"] is None:
        return None if None in x else tuple(d for d in x if d != 1)
    axis = axis_in("squeeze", ":axis", attrs["axis"], len(x))
    if axis is None or not x or x[axis] is None:
        return None
    if x[axis] != 1:
        raise ShapeError(
            f"squeeze :axis {known(attrs['axis'])} of {shown(x)}: that axis has size "
            f"{x[axis]}, not 1 (torch would keep it)"
        )
    return x[:axis] + x[axis + 1 :]


def _flatten(shapes, attrs):
    (x,) = shapes
    if x is None:
        return None
    if not x:  # torch flattens a 0-d tensor to one element
        return (1,)
    start = axis_in("flatten", ":start", attrs["start"], len(x))
    end = axis_in("flatten", ":end", attrs["end"], len(x))
    if start is None or end is None:
        return None
    if start > end:
        raise ShapeError(
            f"flatten of {shown(x)}: :start {known(attrs['start'])} comes after "
            f":end {known(attrs['end'])}"
        )
    merged = x[start : end + 1]
    size = None if None in merged else math.prod(merged)
    return x[:start] + (size,) + x[end + 1 :]


def _repeat_interleave(shapes, attrs):
    (x,) = shapes
    needs("repeat-interleave", attrs, "repeats")
    repeats = known(attrs["repeats"])
    if repeats is not None and repeats < 0:
        raise ShapeError(f"repeat-interleave :repeats {repeats} is negative")
    if x is None:
        return None if attrs["axis"] is not None else (None,)
    if attrs["axis"] is None:  # torch repeats the flattened elements
        whole = None if None in x or repeats is None else math.prod(x) * repeats
        return (whole,)
    axis = axis_in("repeat-interleave", ":axis", attrs["axis"], len(x))
    if axis is None:
        return (None,) * len(x)
    size = None if x[axis] is None or repeats is None else x[axis] * repeats
    return x[:axis] + (size,) + x[axis + 1 :]


def _roll(shapes, attrs):
    (x,) = shapes
    if x is not None and attrs["axis"] is not None:
        axis_in("roll", ":axis", attrs["axis"], len(x))
    return x


def _group_norm(shapes, attrs):
    """X [N, C, ...] as it is; C divisible by GROUPS, WEIGHT and BIAS of shape [C]."""
    x, affine = shapes[0], shapes[1:]
    groups = known(attrs["groups"])
    if groups is not None and groups < 1:
        raise ShapeError(f"group-norm of {groups} groups: there must be at least one")
    if x is None:
        return None
    if len(x) < 2:
        raise ShapeError(
            f"group-norm of {shown(x)}: X is [N, C, ...], batched with channels"
        )
    channels = x[1]
    if None not in (channels, groups) and channels % groups:
        raise ShapeError(
            f"group-norm of {shown(x)}: its {channels} channels are not divisible "
            f"into {groups} groups"
        )
    for name, shape in zip(("WEIGHT", "BIAS"), affine):
        if shape is not None and (
            len(shape) != 1 or None not in (shape[0], channels) and shape[0] != channels
        ):
            raise ShapeError(
                f"group-norm of {shown(x)}: its {name} is {shown(shape)}, not "
                f"[{shown_size(channels)}], one per channel"
            )
    return x


def _len(shapes, attrs):
    (x,) = shapes
    if x is not None and not x:
        raise ShapeError("len of a 0-d value: it has no first axis")
    return ()


def _at(shapes, attrs):
    (x,) = shapes
    if x is None:
        return None
    if not x:
        raise ShapeError(
            "at of a 0-d value (an element, a full reduction or a parameter of shape []): "
            "it has no axis to index"
        )
    index, size = known(attrs["i"]), x[0]
    if index is not None and size is not None and not -size <= index < size:
        raise ShapeError(
            f"index {index} is out of range for the first axis of {shown(x)} (size {size})"
        )
    return x[1:]


def _take(shapes, attrs):
    table, ids = shapes
    if attrs.get("padding-idx") is not None and isinstance(table, tuple):
        _padding_row(table, known(attrs["padding-idx"]))
    return None if table is None or ids is None else ids + table[1:]


def _padding_row(table: tuple, row: Optional[int]) -> None:
    """torch's embedding takes a matrix, and a padding_idx among its rows."""
    if len(table) != 2:
        raise ShapeError(
            f"take with :padding-idx reads a table of rows, [rows width], as torch's "
            f"embedding does: got {shown(table)}"
        )
    problem = outside_rows(row, table[0])
    if problem:
        raise ShapeError(problem)


def outside_rows(row, rows) -> str:
    """Why `row` is not one of a table's `rows` (torch's padding_idx: from -rows to rows
    - 1), or "" where it is one, or where either is not known when the file compiles."""
    if not isinstance(row, int) or not isinstance(rows, int) or -rows <= row < rows:
        return ""
    return (
        f":padding-idx {row} is out of range for {rows} rows "
        f"(from {-rows} to {rows - 1})"
    )


def _one_hot(shapes, attrs):
    (ids,) = shapes
    return None if ids is None else ids + (known(attrs["n"]),)


def _outer(shapes, attrs):
    x, y = shapes
    if not x or not y:
        return None
    return broadcast(x[:-1], y[:-1]) + (x[-1], y[-1])


def _matrix_scan(shapes, attrs):
    a, b = shapes
    if a is None or b is None or len(a) < 2 or not b:
        return None
    return broadcast(a[:-2], b[:-1]) + (b[-1],)


def _attention(shapes, attrs):
    q, k, v = shapes[:3]  # a mask broadcasts against the scores
    _with_axes(q, k, v)
    for name, dims in zip("QKV", (q, k, v)):
        if dims is not None and len(dims) < 2:  # torch refuses it when the module runs
            raise ShapeError(
                f"attention's {name} is {shown(dims)}: each of Q, K and V needs at least "
                "two axes, [..., T, D]"
            )
    if q is None or k is None or v is None or len(k) < 2:
        return None
    gqa = known(attrs.get("enable-gqa", False)) is not False
    if gqa and len(q) >= 3 and len(k) == len(v) >= 3:
        # K and V may have fewer heads than Q (a divisor of its count): the output has Q's
        k, v = q[:-3] + (None,) + k[-2:], q[:-3] + (None,) + v[-2:]
    scores = product(q, k[:-2] + (k[-1], k[-2]))
    return None if scores is None else product(scores, v)


def _concat_part(shapes, attrs):
    parts, index = shapes[1:], known(attrs["index"])
    return (
        parts[index]
        if index is not None and -len(parts) <= index < len(parts)
        else None
    )


SAME = RankRule("same as the first input", _same, tails=True)
BROADCAST = RankRule("broadcast of the inputs", _broadcast, tails=True)
REDUCED = RankRule("drops :axes (all by default) unless :keepdims", _reduced)
SCALAR = RankRule("0", _scalar)
MATMUL = RankRule("torch.matmul's: batch axes broadcast", _matmul, tails=True)
RESHAPE = RankRule(
    "the length of SHAPE (a first `...`: X's less 1, plus the rest)",
    _reshape,
    tails=True,
)
CONCAT = RankRule("the inputs' rank", _concat)
TRANSPOSE = RankRule("the length of PERM", _transpose, tails=True)
SWAP_AXES = RankRule("same as X", _swap_axes, tails=True)
SLICE = RankRule("same as X", _slice)
AT = RankRule("X's - 1", _at)
LEN = RankRule("0", _len)
TAKE = RankRule("IDS's + TABLE's - 1", _take)
ONE_HOT = RankRule("IDS's + 1", _one_hot)
OUTER = RankRule("broadcast of the leading axes + 2", _outer)
MATRIX_SCAN = RankRule("broadcast of the batch axes + 1", _matrix_scan)
ATTENTION = RankRule("broadcast of the batch axes + 2", _attention)
CONCAT_PART = RankRule("as the part :index", _concat_part)
UNSQUEEZE = RankRule("X's + 1", _unsqueeze)
SQUEEZE = RankRule("X's - 1 (without :axis: less each size-1 axis)", _squeeze)
FLATTEN = RankRule("X's - (:end - :start)", _flatten)
REPEAT_INTERLEAVE = RankRule("same as X (without :axis: 1)", _repeat_interleave)
ROLL = RankRule("same as X", _roll)
STACK = RankRule("the inputs' + 1", _stack)
PAD = RankRule("same as X", _pad)
GROUP_NORM = RankRule("same as X", _group_norm)
