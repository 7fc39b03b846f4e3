"""sexpgpu/nn: normalizations and the numerically sensitive functions (6.8)."""

import sx2torch.build as b
from sx2torch.ir import Scalar
import sx2torch.ops.sequence as sequence
from sx2torch.ops.registry import Arg, Key, Op, along, register
from sx2torch.ops.rank import (
    ATTENTION,
    GROUP_NORM,
    REDUCED,
    SAME,
    RankRule,
    known,
    like,
)
from sx2torch.ops.reduce import dims

X = Arg("x")
LAST_AXIS = Key("axis", "int", -1)


TRUE = Scalar.lit(True)


def _softmax(torch_name: str):
    return lambda a, ctx: b.call(torch_name, a[0], dim=ctx.attrs["axis"])


def _along(t, n, value):
    """The sum of `value` along the op's axis, kept for broadcasting."""
    return t.op("sum", [value], axes=(n.attrs["axis"],), keepdims=TRUE)


def _softmax_grad(t, n, g):
    """dx = y * (g - sum(g * y))."""
    return [t.op("*", [n, t.op("-", [g, _along(t, n, t.op("*", [g, n]))])])]


def _log_softmax_grad(t, n, g):
    """dx = g - exp(y) * sum(g)."""
    return [t.op("-", [g, t.op("*", [t.op("exp", [n]), _along(t, n, g)])])]


register(
    Op(
        "softmax",
        (X,),
        _softmax("torch.softmax"),
        keys=(LAST_AXIS, Key("dtype", "kernel-dtype")),
        sensitive=lambda attrs: attrs["dtype"] != "input",
        mixes=along("axis"),
        grad=_softmax_grad,
        rank=SAME,
        doc=(
            "torch.softmax along :axis. :dtype :f32 (the default) computes it in an f32 "
            "island, X read in f32 and the result f32, as torch's softmax(x, "
            "dtype=torch.float32) (transformers' eager attention); :dtype :input is "
            "torch's kernel on X in the dtype it computes in, bf16 under :bf16 (a bf16 "
            "model's F.softmax(x), f32 inside and rounded once; the held targets round "
            "the f32 kernel's value), its derivative's ops in that dtype"
        ),
    )
)
register(
    Op(
        "log-softmax",
        (X,),
        _softmax("torch.log_softmax"),
        keys=(LAST_AXIS,),
        sensitive=True,
        mixes=along("axis"),
        grad=_log_softmax_grad,
        rank=SAME,
    )
)


def _logsumexp(a, ctx):
    axes = ctx.attrs["axes"]
    dim = (
        b.call("tuple", b.call("range", b.method(a[0], "dim")))
        if axes is None
        else dims(axes)
    )
    extra = {"keepdim": b.number(True)} if ctx.values["keepdims"] else {}
    return b.call("torch.logsumexp", a[0], dim=dim, **extra)


def _logsumexp_grad(t, n, g):
    """dx = g * exp(x - y), with g and y broadcast back over the reduced axes."""
    x = n.inputs[0]

    def spread(value):
        return t.op(
            "expand-reduced",
            [value, x],
            axes=n.attrs["axes"],
            keepdims=n.attrs["keepdims"],
        )

    return [t.op("*", [spread(g), t.op("exp", [t.op("-", [x, spread(n)])])])]


register(
    Op(
        "logsumexp",
        (X,),
        _logsumexp,
        keys=(
            Key("axes", "ints", static=True),
            Key("keepdims", "bool", False, static=True),
        ),
        sensitive=True,
        name_inputs=True,
        grad=_logsumexp_grad,
        rank=REDUCED,
        mixes=along("axes"),
    )
)
REDUCTION = Key("reduction", "reduction")
CROSS_ENTROPY = RankRule(
    "0; as LABELS with :reduction :none",
    lambda shapes, attrs: shapes[1] if attrs["reduction"] == "none" else (),
)


def _reduction(ctx) -> dict:
    """`reduction="sum"` or `"none"`; the mean is the default and is not written."""
    chosen = ctx.attrs["reduction"]
    return {} if chosen in (None, "mean") else {"reduction": b.string(chosen)}


