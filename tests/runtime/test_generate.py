"""sx2torch.runtime.generate and the cache it keeps (issue 36), on golden/generate-cache.lisp:
two causal attentions, one with a sliding window, learned positions. The references are
the same module without a generation running (every position recomputed from the whole
prefix) and plain PyTorch's attention."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from cases import GENERATE_RUNS, LLAMA, lisp
from conftest import compiled_once, load_module
from sx2torch.compiler import Options, compile_source
from sx2torch.runtime import cached_attention, generate
from sx2torch.runtime.cache import Cache, generating


def model(run: str):
    path = lisp("generate-cache")
    code = compile_source(path.read_text(), path.name, Options(run=run))
    torch.manual_seed(0)
    return load_module(code).GenerateCache()


def recomputed(module, prompt: torch.Tensor, steps: int) -> tuple:
    """Greedy decoding without a cache: the whole prefix through forward at each step."""
    tokens, logits = prompt, []
    with torch.no_grad():
        for _ in range(steps):
            last = module(tokens)[:, -1].float()
            logits.append(last)
            tokens = torch.cat([tokens, last.argmax(-1, keepdim=True)], dim=-1)
    return tokens, logits


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_the_cached_steps_are_the_recomputed_prefix(static, monkeypatch):
    """f32: each cached step's logits are those of the prefix run whole (to f32's rounding
    of a different summation), so the tokens are the same, the window's mask included: its
    slot holds the last 3 keys (dynamic) or 4, rolled once full (static, run eagerly).
    """
    torch.set_num_threads(1)
    monkeypatch.setattr(torch, "compile", lambda module, **options: module)
    module = model("chat-exact")
    prompt = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(2))
    tokens, logits = generate(
        module, prompt, 10, return_logits=True, static_cache=static
    )
    want_tokens, want_logits = recomputed(module, prompt, 10)
    assert torch.equal(tokens, want_tokens)
    for got, want in zip(logits, want_logits):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_cache_holds_what_the_attention_reads_and_its_bytes_per_token():
    module = model("chat")
    prompt = torch.randint(0, 64, (1, 4))
    cache = Cache()
    with torch.no_grad(), generating(cache):
        cache.begin(0)
        module(prompt)
    assert [k.dtype for k in cache.keys + cache.values] == [torch.bfloat16] * 4
    # the second attention's window of 3 keeps the last 3 keys, as transformers' sliding
    # layers do: no later query sees the first
    assert [tuple(k.shape) for k in cache.keys] == [(1, 4, 4, 8), (1, 4, 3, 8)]
    assert cache.starts == [0, 1]
    # two attentions, K and V, 4 heads of 8, bf16
    assert cache.bytes_per_token() == 2 * 2 * 4 * 8 * 2


def test_a_store_is_a_copy_never_a_rounding():
    q = k = v = torch.randn(1, 2, 3, 4)
    with pytest.raises(TypeError, match="holds torch.bfloat16"):
        with generating(Cache()) as cache:
            cache.begin(0)
            cached_attention(q, k, v, dtype=torch.bfloat16)


@pytest.mark.parametrize("window", [None, 2])
def test_a_chunk_after_the_cache_sees_the_mask_aligned_bottom_right(window):
    """Three tokens added after five: rows 5..7 of the whole sequence's attention."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 8, 16, generator=g) for _ in range(3))
    allowed = torch.ones(8, 8, dtype=torch.bool).tril()
    if window is not None:
        allowed &= torch.ones(8, 8, dtype=torch.bool).triu(-window)
    whole = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    cache = Cache()
    with generating(cache):
        cache.begin(0)
        cached_attention(
            q[..., :5, :], k[..., :5, :], v[..., :5, :], dtype=q.dtype, window=window
        )
        cache.begin(5)
        chunk = cached_attention(
            q[..., 5:, :], k[..., 5:, :], v[..., 5:, :], dtype=q.dtype, window=window
        )
    torch.testing.assert_close(chunk, whole[..., 5:, :], rtol=1e-6, atol=1e-6)


def test_eos_pads_finished_rows_and_the_streamer_sees_every_token():
    module = model("chat-exact")
    prompt = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(2))
    free = generate(module, prompt, 10)
    end = int(free[0, 7])  # row 0's third new token
    seen = []

    class Streamer:
        def put(self, value):
            seen.append(value.clone())

        def end(self):
            seen.append("end")

    tokens = generate(module, prompt, 10, eos_token_id=[end], streamer=Streamer())
    for row, original in zip(tokens, free):
        hits = (original[5:] == end).nonzero()
        cut = 5 + int(hits[0]) + 1 if len(hits) else free.shape[1]
        assert torch.equal(row[:cut], original[:cut])
        assert (row[cut:] == end).all()  # a finished row is padded with the end token
    assert torch.equal(seen[0], prompt) and seen[-1] == "end"
    assert torch.equal(torch.stack(seen[1:-1], dim=1), tokens[:, 5:])


def test_a_module_compiled_without_generate_is_refused():
    path = lisp("generate-cache")
    code = compile_source(
        path.read_text().replace(" :generate true", ""), path.name, Options(run="chat")
    )
    with pytest.raises(TypeError, match=r":generate true"):
        generate(
            load_module(code).GenerateCache(), torch.zeros(1, 3, dtype=torch.long), 2
        )


def test_the_static_decode_step_compiles_once_torch_compile():
    """static_cache=True: the 31 steps after the prompt run one graph compiled with
    fullgraph=True (a graph break is an error), never compiled again
    (error_on_recompile), and give eager's tokens. A one-layer Llama keeps inductor short.
    """
    from torch._dynamo.utils import counters

    torch.set_num_threads(1)
    path = lisp("llama")
    source = path.read_text() + GENERATE_RUNS
    code = compile_source(source, path.name, Options(run="generate-exact"))
    torch.manual_seed(0)
    sizes = dict(LLAMA, num_hidden_layers=1, vocab_size=64, intermediate_size=64)
    module = load_module(code).Llama(**sizes)
    prompt = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))
    eager = generate(module, prompt, 32)
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(error_on_recompile=True):
        tokens = generate(module, prompt, 32, static_cache=True)
    assert torch.equal(tokens, eager)
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]


@pytest.mark.parametrize("length", [2, 5], ids=["fills-while-compiled", "full"])
def test_the_windowed_static_decode_step_compiles_once(length, monkeypatch):
    """The window's slot (3 keys, held as 4) rolls once full: before, the step branched on
    the cache's length, a Python number, so every token compiled it again. Now one graph
    serves every step, across the slot filling (prompt 2) and full from the first step
    (prompt 5), counted by a backend that runs each graph as torch does; its tokens and
    logits are the uncompiled static cache's, bit for bit."""
    torch.set_num_threads(1)
    module = model("chat-exact")
    prompt = torch.randint(
        0, 64, (2, length), generator=torch.Generator().manual_seed(2)
    )
    eager, (tokens, logits), graphs = compiled_once(
        monkeypatch,
        lambda: generate(module, prompt, 12, static_cache=True, return_logits=True),
    )
    assert len(graphs) == 1
    assert torch.equal(tokens, eager[0])
    assert all(torch.equal(a, b) for a, b in zip(logits, eager[1], strict=True))
