"""What a `(defrun NAME :generate true)` run makes of the ops that see the sequence axis: the
`cached` and `sequence` fields of their registry entries, read by the cache pass
(sx2torch/cache.py).

The pass follows the sequence through the graphs as shapes: the ids forward takes are
`[batch, LENGTH]`, and the ops' rank rules carry that size to the axis each value holds the
positions on (through `swap-axes`, `transpose`, broadcasts, calls). An axis of size LENGTH is
*aligned*: its index i is the chunk's i-th position after the cache, so a cached step computes
the chunk's part of it. A `cached` rule sees the node (`Seen`) and gives (the op that keeps or
reads the cache, its attrs), (its own op and attrs) where it stays as it is because it does not
mix positions, a reason the cache cannot hold it (the pass reports it at the form), or None
where the pass's general checks decide. A `sequence` rule gives the output's shape where the
op keeps an aligned axis that its rank rule cannot see (a causal convolution's, a slice to the
sequence's length).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sx2torch.ir import Scalar
from sx2torch.ops.rank import known

# The sequence axis: axis 1 of the [batch, length] ids a generating forward takes, and of
# the [batch, length, ...] activations made from them, as in transformers' decoders.
SEQUENCE = 1
# The sequence's length in the cache pass's shapes: no source writes a size this large, so
# an axis of this size holds the positions.
LENGTH = 2**61 - 1
# The cached keys' length: an axis of a product that holds every position stored and the
# chunk's (the scores of attention written out, [..., LENGTH, KEYS]); OPEN until a causal
# mask covers it, so that no position is combined with keys that come after it.
KEYS = 2**61 - 2
OPEN_KEYS = 2**61 - 3
MARKS = (LENGTH, KEYS, OPEN_KEYS)


@dataclass(frozen=True)
class Seen:
    """A node as the cache pass sees it: its attrs, its operands' shapes (None unknown; an
    axis of size LENGTH aligned), whether each operand is made from the input, and the keys
    of its attrs that are the sequence's length (a `size` of an aligned axis)."""

    attrs: dict
    shapes: tuple
    made: tuple
    lengths: frozenset = frozenset()

    def aligned(self, k: int) -> Optional[int]:
        """Operand k's aligned axis, from 0; None where it has none or it is unknown."""
        dims = self.shapes[k]
        if dims is None or list(dims).count(LENGTH) != 1:
            return None
        return list(dims).index(LENGTH)

    def axis(self, k: int, key: str) -> Optional[int]:
        """The attr `key` as an axis of operand k, from 0, where both are known."""
        axis, dims = known(self.attrs[key]), self.shapes[k]
        if axis is None or dims is None or not -len(dims) <= axis < len(dims):
            return None
        return axis % len(dims)


def attention(seen: Seen):
    """A causal attention keeps its keys and values; a non-causal one, or one given a mask
    (which covers this chunk's keys only), cannot be cached."""
    attrs = seen.attrs
    # a sliding window is causal (flash-attn's window_size=(W, 0))
    if attrs["window"] is None and known(attrs["causal"]) is not True:
        return "is not causal (:causal true): each position sees later ones"
    if len(seen.shapes) == 4:
        return "has a mask, which covers this chunk's keys, not the cache's"
    return "cached-attention", {k: v for k, v in attrs.items() if k != "causal"}


def positions(cached_op: str):
    """Positions over the sequence axis start where the cache ends: over the aligned axis
    of a value made from the input (axis 1 of the ids, axis 2 of [batch, heads, length,
    dim]). Over another axis of one (the heads), or any axis of a value not made from the
    input (a parameter's), they are the plain op's; of a value whose axes are not known,
    axis 1 is taken for the sequence's, as the ids hold it."""

    def test(seen: Seen):
        axis, aligned = seen.axis(0, "axis"), seen.aligned(0)
        if not seen.made[0]:
            return None
        if axis is not None and aligned is not None:
            return (cached_op, seen.attrs) if axis == aligned else None
        if seen.shapes[0] is not None and LENGTH not in seen.shapes[0]:
            return None
        if known(seen.attrs["axis"]) == SEQUENCE:
            return cached_op, seen.attrs
        return None

    return test


def size(seen: Seen):
    """The sequence's size: a cached step sees one chunk of it. Of an aligned axis it is the
    chunk's length, which a slice to it reads rightly (the pass checks its readers); of an
    unknown axis, or an axis 1 whose size is unknown, a diagnostic; of an axis of a known
    size, another than the sequence's, a number like any."""
    axis = seen.axis(0, "axis")
    sized = None if axis is None else seen.shapes[0][axis]
    if sized == LENGTH:
        return "size", seen.attrs
    if sized is None and known(seen.attrs["axis"]) in (SEQUENCE, None):
        return "uses the sequence's size as a value, which a cached step does not see"
    return None


