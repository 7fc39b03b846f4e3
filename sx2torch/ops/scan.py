"""Linear recurrences (sexpgpu/nn): `linear-scan` and `matrix-scan`.

Each is one call of a log-depth parallel scan in the runtime (sx2torch/runtime/scan.py).
Both carry the library's f32 mark (6.8): under :bf16 their inputs are read up
into f32 and their output stays f32 until it meets a bf16 value.
"""

import sx2torch.build as b
import sx2torch.ops.sequence as sequence
from sx2torch.ops.registry import Arg, Key, Op, register
from sx2torch.ops.rank import BROADCAST, MATRIX_SCAN, OUTER, SAME, like

TIME_AXIS = Key("axis", "int", 1)


def _scan(runtime_name: str):
    return lambda a, ctx: b.call(runtime_name, a[0], a[1], dim=ctx.attrs["axis"])


def _scan_grad(adjoint: str, product: str):
    """db_t = l_t, the adjoint scan run backwards (l_t = g_t + A_{t+1}^T l_{t+1});
    dA_t = l_t h_{t-1}, elementwise for linear-scan, an outer product for matrix-scan.
    """

    def grad(t, n, g):
        a, b_ = n.inputs
        axis = n.attrs["axis"]
        later = t.op(adjoint, [a, g], axis=axis)
        da = t.op(product, [later, t.op("previous", [n], axis=axis)])
        return [t.op("sum-to", [da, a]), t.op("sum-to", [later, b_])]

    return grad


for _name, _runtime in (
    ("linear-scan-adjoint", "sx.linear_scan_adjoint"),
    ("matrix-scan-adjoint", "sx.matrix_scan_adjoint"),
):
    register(
        Op(
            _name,
            (Arg("a"), Arg("g")),
            _scan(_runtime),
            keys=(TIME_AXIS,),
            # the matrix scan's runtime multiplies matrices (a GEMM)
            autocasts=_name == "matrix-scan-adjoint",
            rank=like(1, "g"),
            doc="a scan run backwards",
            internal=True,
        )
    )
register(
    Op(
        "previous",
        (Arg("h"),),
        lambda a, ctx: b.call("sx.previous", a[0], dim=ctx.attrs["axis"]),
        keys=(TIME_AXIS,),
        result="keep",
        mixes=True,
        exact=True,
        rank=SAME,
        no_grad="no derivative rule yet",
        doc="h_{t-1} along :axis, h_{-1} = 0",
    )
)
register(
    Op(
        "outer",
        (Arg("x"), Arg("y")),
        lambda a, ctx: b.binop(
            b.method(a[0], "unsqueeze", b.number(-1)),
            "*",
            b.method(a[1], "unsqueeze", b.number(-2)),
        ),
        rank=OUTER,
        no_grad="no derivative rule yet",
        doc="the outer product of the last axes: [..., n] and [..., m] -> [..., n, m]",
    )
)


register(
    Op(
        "linear-scan",
        (Arg("a"), Arg("b")),
        _scan("sx.linear_scan"),
        keys=(TIME_AXIS,),
        sensitive=True,
        mixes=True,
        # along the sequence, its last value carried in a :generate run's cache
        cached=sequence.scan("linear-scan", "cached-linear-scan"),
        grad=_scan_grad("linear-scan-adjoint", "*"),
        rank=BROADCAST,
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
        mixes=True,
        grad=_scan_grad("matrix-scan-adjoint", "outer"),
        autocasts=True,
        rank=MATRIX_SCAN,
        doc=(
            "h_t = A_t h_{t-1} + b_t along :axis, h_{-1} = 0; A [..., n, n], B [..., n], "
            "their batch axes broadcast and :axis counts those (negative: from the last batch axis)"
        ),
    )
)
