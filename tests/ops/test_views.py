"""The views (unsqueeze, squeeze, flatten, repeat-interleave, roll, slice's :step): torch's
calls, rounding nowhere under :bf16, their gradients the interpreter's bit for bit,."""

from __future__ import annotations

import pytest
import torch

from sx2torch import interpret
from sx2torch.compiler import Options, compile_source
from sx2torch.errors import SourceError

VIEWS = """
(defparam w (normal [4 4]))
(defun forward (x)
  (let ((h (reshape (matmul x w) [2 3 4])))
    (+ (flatten (unsqueeze (squeeze (unsqueeze h :axis 1) :axis 1) :axis 0) :start 0 :end 1)
       (repeat-interleave (slice h :axis -1 :start 1 :step 2) :repeats 2 :axis -1)
       (roll h :shifts 1 :axis 1))))
(defun grad (x)
  (let ((h (reshape (matmul x w) [2 3 4])))
    (gradient (sum (* (+ (flatten (unsqueeze h :axis 0) :start 0 :end 1)
                         (repeat-interleave (slice h :axis -1 :step 2) :repeats 2 :axis -1)
                         (roll h :shifts -1 :axis 1))
                      h))
              w)))
(defrun train :precision :bf16)
"""


def _reference(x, w):
    h = (x.bfloat16() @ w.bfloat16()).reshape(2, 3, 4)
    return (
        h.unsqueeze(1).squeeze(1).unsqueeze(0).flatten(0, 1)
        + h[..., 1::2].repeat_interleave(2, dim=-1)
        + torch.roll(h, 1, 1)
    )


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_views_round_nowhere_and_their_gradients_are_the_interpreters(build, target):
    module, code = build(VIEWS, target=target)
    forward = code.split("def forward")[1].split("def grad")[0]
    for view in ("unsqueeze(", "squeeze(", "flatten(", "repeat_interleave(", "roll("):
        # no rounding is written around a view on a held target
        assert f"store_bf16(h.{view}" not in forward and view in forward
    model = module.Model()
    torch.manual_seed(0)
    x = torch.randn(6, 4)
    got = model(x)
    assert torch.equal(got.float(), _reference(x, model.w.detach()).float())
    interpreted = interpret.load(VIEWS, state={"w": model.w.detach()})
    want = interpreted.evaluate("grad", [x], rounded_once=True)
    assert want.dtype == torch.bfloat16
    assert torch.equal(model.grad(x).float(), want.float())


ELLIPSIS = """
(defparam w (normal [4 6]))
(defun forward (x)
  (let ((h (matmul x w)))
    [(reshape h [... -1 2]) (reshape h [... 3 -1])]))
(defun grad (x) (gradient (sum (* (reshape (matmul x w) [... -1 2]) 2.0)) w))
(defrun train :precision :f32)
"""


def test_a_reshape_led_by_an_ellipsis_keeps_every_axis_but_the_last(build):
    module, code = build(ELLIPSIS)
    assert "h.reshape(*h.shape[:-1], -1, 2)" in code
    model = module.Model()
    interpreted = interpret.load(ELLIPSIS, state={"w": model.w.detach()})
    for x in (torch.randn(5, 4), torch.randn(2, 3, 4)):  # any rank
        h = x @ model.w.detach()
        pairs, thirds = model(x)
        assert torch.equal(pairs, h.unflatten(-1, (-1, 2)))
        assert torch.equal(thirds, h.unflatten(-1, (3, -1)))
        for got, want in zip(model(x), interpreted.evaluate("forward", [x])):
            assert torch.equal(got, want)
        w = model.w.detach().clone().requires_grad_()
        (x @ w).unflatten(-1, (-1, 2)).mul(2.0).sum().backward()
        torch.testing.assert_close(model.grad(x), w.grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "shape, message",
    [
        # meant as an unsqueeze: ONNX's 0 keeps X's axis 1 at place 1, which the new
        # leading axis has shifted
        (
            "[1 0 0 -1]",
            "reshape's 0 at position 1 keeps X's axis 1 (unlike torch's 0), but the sizes "
            "before it make the rank 4 from X's 3, so it is not that axis's place: write "
            "the size, or use unsqueeze, flatten or `...`",
        ),
        (
            "[0 0 0 0 -1]",
            "reshape's 0 at position 3 keeps X's size there, but X has 3 axes",
        ),
        (
            "[... 0 2]",
            "reshape's 0 keeps X's size at its position, which `...` leaves unknown: "
            "write the size",
        ),
    ],
)
def test_a_reshape_zero_a_torch_reader_would_misread_is_a_diagnostic(shape, message):
    source = (
        f"(defparam q (normal [2 3 4]))\n(defun forward ()\n  (reshape q {shape}))\n"
    )
    with pytest.raises(SourceError) as raised:
        compile_source(source, "model.lisp", Options())
    span = raised.value.span
    assert (span.line, span.col, raised.value.message) == (3, 3, message)