def product(seen: Seen):
    """A product of two activations may mix positions. Both holding the positions on the
    same batch axis, it mixes none (Mamba's states read by C, position by position). The
    chunk's queries on A's rows times keys that hold the positions on one of B's last two
    axes is attention written out: B's positions are kept in the cache (`cached-matmul`),
    Kᵀ's along its last axis, V's along its rows, read by scores a causal mask covers.
    """
    if not (seen.made[0] and seen.made[1]):
        return None
    a, b = seen.aligned(0), seen.aligned(1)
    ranks = [len(dims) for dims in seen.shapes if dims is not None]
    if a is not None and len(set(ranks)) == 1 and a == b and a < ranks[0] - 2:
        return "matmul", seen.attrs
    if len(ranks) == 2 and a == ranks[0] - 2 and b is not None and b >= ranks[1] - 2:
        keys = b - ranks[1]
        # a mask decided when the module runs (an `if` of a flag) is checked then
        if keys == -2 and seen.shapes[0][-1] not in (KEYS, None):
            return (
                "reads values at every position with weights no causal mask covers: "
                "mask the scores with (causal-mask ...) before the softmax"
            )
        if seen.attrs["out"] is not None:
            return (
                "keeps the keys of an :out :f32 product, which the cache does not hold"
            )
        return "cached-matmul", {"keys": Scalar.lit(keys)}
    return (
        "multiplies two values made from the input, which may mix positions; "
        "write it as (attention ... :causal true)"
    )


def causal_mask(seen: Seen):
    """A causal mask over scores [..., LENGTH, keys] keeps, in a cached step, the keys up to
    each of the chunk's queries' own position: aligned bottom-right over every key stored
    and the chunk's, as the whole sequence's mask keeps them over keys that are not the
    sequence's (an encoder's, in a cross-attention whose flag asks for no mask)."""
    dims = seen.shapes[0]
    if not seen.made[0]:
        return None
    if dims is not None and len(dims) >= 2 and dims[-2] == LENGTH != dims[-1]:
        return "cached-causal-mask", seen.attrs
    if dims is None or any(d in MARKS for d in dims[-2:]):
        return (
            "masks values whose queries and keys it cannot tell apart: a cached step "
            "has the chunk's queries and every key stored"
        )
    return None


def masked(seen: Seen, dims):
    """The scores a causal mask covers: their keys are those each query may see."""
    if dims is not None and dims[-1:] == (OPEN_KEYS,):
        return dims[:-1] + (KEYS,)
    return dims


def open_keys(seen: Seen, axes: Optional[tuple]) -> bool:
    """Whether an op that combines values along `axes` of its operands (every axis: None)
    combines keys no causal mask covers yet: a cached step has only the keys up to the
    chunk's, where the whole sequence's forward had every key."""
    for dims in seen.shapes:
        if dims is None or OPEN_KEYS not in dims:
            continue
        at = dims.index(OPEN_KEYS)
        if axes is None or any(known(a) in (at, at - len(dims)) for a in axes):
            return True
    return False


def slice_(seen: Seen):
    """A slice along the aligned axis keeps the positions only from the first to the
    sequence's length (a causal convolution's outputs trimmed to its input's): in a cached
    step that is the chunk's part; any other bound would take other positions."""
    axis = seen.axis(0, "axis")
    if axis is None or axis != seen.aligned(0):
        return None
    if _to_length(seen):
        return "slice", seen.attrs
    return (
        "slices the sequence, whose positions a cached step sees from the cache's end on; "
        "only (slice x :end (size x ...)) from 0 keeps them"
    )


def _to_length(seen: Seen) -> bool:
    attrs = seen.attrs
    whole = attrs["end"] is None or "end" in seen.lengths
    return known(attrs["start"]) == 0 and known(attrs["step"]) == 1 and whole


def sliced(seen: Seen, dims):
    """A slice to the sequence's length keeps the aligned axis."""
    axis = seen.axis(0, "axis")
    if dims is None or axis is None or axis != seen.aligned(0) or not _to_length(seen):
        return dims
    return dims[:axis] + (LENGTH,) + dims[axis + 1 :]


def convolution(seen: Seen):
    """A conv1d along the aligned axis (its last) keeps its last inputs in the cache, which
    the convolution must be causal to use (checked when it runs: its padding depends on the
    kernel's size, which the constructor may change); along the batch axis it mixes
    nothing; along the channels, or an unknown axis, positions mix."""
    if not seen.made[0]:
        return None
    axis, dims = seen.aligned(0), seen.shapes[0]
    if axis is not None and axis == len(dims) - 1:
        return "cached-conv1d", seen.attrs
    if axis == 0 and len(dims) == 3:
        return "conv1d", seen.attrs
    return "convolves along an axis that may be the sequence's"


def convolved(seen: Seen, dims):
    """A cached convolution's outputs: the chunk's positions, then those of its padding."""
    if dims is None or seen.aligned(0) != len(dims) - 1:
        return dims
    return dims[:-1] + (LENGTH,)


