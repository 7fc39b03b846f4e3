"""bf16_region: a no-op marker that torch.compile traces through."""

import torch

from sx2torch import runtime as sx


def test_is_a_no_op_context_manager() -> None:
    x = torch.arange(4.0)
    with sx.bf16_region():
        y = x * 2
    assert torch.equal(y, x * 2)


def test_torch_compile_without_graph_breaks() -> None:
    def region(x: torch.Tensor) -> torch.Tensor:
        with sx.bf16_region():
            h = sx.round_to_bf16(x * 3)
        return h + 1

    x = torch.randn(8)
    # fullgraph: a graph break is an error, so this is the one graph
    assert torch.equal(torch.compile(region, fullgraph=True)(x), region(x))
