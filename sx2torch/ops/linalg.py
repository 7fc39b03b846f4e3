"""Linear algebra: the batched, broadcasting matmul, and its f32-out form (6.4)."""

from sx2torch.emit import build as b
from sx2torch.ops import Arg, Key, Op, register


def _matmul(a, ctx):
    if ctx.attrs["out"] == "f32" and ctx.compute == "bf16":
        return b.call("sx.matmul_f32_out", a[0], a[1])
    return b.binop(a[0], "@", a[1])


register(
    Op(
        "matmul",
        (Arg("a"), Arg("b")),
        _matmul,
        keys=(Key("out", "out"),),
        doc="`:out :f32` on bf16 operands keeps the bf16 GEMM and stores its f32 accumulator",
    )
)
