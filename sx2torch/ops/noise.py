"""Random values and dropout, drawn from torch's default generator when the module runs, so
`torch.manual_seed(s)` before a call fixes them: the same seed on the same device gives the
same bits.

A draw is always made in f32 and then rounded where it computes in bf16, on every target:
torch draws other numbers for a bf16 tensor than the rounded f32 ones, so drawing in the
value's dtype would make the cuda module and the held (metal, cpu) ones differ.
"""

import sx2torch.build as b
from sx2torch.ops.rank import SAME, like
from sx2torch.ops.registry import Arg, Op, register

LIKE = Arg("like", "like")


def _draw(torch_name: str):
    """An f32 draw shaped like LIKE on its device, cast down where the node computes in bf16
    on cuda (the held targets round it on store)."""

    def emit(a, ctx):
        value = b.call(torch_name, a[0], dtype=b.dotted("torch.float32"))
        if ctx.tensor_dtype == "torch.bfloat16":
            return b.method(value, "to", b.dotted("torch.bfloat16"))
        return value

    return emit


for _name, _torch, _what in (
    ("randn-like", "torch.randn_like", "standard normal samples"),
    ("rand-like", "torch.rand_like", "uniform samples in [0, 1)"),
):
    register(
        Op(
            _name,
            (LIKE,),
            _draw(_torch),
            rank=like(0, "like"),
            # a draw reads LIKE for its shape alone
            grad=lambda t, n, g: [None],
            draws=True,
            doc=(
                f"{_what} shaped like LIKE, on its device ({_torch}), from torch's default "
                "generator: a VAE's reparameterization, a diffusion model's noise. Drawn in "
                "f32 on every target and rounded once where it computes in bf16 (f32 unless "
                "in a bf16 region); its derivative is zero"
            ),
        )
    )


def _dropout(a, ctx):
    training = b.attr(b.name("self"), "training")
    return b.call("F.dropout", a[0], ctx.attrs["p"], training=training)


register(
    Op(
        "dropout",
        (Arg("x"), Arg("p", "number")),
        _dropout,
        rank=SAME,
        draws=True,
        module_state=True,
        no_grad=(
            "F.dropout keeps no mask for a written-out backward; loss.backward() "
            "differentiates it with its mask"
        ),
        doc=(
            "F.dropout(x, p, training=self.training): in training mode each element is zeroed "
            "with probability P, from torch's default generator, and the others scaled by "
            "1/(1 - P); in eval mode (model.eval()) the identity. On bf16 it computes in f32 "
            "and rounds once on the held targets and on a GPU; torch's CPU kernel for a bf16 "
            "tensor rounds the scale to bf16 first"
        ),
    )
)
