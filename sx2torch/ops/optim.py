"""sexpgpu/optim: `newton-schulz`, the orthogonalization of Muon.

It iterates in bf16 under either precision and returns f32 (6.8): the
iteration is a bf16 region around one runtime call, and its result is cast up.
Whether to transpose depends on the matrix's shape, known only when the
module runs, so the iteration itself lives in the runtime
(sx2torch/runtime/optim.py) rather than in generated ops.
"""

import sx2torch.build as b
from sx2torch.ops.registry import Arg, Key, Op, register
from sx2torch.ops.rank import SAME

STEPS = Key("steps", "int", 5)


def _newton_schulz(t, args, attrs):
    (g,) = args
    with t.library_region():
        orthogonal = t.op("newton-schulz-bf16", [g], steps=attrs["steps"])
    return t.cast(orthogonal, "f32")


def _newton_schulz_call(a, ctx):
    held = {} if ctx.target == "cuda" else {"held": b.name("True")}
    return b.call("sx.newton_schulz", a[0], steps=ctx.attrs["steps"], **held)


register(
    Op(
        "newton-schulz-bf16",
        (Arg("g"),),
        _newton_schulz_call,
        keys=(STEPS,),
        autocasts=True,
        rank=SAME,
        exact=True,
        doc="the iteration of newton-schulz, in bf16, returning its input's dtype",
        internal=True,
    )
)
register(
    Op(
        "newton-schulz",
        (Arg("g"),),
        expand=_newton_schulz,
        keys=(STEPS,),
        autocasts=True,
        rank=SAME,
        doc=(
            "Muon's quintic Newton-Schulz iteration, (a, b, c) = (3.4445, -4.7750, 2.0315), "
            "on G / (|G|_F + 1e-7), transposed when taller than wide; bf16 iteration, f32 result"
        ),
    )
)