register(
    Op(
        "cross-entropy",
        (Arg("logits", names=True), Arg("labels", "ids", names=True)),
        lambda a, ctx: b.call("F.cross_entropy", a[0], a[1], **_reduction(ctx)),
        keys=(REDUCTION,),
        sensitive=True,
        grad=lambda t, n, g: [
            t.op("cross-entropy-backward", [g, *n.inputs], **n.attrs),
            None,
        ],
        rank=CROSS_ENTROPY,
        doc=(
            "integer labels; :reduction :mean over rows (the default), :sum, or :none "
            "(one loss per row)"
        ),
    )
)
register(
    Op(
        "cross-entropy-backward",
        (Arg("g"), Arg("logits"), Arg("labels", "ids")),
        lambda a, ctx: b.call("sx.cross_entropy_backward", *a, **_reduction(ctx)),
        keys=(REDUCTION,),
        rank=like(1, "logits"),
        doc="(softmax(logits) - one_hot(labels)) * g, divided by the rows for :mean",
        internal=True,
    )
)
register(
    Op(
        "softcap",
        (X, Arg("cap", "number")),
        lambda a, ctx: b.binop(
            ctx.attrs["cap"],
            "*",
            b.call("torch.tanh", b.binop(a[0], "/", ctx.attrs["cap"])),
        ),
        sensitive=True,
        grad=lambda t, n, g: [
            t.op(
                "*",
                [
                    g,
                    t.op(
                        "-",
                        [
                            Scalar.lit(1.0),
                            t.op("square", [t.op("/", [n, n.attrs["cap"]])]),
                        ],
                    ),
                ],
            )
        ],
        rank=SAME,
        doc="cap * tanh(x / cap)",
    )
)


def _rms_norm(t, args, attrs):
    """The seed's definition: only the mean of squares and its rsqrt are sensitive."""
    (x,) = args
    with t.library_island():
        mean_square = t.op(
            "mean", [t.op("*", [x, x])], axes=(Scalar.lit(-1),), keepdims=True
        )
        inverse_rms = t.op("rsqrt", [t.op("+", [mean_square, attrs["eps"]])])
    return t.op("*", [x, inverse_rms])


def _normalize(axes):
    """Statistics in an f32 island; centring and scaling outside it."""

    def expand(t, args, attrs):
        (x,) = args
        along = axes if axes is not None else attrs["axes"]
        with t.library_island():
            mean = t.op("mean", [x], axes=along, keepdims=True)
            var = t.op(
                "mean",
                [t.op("square", [t.op("-", [x, mean])])],
                axes=along,
                keepdims=True,
            )
            inverse_std = t.op("rsqrt", [t.op("+", [var, attrs["eps"]])])
        return t.op("*", [t.op("-", [x, mean]), inverse_std])

    return expand


EPS_6 = Key("eps", "number", 1e-6)
EPS_5 = Key("eps", "number", 1e-5)
register(
    Op("rms-norm", (X,), expand=_rms_norm, keys=(EPS_6,), rank=SAME, doc="no gain")
)
register(
    Op(
        "layer-norm",
        (X,),
        expand=_normalize((Scalar.lit(-1),)),
        keys=(EPS_5,),
        rank=SAME,
        doc="no affine",
    )
)
register(
    Op(
        "batch-norm",
        (X,),
        expand=_normalize(None),
        keys=(Key("axes", "ints", (0,)), EPS_5),
        rank=SAME,
        doc="batch statistics",
    )
)


def _group_norm(a, ctx):
    x, *affine = a
    eps = {"eps": ctx.attrs["eps"]} if ctx.values["eps"] != 1e-5 else {}
    return b.call("F.group_norm", x, ctx.attrs["groups"], *affine, **eps)


def _group_norm_grad(t, n, g):
    """torch's backward of F.group_norm for X, WEIGHT and BIAS (sx.group_norm_backward):
    in the f32 island the forward is in, so it is f32 too."""
    x, weight = n.inputs[0], n.inputs[1:2]
    keys = {"groups": n.attrs["groups"], "eps": n.attrs["eps"]}
    return [
        t.op("group-norm-backward", [g, x, *weight], part=Scalar.lit(part), **keys)
        for part in range(len(n.inputs))
    ]


def _group_norm_backward(a, ctx):
    g, x, *weight = a
    part = ctx.values["part"]
    eps = {"eps": ctx.attrs["eps"]} if ctx.values["eps"] != 1e-5 else {}
    return b.call(
        "sx.group_norm_backward",
        g,
        x,
        ctx.attrs["groups"],
        *weight,
        **eps,
        **({"part": b.number(part)} if part else {}),
    )


register(
    Op(
        "group-norm",
        (X, Arg("groups", "int"), Arg("weight"), Arg("bias")),
        _group_norm,
        keys=(EPS_5,),
        arity=(2, 4),
        sensitive=True,
        grad=_group_norm_grad,
        rank=GROUP_NORM,
        mixes=True,
        doc=(
            "F.group_norm of X [N, C, ...]: the C channels in GROUPS groups, each "
            "normalized by its mean and variance over its channels and the other axes, "
            "times WEIGHT [C] and plus BIAS [C] if given; :eps defaults to torch's 1e-5. "
            "One call in an f32 island, as bf16 autocast runs group_norm (its output f32 "
            "until it meets a bf16 value)"
        ),
    )
)
register(
    Op(
        "group-norm-backward",
        (Arg("g"), X, Arg("weight")),
        _group_norm_backward,
        keys=(Key("groups", "int"), EPS_5, Key("part", "int", 0)),
        arity=(2, 3),
        rank=RankRule(
            "as X (:part 0), as WEIGHT (1, 2)",
            lambda shapes, attrs: (
                shapes[1]
                if known(attrs["part"]) == 0 or shapes[1] is None
                else shapes[1][1:2]
            ),
        ),
        doc="group-norm's gradient with respect to X, WEIGHT or BIAS (:part 0, 1, 2): "
        "torch.autograd's of F.group_norm",
        internal=True,
    )
)


