"""What a `(defrun NAME :generate true)` run makes of the ops that see the sequence axis: the
`cached` fields of their registry entries, read by the cache pass (sx2torch/cache.py). Each
gives (the op that keeps or reads the cache, its attrs), a reason the cache cannot hold the
node (the pass reports it at the form), or None where the node stays as it is.
"""

from sx2torch.ops.rank import known

# The sequence axis: axis 1 of the [batch, length] ids a generating forward takes, and of
# the [batch, length, ...] activations made from them, as in transformers' decoders.
SEQUENCE = 1


def attention(attrs: dict, operands: tuple, made: tuple):
    """A causal attention keeps its keys and values; a non-causal one, or one given a mask
    (which covers this chunk's keys only), cannot be cached."""
    # a sliding window is causal (flash-attn's window_size=(W, 0))
    if attrs["window"] is None and known(attrs["causal"]) is not True:
        return "is not causal (:causal true): each position sees later ones"
    if len(operands) == 4:
        return "has a mask, which covers this chunk's keys, not the cache's"
    return "cached-attention", {k: v for k, v in attrs.items() if k != "causal"}


def positions(cached_op: str):
    """Positions over the sequence axis start where the cache ends."""

    def test(attrs: dict, operands: tuple, made: tuple):
        if known(attrs["axis"]) == SEQUENCE:
            return cached_op, attrs
        return None

    return test


def size(attrs: dict, operands: tuple, made: tuple):
    """The sequence's size, where a const or key may choose the axis too: a cached step
    sees one position of it."""
    if known(attrs["axis"]) in (SEQUENCE, None):
        return "uses the sequence's size as a value, which a cached step does not see"
    return None


def product(attrs: dict, operands: tuple, made: tuple):
    """A product of two activations may mix positions (attention written out)."""
    if made[0] and made[1]:
        return (
            "multiplies two values made from the input, which may mix positions; "
            "write it as (attention ... :causal true)"
        )
    return None
