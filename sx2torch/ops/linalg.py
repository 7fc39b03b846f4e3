"""Linear algebra: the batched, broadcasting matmul, and its f32-out form (6.4)."""

import sx2torch.build as b
from sx2torch.ir import DType, Node, Scalar
import sx2torch.ops.sequence as sequence
from sx2torch.ops.registry import Arg, Key, Op, register
from sx2torch.ops.rank import MATMUL


def _matmul(a, ctx):
    """On metal and cpu the operands are bf16 values held in f32: `held=True` takes their f32
    GEMM as the f32-out product and rounds the backward GEMMs as bf16 GEMMs store them.
    """
    if ctx.attrs["out"] == "f32" and ctx.compute == "bf16":
        held = {} if ctx.target == "cuda" else {"held": b.name("True")}
        return b.call("sx.matmul_f32_out", a[0], a[1], **held)
    return b.binop(a[0], "@", a[1])


def _matmul_grad(t, n, g):
    """dA = g Bᵀ and dB = Aᵀ g (operands of rank 2 or more), summed over broadcast batch axes."""
    a, b_ = n.inputs
    last = (Scalar.lit(-1), Scalar.lit(-2))
    da = t.op("matmul", [g, t.op("swap-axes", [b_], a=last[0], b=last[1])])
    db = t.op("matmul", [t.op("swap-axes", [a], a=last[0], b=last[1]), g])
    return [t.sum_back(da, n, 0, batch=True), t.sum_back(db, n, 1, batch=True)]


def _matmul_ones(inputs, shape):
    """Ones of (matmul x w) for a matrix w, from the operands' shapes (matmul-ones)."""
    x, w = inputs
    matrix = isinstance(w, Node) and shape(w) is not None and len(shape(w)) == 2
    return ("matmul-ones", [x, w]) if matrix and isinstance(x, Node) else None


register(
    Op(
        "matmul",
        (Arg("a", "matrix"), Arg("b", "matrix")),
        _matmul,
        keys=(Key("out", "out"),),
        out_dtype=lambda attrs: DType.F32 if attrs["out"] == "f32" else None,
        grad=_matmul_grad,
        ones_from=_matmul_ones,
        autocasts=True,
        rank=MATMUL,
        cached=sequence.product,
        doc="`:out :f32` on bf16 operands keeps the bf16 GEMM and stores its f32 accumulator",
    )
)