def _causal_mask(a, ctx):
    fill = ctx.attrs["fill"]
    extra = {} if fill is None else {"fill": fill}
    return b.call("sx.causal_mask", a[0], **extra)


def _causal_mask_grad(t, n, g):
    """The masked entries are constants: no gradient flows through them."""
    return [t.op("causal-mask", [g], fill=Scalar.lit(0.0))]


register(
    Op(
        "causal-mask",
        (X,),
        _causal_mask,
        keys=(Key("fill", "number"),),
        exact=True,
        grad=_causal_mask_grad,
        rank=SAME,
        cached=sequence.causal_mask,
        doc=(
            "X with the entries above the diagonal of its last two axes set to :fill "
            "(default -inf): row i keeps columns j <= i"
        ),
    )
)


def _attention_scale(a, ctx):
    last_dim = b.subscript(b.attr(a[1], "shape"), b.number(-1))
    return b.binop(a[0], "*", b.binop(last_dim, "**", b.number(-0.5)))


register(
    Op(
        "attention-scale",
        (Arg("scores"), Arg("q", "like")),
        _attention_scale,
        grad=lambda t, n, g: [t.op("attention-scale", [g, n.inputs[1]]), None],
        rank=SAME,
        doc="scores / sqrt(d), d the last dim of Q (read from its shape when the module runs)",
    )
)


def _eager_attention(t, args, attrs):
    """transformers' eager_attention_forward, op for op: the scores a matmul (rounded under
    :bf16), times :scale (rounded), plus MASK (rounded), a softmax in an f32 island (its
    `dtype=torch.float32`), read back down by the matmul with V (its `.to(query.dtype)`).
    """
    q, k, v, *mask = args
    keys_t = t.op("swap-axes", [k], a=Scalar.lit(-2), b=Scalar.lit(-1))
    scores = t.op("matmul", [q, keys_t], out=None)
    scale = attrs["scale"]
    if scale is None:
        scores = t.op("attention-scale", [scores, q])
    else:
        scores = t.op("*", [scores, scale])
    if mask:
        scores = t.op("+", [scores, mask[0]])
    with t.library_island():
        weights = t.op("softmax", [scores], axis=Scalar.lit(-1))
    scores.name, weights.name = "scores", "weights"  # locals of the generated method
    return t.op("matmul", [weights, v], out=None)


register(
    Op(
        "eager-attention",
        (Arg("q"), Arg("k"), Arg("v"), Arg("mask")),
        expand=_eager_attention,
        keys=(Key("scale", "number"),),
        arity=(3, 4),
        rank=ATTENTION,
        doc="transformers' eager attention, softmax(Q Kᵀ :scale + MASK) V over the last two "
        "axes (:scale default 1/sqrt(d), d = Q's last dim; MASK additive, broadcast "
        "against the scores): under :bf16 the scores rounded, scaled and masked in bf16, "
        "the softmax in f32 and rounded once, as every decoder port writes it by hand",
    )
)


def _causal_attention(t, args, attrs):
    """The explicit composition: the matmuls and the 1/sqrt(d) follow the policy,
    the mask and the softmax are an f32 island (6.8). Under :bf16 the scores are
    rounded to bf16 once by their matmul and once by the scale (exactly when d is
    a power of 4), then read up into f32."""
    q, k, v = args
    keys_t = t.op("swap-axes", [k], a=Scalar.lit(-2), b=Scalar.lit(-1))
    scores = t.op("attention-scale", [t.op("matmul", [q, keys_t], out=None), q])
    with t.library_island():
        weights = t.op("softmax", [t.op("causal-mask", [scores])], axis=Scalar.lit(-1))
    scores.name, weights.name = "scores", "weights"  # locals of the generated method
    return t.op("matmul", [weights, v], out=None)


register(
    Op(
        "causal-attention",
        (Arg("q"), Arg("k"), Arg("v")),
        expand=_causal_attention,
        rank=ATTENTION,
        doc="softmax(Q Kᵀ / sqrt(d) + causal mask) V over the last two axes, d = Q's last dim",
    )
)
