"""fused-rms-norm, linear and attention: one torch call each, compared bit for bit with the
same call written in PyTorch, under :f32 and :bf16 and on the cuda and cpu targets (run here
on the CPU). On cuda a :bf16 run calls the kernel on bf16 tensors; the cpu target holds bf16
values in f32, calls it in f32 and rounds the result once."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from sx2torch.errors import SourceError

BF16 = torch.bfloat16


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=generator(seed))


def compiled(build, args: str, body: str, run: str, target: str):
    """The model of `(defun forward (ARGS) BODY)`; the :bf16 run casts its inputs down."""
    if run == "fast":
        casts = " ".join(f"({a} (cast {a} :bf16))" for a in args.split())
        body = f"(let ({casts}) {body})"
    text = f"(defun forward ({args}) {body})\n(defrun exact :precision :f32)\n(defrun fast :precision :bf16)\n"
    module, code = build(text, "m.lisp", run=run, target=target)
    return module.M(), code


def expected(run: str, target: str, fn, *inputs):
    """`fn` as PyTorch runs it: on bf16 tensors (cuda), or in f32 on bf16 values and rounded
    once (cpu), or in f32."""
    if run == "exact":
        return fn(*inputs)
    if target == "cuda":
        return fn(*(x.to(BF16) for x in inputs))
    return fn(*(x.to(BF16).float() for x in inputs)).to(BF16).float()


RUNS = [("exact", "cuda"), ("exact", "cpu"), ("fast", "cuda"), ("fast", "cpu")]


def check(build, run, target, args, body, fn, *inputs):
    model, code = compiled(build, args, body, run, target)
    got = model(*inputs)
    want = expected(run, target, fn, *inputs)
    assert got.dtype == want.dtype and got.shape == want.shape, code
    assert torch.equal(got, want), code
    return code


@pytest.mark.parametrize("run, target", RUNS)
def test_fused_rms_norm(build, run, target):
    x, w = randn(2, 5, 64, seed=0), 1 + 0.5 * randn(64, seed=1)
    check(
        build, run, target, "x", "(fused-rms-norm x)", lambda x: F.rms_norm(x, (64,)), x
    )
    code = check(
        build,
        run,
        target,
        "x w",
        "(fused-rms-norm x w :eps 1e-5)",
        lambda x, w: F.rms_norm(x, (64,), weight=w, eps=1e-5),
        x,
        w,
    )
    assert "F.rms_norm(x, (x.size(-1),), weight=w" in code.replace("_bf16", "")


def test_fused_rms_norm_rounds_once_where_the_seed_rounds_twice(build):
    """The seed's rms-norm rounds the rsqrt and the product; the fused one rounds once."""
    x = randn(4, 7, 128, seed=2)
    fused, _ = compiled(build, "x", "(fused-rms-norm x :eps 1e-6)", "fast", "cuda")
    seed, _ = compiled(build, "x", "(rms-norm x)", "fast", "cuda")
    exact = F.rms_norm(x.to(BF16).double(), (128,), eps=1e-6)
    once = (fused(x).double() - exact).abs() / exact.abs()
    assert once.max() <= 2.0**-8 * (1 + 2.0**-10)  # one rounding, and f32 sums
    seed_error = (seed(x).double() - exact).abs() / exact.abs()
    assert seed_error.max() > 2.0**-8 * (1 + 2.0**-10)
    assert not torch.equal(fused(x), seed(x))


@pytest.mark.parametrize("run, target", RUNS)
def test_linear(build, run, target):
    x, w, b = randn(2, 5, 96, seed=3), randn(48, 96, seed=4), randn(48, seed=5)
    check(build, run, target, "x w", "(linear x w)", F.linear, x, w)
    code = check(build, run, target, "x w b", "(linear x w b)", F.linear, x, w, b)
    # no matmul operator (a held method's `@sx.saves_bf16` is not one)
    assert "F.linear(" in code and " @ " not in code


def test_linear_adds_the_bias_before_its_one_rounding(build):
    x, w, b = randn(3, 64, seed=6), randn(32, 64, seed=7), randn(32, seed=8)
    model, _ = compiled(build, "x w b", "(linear x w b)", "fast", "cuda")
    xb, wb, bb = (t.to(BF16) for t in (x, w, b))
    assert torch.equal(model(x, w, b), torch.addmm(bb, xb, wb.T))
    assert not torch.equal(model(x, w, b), xb @ wb.T + bb)  # two roundings


ATTENTIONS = {
    "plain": ("(attention q k v)", {}),
    "causal": (
        "(attention q k v :causal true :scale 0.12)",
        dict(is_causal=True, scale=0.12),
    ),
    "window": ("(attention q k v :window 5 :scale 0.3)", dict(window=5, scale=0.3)),
}


