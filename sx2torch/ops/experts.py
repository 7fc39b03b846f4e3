"""A mixture of experts' sparse layer, computing only the experts the router chose."""

import sx2torch.build as b
from sx2torch.ops.rank import SAME
from sx2torch.ops.registry import Arg, Op, register


def _sparse_experts_call(a, ctx):
    """On metal and cpu a bf16 layer's operands are bf16 values held in f32: `held=True`
    rounds each of its ops, as cuda's bf16 tensors do."""
    held = ctx.target != "cuda" and ctx.compute == "bf16"
    return b.call("sx.sparse_experts", *a, **({"held": b.name("True")} if held else {}))


register(
    Op(
        "sparse-experts",
        (
            Arg("x"),
            Arg("index", "ids"),
            Arg("weights", "as-is"),
            Arg("gate-up", "matrix"),
            Arg("down", "matrix"),
        ),
        _sparse_experts_call,
        no_grad=(
            "how many tokens each expert takes is known only when the module runs; "
            "loss.backward() differentiates it"
        ),
        autocasts=True,
        rank=SAME,
        doc=(
            "each row of X [T H] through the K experts INDEX [T K] names, weighted by "
            "WEIGHTS [T K] (read in their own dtype, the router's f32) and summed: "
            "transformers' MixtralExperts, `sx.sparse_experts`, a loop over the experts "
            "chosen, each on its tokens alone (`x[token]`), the gated SiLU MLP of "
            "GATE-UP [E 2I H] and DOWN [E H I], added back with `index_add_`; in the "
            "compute dtype, each linear rounding once, the weighted result rounded to "
            "X's dtype before the sum, which rounds each addition (atomic on a GPU); "
            "torch.compile(fullgraph=True) cannot trace its data-dependent loop"
        ),
    )
)