def test_an_ellipsis_elsewhere_is_located():
    source = "(defun forward (x)\n  (reshape x [2 ... 2]))\n"
    with pytest.raises(SourceError) as raised:
        compile_source(source, "model.lisp", Options())
    assert (raised.value.span.line, raised.value.span.col) == (2, 17)
    assert raised.value.message.startswith("`...` stands only first")


UNSQUEEZED = """
(defun heads (g)
  [(reshape g [0 0 -1 1]) (reshape g [0 0 0 1 1]) (reshape g [0 0 4 1])])
(defun forward (x)
  (let (([one two checked] (heads (reshape x [0 0 -1])))) [one two checked]))
(defrun train :precision :f32)
"""


def test_a_reshape_that_only_appends_ones_is_written_unsqueeze(build):
    """[0 0 -1 1] of a value of rank 3 (as `forward` passes it) keeps its axes and appends
    one: exactly `unsqueeze(-1)`; [0 0 4 1] stays a reshape, whose size 4 torch checks, and
    [0 0 0 1 1] the reshape it reads as."""
    module, code = build(UNSQUEEZED)
    assert "g.unsqueeze(-1)," in code
    assert "g.reshape(g.shape[0], g.shape[1], g.shape[2], 1, 1)," in code
    assert "g.reshape(g.shape[0], g.shape[1], 4, 1)" in code
    g = torch.randn(2, 3, 4)
    one, two, checked = module.Model()(g.reshape(2, 3, 2, 2))
    assert torch.equal(one, g.reshape(2, 3, 4, 1))
    assert torch.equal(two, g.reshape(2, 3, 4, 1, 1))
    assert torch.equal(checked, g.reshape(2, 3, 4, 1))
    with pytest.raises(RuntimeError):
        module.Model()(torch.randn(2, 3, 5, 1))


CONTIGUOUS = """
(defun split-heads (x) (swap-axes x 1 2))
(defun forward (q k)
  (matmul (contiguous (split-heads q))
          (swap-axes (contiguous (split-heads k)) -1 -2)))
(defun grad (q k) (gradient (sum (* (forward q k) (forward q k))) q))
(defrun exact :precision :f32)
"""


def test_contiguous_lays_out_a_products_operands_as_the_real_code_does(build):
    """transformers' Whisper makes its queries and keys contiguous before q @ kᵀ; torch's
    f32 product of a permuted view sums in another order (here it differs in the last
    bits), so only `.contiguous()` gives its bits. The interpreter's gradient is the
    module's."""
    module, code = build(CONTIGUOUS)
    assert code.split("def forward")[1].split("def grad")[0].count(".contiguous()") == 2
    torch.manual_seed(0)
    q, k = torch.randn(2, 10, 4, 6), torch.randn(2, 10, 4, 6)
    got = module.Model()(q, k)
    want = q.transpose(1, 2).contiguous() @ k.transpose(1, 2).contiguous().transpose(
        2, 3
    )
    assert torch.equal(got, want)
    assert not torch.equal(q.transpose(1, 2) @ k.transpose(1, 2).transpose(2, 3), want)
    interpreted = interpret.load(CONTIGUOUS)
    assert torch.equal(interpreted.evaluate("forward", [q, k]), got)
    assert torch.equal(interpreted.evaluate("grad", [q, k]), module.Model().grad(q, k))