def sdpa(window=None, **options):
    def fn(q, k, v):
        if window is not None:
            i = torch.arange(q.shape[-2])
            keep = (i[:, None] - i[None, :] >= 0) & (i[:, None] - i[None, :] <= window)
            options["attn_mask"] = keep
        return F.scaled_dot_product_attention(q, k, v, **options)

    return fn


@pytest.mark.parametrize("kind", sorted(ATTENTIONS))
@pytest.mark.parametrize("run, target", RUNS)
def test_attention(build, run, target, kind):
    body, options = ATTENTIONS[kind]
    q, k, v = (randn(2, 3, 40, 16, seed=s) for s in (9, 10, 11))
    check(build, run, target, "q k v", body, sdpa(**options), q, k, v)


def reference_window(q, k, v, window, scale):
    """softmax(Q Kᵀ · scale) V in float64, query i seeing keys i - window .. i."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-2, -1) * scale
    i = torch.arange(q.shape[-2])
    distance = i[:, None] - i[None, :]
    hidden = (distance < 0) | (distance > window)
    return torch.softmax(scores.masked_fill(hidden, -math.inf), -1) @ v


@pytest.mark.parametrize("length", [40, 64])
def test_window_is_flash_attn_window_size_w_0(build, length):
    text = """
(defconst window 6)
(defun forward (q k v) (attention q k v :scale 0.25 :window window))
"""
    module, code = build(text, "m.lisp")
    assert "sx.window_mask(q.shape[-2], self.window, q.device)" in code
    q, k, v = (randn(2, 2, length, 8, seed=s).double() for s in (12, 13, 14))
    for window in (6, 0, 3):
        got = module.M(window=window)(
            q, k, v
        )  # a constructor argument, not the default
        torch.testing.assert_close(
            got, reference_window(q, k, v, window, 0.25), rtol=1e-12, atol=1e-12
        )


def test_attention_with_a_window_compiles_whole(build):
    text = """
(defconst window 6)
(defun forward (q k v) (attention q k v :scale 0.25 :window window))
"""
    module, _ = build(text, "m.lisp")
    model = module.M()
    q, k, v = (randn(2, 2, 40, 8, seed=s) for s in (15, 16, 17))
    explained = torch._dynamo.explain(model)(q, k, v)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch._dynamo.reset()
    whole = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
    for length in (40, 64):
        q, k, v = (randn(2, 2, length, 8, seed=s) for s in (15, 16, 17))
        assert torch.equal(whole(q, k, v), model(q, k, v))


@pytest.mark.parametrize("run, target", RUNS)
def test_grouped_query_attention_is_the_kernel_with_enable_gqa(build, run, target):
    """4 query heads over 2 key/value heads: the call passes enable_gqa=True, so K and V are
    never copied; it gives what the kernel gives for each query head's group."""
    q, k, v = (
        randn(2, 4, 19, 16, seed=18),
        randn(2, 2, 19, 16, seed=19),
        randn(2, 2, 19, 16, seed=20),
    )
    body = "(attention q k v :causal true :enable-gqa true)"
    fn = lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True
    )
    code = check(build, run, target, "q k v", body, fn, q, k, v)
    assert "is_causal=True, enable_gqa=True" in code


def test_grouped_query_attention_shares_each_kv_head_with_a_group_of_query_heads(build):
    """Against float64 attention of each query head with its group's K and V, repeated as
    transformers' repeat_kv does: query heads 0, 1 read KV head 0; 2, 3 read KV head 1.
    """
    model, _ = compiled(
        build,
        "q k v",
        "(attention q k v :causal true :enable-gqa true)",
        "exact",
        "cuda",
    )
    q, k, v = (
        randn(2, 4, 19, 16, seed=21),
        randn(2, 2, 19, 16, seed=22),
        randn(2, 2, 19, 16, seed=23),
    )
    k2, v2 = (x.double().repeat_interleave(2, dim=1) for x in (k, v))
    scores = q.double() @ k2.transpose(-2, -1) / 4.0
    hidden = torch.ones(19, 19, dtype=torch.bool).triu(1)
    want = torch.softmax(scores.masked_fill(hidden, -math.inf), -1) @ v2
    torch.testing.assert_close(model(q, k, v).double(), want, rtol=1e-5, atol=1e-5)


def test_fewer_key_heads_are_a_shape_error_only_without_enable_gqa(build):
    """The rank rule gives the output Q's heads under :enable-gqa; without it, 4 against 2
    heads written as literals do not broadcast and the compiler says so."""
    text = "(defparam q (normal [2 4 8 16]))\n(defparam k (normal [2 2 8 16]))\n"
    module, _ = build(
        text + "(defun forward () (attention q k k :enable-gqa true))\n", "m.lisp"
    )
    assert module.M()().shape == (2, 4, 8, 16)
    with pytest.raises(SourceError, match="4 against 2"):
        build(text + "(defun forward () (attention q k k))\n", "m.lisp")
