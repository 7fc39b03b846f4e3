"""`@sx.saves_bf16` above a held target's method that rounds a value, and nowhere else: not
on a held method that only reshapes or slices held values, not on the cuda target."""

from __future__ import annotations

import re

from cases import lisp
from sx2torch.compiler import Options, compile_source


def decorated(target: str) -> dict:
    """Each method of examples/llama.lisp's `train` module -> whether it is decorated."""
    path = lisp("llama")
    code = compile_source(
        path.read_text(), path.name, Options(run="train", target=target)
    )
    found: dict = {}
    for part in re.split(r"\nclass ", code)[1:]:
        owner = part.split("(")[0]
        for match in re.finditer(r"\n((?:    @[\w.]+\n)*)    def (\w+)\(", part):
            found[f"{owner}.{match[2]}"] = match[1].strip() == "@sx.saves_bf16"
    return found


def test_a_held_method_that_rounds_saves_in_bf16():
    for target in ("cpu", "metal"):
        methods = decorated(target)
        assert methods["LinearLayer.forward"]  # its weight, its result
        assert methods["LlamaRmsNorm.forward"]
        assert methods["LlamaAttention.apply_rotary_pos_emb"]  # its stores
        assert not methods["LlamaAttention.split_heads"]  # a reshape and a permute
        assert not methods["LlamaAttention.rotate_half"]  # slices, a negation, a concat
        assert not methods["Llama.forward"]  # calls only
        assert not any(name.endswith("__init__") and d for name, d in methods.items())


def test_the_cuda_target_writes_no_decorator():
    methods = decorated("cuda")
    assert "LinearLayer.forward" in methods and not any(methods.values())
