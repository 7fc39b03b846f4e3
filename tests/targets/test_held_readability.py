"""Held targets (metal, cpu) write the cuda file's statements, differing only in casts and
roundings, and leave out the roundings that cannot change a bf16 value, each pinned against native bf16 bit for bit.
"""

from __future__ import annotations

import ast
import re

import pytest
import torch

from cases import lisp
from conftest import load_module
from sx2torch.compiler import Options, compile_source
from sx2torch.runtime import last_position, round_to_bf16
from sx2torch.runtime.cache import Cache, generating

RESIDUAL = """
(defparam w (normal [16 32] :std 0.1))
(defparam b (normal [32] :std 0.1))
(defparam w2 (normal [32 16] :std 0.1))
(defun forward (x h2)
  (+ x (matmul (gelu (+ (matmul h2 w) b)) w2)))
(defrun train :precision :bf16)
"""


def compiled(source: str, target: str):
    code = compile_source(source, "m.lisp", Options(target=target))
    return load_module(code), code


def statements(code: str) -> list:
    """Each method's statements, as the kinds and the names they assign."""
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.FunctionDef):
            for statement in ast.walk(node):
                if isinstance(statement, ast.stmt):
                    targets = getattr(statement, "targets", [])
                    found.append(
                        (type(statement).__name__, [ast.unparse(t) for t in targets])
                    )
    return found


@pytest.mark.parametrize("target", ["cpu", "metal"])
def test_the_held_file_has_the_cuda_files_statements(target):
    """`(+ x (matmul (gelu (+ (matmul h2 w) b)) w2))` is one statement on every target: the
    held one holds all its roundings, wrapped by black, not split into temporaries."""
    _, code = compiled(RESIDUAL, target)
    _, native = compiled(RESIDUAL, "cuda")
    assert statements(code) == statements(native)
    assert "return sx.store_bf16(" in code


BF16_STORED = """
(defparam wte (normal [8 4]) :dtype :bf16)
(defparam head (normal [4 8] :std 0.1))
(defun forward (ids) (matmul (matmul (take wte ids) head) wte))
(defrun train :precision :bf16)
"""


@pytest.mark.parametrize("target", ["cpu", "metal"])
def test_a_bf16_stored_parameter_is_widened_where_it_is_read(target):
    """The cuda file reads a bf16-stored table as it is; a held one makes it the f32 tensor
    it computes on with `.float()` at each read, not in a statement of its own (`wte_bf16 =
    self.wte.float()`, a name saying bf16 over code saying f32), and gives cuda's bits.
    """
    held, code = compiled(BF16_STORED, target)
    native, cuda = compiled(BF16_STORED, "cuda")
    assert statements(code) == statements(cuda)
    assert code.count("self.wte.float()") == 2
    torch.manual_seed(0)
    a, b = held.M(), native.M()
    b.load_state_dict(a.state_dict())
    ids = torch.tensor([[1, 7, 7], [0, 3, 1]])
    assert torch.equal(a(ids), b(ids).float())


@pytest.mark.parametrize("target", ["cpu", "metal"])
def test_the_split_residual_mlp_gives_cudas_bits(target):
    held, _ = compiled(RESIDUAL, target)
    native, _ = compiled(RESIDUAL, "cuda")
    torch.manual_seed(0)
    a, b = held.M(), native.M()
    b.load_state_dict(a.state_dict())
    x, h2 = torch.randn(4, 16), torch.randn(4, 16)
    assert torch.equal(a(x, h2), b(x, h2).float())


def bf16_values(n: int = 4096) -> torch.Tensor:
    """Every kind of bf16 value: normal, subnormal, zero, large, as f32 tensors."""
    bits = torch.randint(0, 1 << 16, (n,), dtype=torch.int32).to(torch.int16)
    values = bits.view(torch.bfloat16).float()
    finite = values[torch.isfinite(values)]
    return finite[: len(finite) // 2 * 2]  # an even count, for the reshape


SKIPPED = [
    "(- y)",
    "(abs y)",
    "(relu y)",
    "(maximum y (- y))",
    "(minimum y (abs y))",
    "(* y 2.0)",
    "(* y -8.0)",
    "(* 4 y)",
    "(reshape y [-1 2])",
    "(slice y :start 1 :end 5)",
    "(cast (> y 0.0) :bf16)",
    "(* y (cast (> y 0.0) :bf16))",
    "(* (cast (< y 1.0) :bf16) (- y))",
]


@pytest.mark.parametrize("body", SKIPPED)
def test_an_op_that_cannot_change_a_bf16_value_is_not_rounded(body):
    """y holds bf16 values; the op's result on them is a bf16 value already."""
    source = f"(defun forward (x) (let ((y (cast x :bf16))) {body}))\n"
    held, code = compiled(source, "cpu")
    native, _ = compiled(source, "cuda")
    (line,) = [line for line in code.splitlines() if "return" in line]
    assert "round_to_bf16" not in line and "store_bf16" not in line, code
    x = bf16_values()
    assert torch.equal(held.M()(x), native.M()(x).float())


@pytest.mark.parametrize("target", ["cpu", "metal"])
def test_a_mask_multiply_gives_cudas_gradient(target):
    """`(* h (cast (> h 0.0) :bf16))` with h read again: the product by 0s and 1s is not
    rounded, nor its gradient at the product, and x's gradient has cuda's bits."""
    source = (
        "(defun forward (x) (let ((h (cast x :bf16)))"
        " (+ (* h (cast (> h 0.0) :bf16)) (* h h))))\n"
        "(defrun train :precision :bf16)\n"
    )
    held, code = compiled(source, target)
    assert "(h > 0.0).float()" in code and "sx.round_to_bf16((h" not in code, code
    native, _ = compiled(source, "cuda")
    generator = torch.Generator().manual_seed(0)
    x, upstream = (
        torch.randn(512, generator=generator).to(torch.bfloat16).float() for _ in "xg"
    )
    grads = []
    for net, dtype in ((held.M(), torch.float32), (native.M(), torch.bfloat16)):
        leaf = x.clone().requires_grad_()
        net(leaf).backward(upstream.to(dtype))
        grads.append(leaf.grad)
    assert torch.equal(grads[0].view(torch.int32), grads[1].view(torch.int32))


@pytest.mark.parametrize("scale", ["0.5", "3.0", "0.1"])
def test_other_scalings_are_rounded(scale):
    source = f"(defun forward (x) (* (cast x :bf16) {scale}))\n"
    held, code = compiled(source, "cpu")
    assert re.search(r"return sx\.round_to_bf16\(", code), code
    native, _ = compiled(source, "cuda")
    x = bf16_values()
    assert torch.equal(held.M()(x), native.M()(x).float())


@pytest.mark.parametrize("target", ["cpu", "metal"])
def test_the_last_position_of_a_held_value_is_not_rounded(target):
    """A :generate run reads the value its last attention feeds at its last position
    (`sx.last_position`, a slice while generating, else the value): of a held bf16 value, a
    bf16 value already, as plain PyTorch's slice of the bf16 tensor gives it."""
    path = lisp("generate-cache")
    code = compile_source(
        path.read_text(), path.name, Options(run="chat", target=target)
    )
    assert "rms_norm(sx.last_position(x, 1))" in code, code
    x = torch.randn(2, 5, 8)
    with torch.no_grad(), generating(Cache()):
        got = last_position(round_to_bf16(x), 1)
    assert torch.equal(got, x.to(torch.bfloat16).narrow(1, 4, 1).float())