def scan(op: str, cached_op: str):
    """A scan along the aligned axis carries its last value in the cache; along another
    axis it mixes no positions (an unknown one is the pass's general check)."""

    def test(seen: Seen):
        axes = {seen.aligned(k) for k in range(len(seen.shapes)) if seen.made[k]}
        ranks = {len(d) for d in seen.shapes if d is not None}
        axis = seen.axis(0, "axis") if len(ranks) == 1 else None
        if axis is None or None in axes:
            return None
        if axes == {axis}:
            return cached_op, seen.attrs
        if axis not in axes:
            return op, seen.attrs
        return None

    return test


def moved(verb: str, axes):
    """An op that moves values along its axes (`axes(seen, k)`: operand k's, from 0 where
    its rank is known, counted from the end where not, None where a const or &key argument
    decides one) puts the chunk's values at other positions than the cache's where one is
    the sequence's: a concat puts its other values before or after each chunk, a pad shifts
    the chunk, a roll brings its last positions round to its first. Along the aligned axis
    of an operand made from the input, or an axis that may be it, the cache cannot hold it;
    along others it mixes no positions (the last of a value of unknown rank is taken for
    another than the sequence's, as `mixes` takes it)."""

    def test(seen: Seen):
        for k, dims in enumerate(seen.shapes):
            if not seen.made[k] or (dims is not None and LENGTH not in dims):
                continue  # holds no positions
            along, aligned = axes(seen, k), seen.aligned(k)
            if dims is None and along == {-1}:
                continue
            if along is None or aligned is None:
                return f"{verb} along an axis that may be the sequence's"
            if aligned in along:
                return (
                    f"{verb} along the sequence, whose positions a cached step sees "
                    "from the cache's end on"
                )
        return None

    return test


def one_axis(seen: Seen, k: int) -> Optional[set]:
    """The :axis of concat or roll; roll without one moves the flattened elements, along
    every axis."""
    dims, axis = seen.shapes[k], known(seen.attrs["axis"])
    if seen.attrs["axis"] is None:
        return None if dims is None else set(range(len(dims)))
    if axis is None or dims is None:
        return {axis} if axis is not None and axis < 0 else None
    return {axis % len(dims)} if -len(dims) <= axis < len(dims) else None


def padded(seen: Seen, k: int) -> set:
    """The axes F.pad changes: the pair i of PADDING is axis -1 - i's, unless both of the
    pair are 0 (an amount a const or &key argument decides may be any)."""
    dims, pads = seen.shapes[k], [known(p) for p in seen.attrs["padding"]]
    pairs = zip(pads[0::2], pads[1::2])
    axes = {-1 - i for i, pair in enumerate(pairs) if pair != (0, 0)}
    return axes if dims is None else {a % len(dims) for a in axes}


def spatial(verb: str, axes: Optional[int], channels: bool):
    """An op over the last `axes` axes of [N, C, ...] (or unbatched [C, ...]; None: every
    axis after [N, C]): a pooling, an interpolation, a transposed or 2-d convolution. Along those axes it mixes positions,
    and along the channels too where `channels` (a convolution sums over them); along the
    batch it mixes none."""

    def test(seen: Seen):
        dims = seen.shapes[0]
        if not seen.made[0] or (dims is not None and LENGTH not in dims):
            return None
        aligned = seen.aligned(0)
        if aligned is None:
            return f"{verb} along an axis that may be the sequence's"
        # the first spatial axis; the channels' before it
        first = 2 if axes is None else len(dims) - axes
        if aligned < first - 1 or (aligned == first - 1 and not channels):
            return None
        return f"{verb} along the sequence, whose positions a cached step sees one chunk of"

    return test


def broadcast(seen: Seen):
    """An elementwise op that broadcasts the positions against a fixed size (a table of the
    training length added whole): a cached step's chunk broadcasts against all of it, so
    each position would get the whole table's values. The chunk's positions against the
    cached keys' (a bias made from the chunk's positions alone added to the scores) give
    each query the bias of other keys."""
    known_dims = [dims for dims in seen.shapes if dims is not None]
    for at in range(-1, -max(map(len, known_dims), default=0) - 1, -1):
        sizes = {dims[at] for dims in known_dims if -at <= len(dims)} - {None, 1}
        if len(sizes & set(MARKS)) > 1:
            return (
                "combines the chunk's positions with the cached keys': take the keys' "
                "positions from the scores' last axis"
            )
    for dims in seen.shapes:
        if dims is None or list(dims).count(LENGTH) != 1:
            continue
        at = list(dims).index(LENGTH) - len(dims)  # counted from the end, as torch does
        for other in seen.shapes:
            if (
                other is not None
                and -at <= len(other)
                and other[at] not in (None, 1, *MARKS)
            ):
                return (
                    f"broadcasts the sequence against a fixed size, {other[at]}, which a "
                    "cached step's chunk does not have"
                )
    return None
