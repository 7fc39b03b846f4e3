"""Linear recurrences (sexpgpu/nn): `linear-scan` and `matrix-scan`.

Each is one call of a log-depth parallel scan in the runtime (sx2torch/runtime/scan.py).
Both carry the library's f32 mark (6.8): under :bf16 their inputs are read up
into f32 and their output stays f32 until it meets a bf16 value.
"""

from sx2torch.emit import build as b
from sx2torch.ops import Arg, Key, Op, register

TIME_AXIS = Key("axis", "int", 1)


def _scan(runtime_name: str):
    return lambda a, ctx: b.call(runtime_name, a[0], a[1], dim=ctx.attrs["axis"])


register(
    Op(
        "linear-scan",
        (Arg("a"), Arg("b")),
        _scan("sx.linear_scan"),
        keys=(TIME_AXIS,),
        sensitive=True,
        doc="h_t = a_t * h_{t-1} + b_t along :axis, h_{-1} = 0; A and B broadcast",
    )
)
register(
    Op(
        "matrix-scan",
        (Arg("a"), Arg("b")),
        _scan("sx.matrix_scan"),
        keys=(TIME_AXIS,),
        sensitive=True,
        doc=(
            "h_t = A_t h_{t-1} + b_t along :axis, h_{-1} = 0; A [..., n, n], B [..., n], "
            "their batch axes broadcast and :axis counts those (negative: from the last batch axis)"
        ),
    )
)
