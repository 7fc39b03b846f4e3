"""A mixture of experts' sparse layer, computing only the experts the router chose."""

from sx2torch.emit import build as b
from sx2torch.ops.rank import SAME
from sx2torch.ops.registry import Arg, Op, register

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
        lambda a, ctx: b.call("sx.sparse_experts", *a),
        no_grad=(
            "how many tokens each expert takes is known only when the module runs; "
            "loss.backward() differentiates it"
        ),
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
