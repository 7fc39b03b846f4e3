"""modded-nanogpt's medium-track GPT, ported by hand to run on the CPU: the reference that
`examples/modded-nanogpt-medium.lisp` is measured against.

Source: KellerJordan/modded-nanogpt at commit f411b3d346aa52d3504324ca93c230fd84c6c07f,
`train_gpt_medium.py`, lines 839-1220 (`norm`, `CastedLinear`, `Yarn`, `rotary`, `AttnArgs`,
`CausalSelfAttention`, `MLP`, `Block`, `GPT`) and 1690-1698 (how the script builds the model).
Copyright (c) 2024 Keller Jordan, MIT License:

    Permission is hereby granted, free of charge, to any person obtaining a copy of this
    software and associated documentation files (the "Software"), to deal in the Software
    without restriction, including without limitation the rights to use, copy, modify, merge,
    publish, distribute, sublicense, and/or sell copies of the Software, and to permit persons
    to whom the Software is furnished to do so, subject to the following conditions:

    The above copyright notice and this permission notice shall be included in all copies or
    substantial portions of the Software.

    THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED,
    INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR
    PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE
    FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR
    OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER
    DEALINGS IN THE SOFTWARE.

The module structure, class names, parameter names, shapes and dtypes are the real ones, so
a real `state_dict` loads strictly (a checkpoint of the script's `torch.compile`d model
prefixes every key with `_orig_mod.`: strip it). What differs, and why:

- `flash_attn_varlen_func(..., causal=True, softmax_scale=s, window_size=(bm_size, 0))` is
  `F.scaled_dot_product_attention` with `sliding_window_mask`: flash-attn's window (left,
  right) lets query i see keys i - left <= j <= i + right, so here j in [i - bm_size, i].
- One document per row: the input is `[B, T]` instead of one packed 1-D sequence with
  `cu_seqlens`. Positions restart at 0 in each row and the smear does not cross rows, so a
  row equals the real model on a packed batch holding that one document (B = 1).
- The training path only (`self.training` semantics), without multi-token prediction (the
  schedule's final `mtp_weights` = [1]) and without FP8 (`CastedLinear` sets `use_fp8 =
  False` itself). `forward` returns the logits `23 * sigmoid((lm_head(x) + 5) / 7.5)` in bf16;
  `loss` is the real `F.cross_entropy(..., reduction="sum")` on them.
- No `args`/`dist` globals: `block_size` (128), the window sizes in blocks (`ws_short` 11 and
  `ws_long` 23, the schedule's values from the end of training) and `world_size` (8, the
  real runs: the `scalars` vector is padded to a multiple of it, 56 entries at 16 layers) are
  constructor arguments. No YaRN extension (`Yarn.apply`): the tables and `attn_scale` are
  `Yarn.reset`'s; a checkpoint trained through the window schedule has had `apply` run on its
  tables, which are not in the state_dict. `split_embed` starts False, as in the real
  `__init__`; a checkpoint saved after the split step needs it True.
- The real attention asserts `T % 16 == 0` for the flash kernel; SDPA needs no such length.
- The real forward hard-codes 16 layers (`bm_sizes`, `skip_in`/`skip_out`, `backout_layer`,
  the value-embedding gate list): `num_layers` must be 16, as there.

Rounding points under the real dtypes (`build_reference`: every `nn.Embedding` and
`nn.Linear` weight bf16, `qkvo_w`, `c_fc`, `c_proj`, `scalars`, `x0_lambdas` f32; the Yarn
tables bf16; no autocast). R marks a rounding to bf16; "f32 inside" a kernel that
accumulates in f32 and rounds its result once. Measured on CPU eager: an f32 0-d tensor (a
lambda) times a bf16 tensor gives bf16; as the first operand (`lam * x`, as everywhere here)
the lambda is rounded to bf16 first, as the second (`x * lam`) it is not;
`F.rms_norm` on bf16 computes in f32 with eps = finfo(float32).eps (not bf16's) and rounds
once; `F.linear` on bf16 accumulates in f32 and rounds once, bias included.

- embeddings (`lm_head.weight` or `embed`, `embed2`, `value_embeds`): exact gathers, bf16.
- smear: `smear_gate` linear R; sigmoid R; `smear_lambda *` R; `* x[:, :-1]` R; `+` R.
- `norm` (x0, x02, before attention and MLP, qk-norm, the final one): R once, f32 inside.
- skip (layers 9, 10, 11): sigmoid of the lambda and `* 2` stay f32 (0-d); skip gate linear
  R; sigmoid R; `lambda-part * gate` R; `* skip` R; `x +` R.
- residual mix: layer 0 adds the two f32 lambdas in f32 first; then each `lambda * tensor`
  R and each `+` R (left to right).
- QKV and O weights: `qkvo_w[...].type_as(x)` R, then `sa_lambda *` R: two roundings of the
  weight before `F.linear` R (f32 inside).
- rotary on bf16 q, k with bf16 tables: `x1 * cos` R, `x2 * sin` R, `+` R, and the same for
  y2 (`-sin` is exact); `cat` and the key offset are copies.
- value embeddings: gate linear R, sigmoid R, `2 *` R (exact), `* ve` R, `v +` R.
- attention: bf16 q, k, v, f32 softmax and accumulation inside, output R.
- attention gate: linear R, sigmoid R, `y *` R.
- block residuals: `x + attn(...)` R, `x + mlp(...)` R.
- MLP: `c_fc.type_as` R; linear R; relu exact; square R; `c_proj.T.type_as` R; linear R.
- backout: `backout_lambda * x_backout` R; `x -=` R.
- head: `lm_head` linear R (f32 inside); `+ 5` R; `/ 7.5` R (a division); sigmoid R;
  `23 *` R. The logits are bf16 (training path: no `.float()`); the loss reads them in bf16.

The real script runs the model under `torch.compile`, whose fused kernels keep f32 between
the pointwise ops of one kernel and round where a kernel stores; the points above are eager
PyTorch's, which this port runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# the layers whose attention reads a value embedding: the real code's list for 16 layers
VALUE_EMBED_LAYERS = [0, 1, 2, 3, 4, 11, 12, 13, 14, 15]


def sliding_window_mask(size: int, window: int, device=None) -> Tensor:
    """`[size, size]` booleans, True where query i may see key j: i - window <= j <= i.

    flash-attn's `causal=True, window_size=(window, 0)` for equal query and key lengths.
    """
    i = torch.arange(size, device=device)
    distance = i[:, None] - i[None, :]
    return (distance >= 0) & (distance <= window)


def norm(x: Tensor):
    return F.rms_norm(x, (x.size(-1),))


class CastedLinear(nn.Linear):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        use_fp8=False,
        x_s=1.0,
        w_s=1.0,
        grad_s=1.0,
    ):
        super().__init__(in_features, out_features, bias=False)
        self.use_fp8 = False  # as the real code: FP8 is off on the medium track
        self.x_s = x_s
        self.w_s = w_s
        self.grad_s = grad_s

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.zero_()

    def forward(self, x: Tensor):
        return F.linear(x, self.weight.type_as(x))


class Yarn(nn.Module):
    def __init__(self, head_dim, max_seq_len):
        super().__init__()
        self.head_dim = head_dim
        self.max_seq_len = max_seq_len
        self.reset()

    def reset(self):
        angular_freq = (1 / 1024) ** torch.linspace(
            0, 1, steps=self.head_dim // 4, dtype=torch.float32
        )
        # half-truncate RoPE
        angular_freq = torch.cat(
            [angular_freq, angular_freq.new_zeros(self.head_dim // 4)]
        )
        t = torch.arange(self.max_seq_len, dtype=torch.float32)
        theta = torch.outer(t, angular_freq)
        self.cos = nn.Buffer(theta.cos().to(torch.bfloat16), persistent=False)
        self.sin = nn.Buffer(theta.sin().to(torch.bfloat16), persistent=False)
        self.angular_freq = angular_freq
        self.attn_scale = 0.1


def rotary(x_BTHD: Tensor, cos: Tensor, sin: Tensor):
    assert cos.size(0) >= x_BTHD.size(-3)
    cos, sin = (
        cos[None, : x_BTHD.size(-3), None, :],
        sin[None, : x_BTHD.size(-3), None, :],
    )
    x1, x2 = x_BTHD.chunk(2, dim=-1)
    y1 = x1 * cos + x2 * sin
    y2 = x1 * (-sin) + x2 * cos
    return torch.cat((y1, y2), 3)


@dataclass
class AttnArgs:
    ve: torch.Tensor
    sa_lambdas: torch.Tensor
    bm_size: int
    cos: torch.Tensor
    sin: torch.Tensor
    attn_scale: float
    key_offset: bool


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, head_dim: int, num_heads: int, layer_idx: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.dim = dim
        self.hdim = num_heads * head_dim

        assert self.hdim == self.dim, "num_heads * head_dim must equal model_dim"
        std = self.dim**-0.5
        bound = (3**0.5) * std
        # merged QKVO weights
        self.qkvo_w = nn.Parameter(torch.empty(self.dim * 4, self.hdim))
        with torch.no_grad():
            self.qkvo_w[: self.dim * 3].uniform_(-bound, bound)
            self.qkvo_w[self.dim * 3 :].zero_()

        # sparse gated attention
        self.attn_gate = CastedLinear(16, num_heads)
        # only the layers that read a value embedding have its gate
        if layer_idx in VALUE_EMBED_LAYERS:
            self.value_embed_gate = CastedLinear(16, num_heads)

    def forward(self, x: Tensor, attn_args: AttnArgs):
        B, T = x.size(0), x.size(1)
        cos, sin = attn_args.cos, attn_args.sin
        ve, sa_lambdas, key_offset = (
            attn_args.ve,
            attn_args.sa_lambdas,
            attn_args.key_offset,
        )
        attn_scale, bm_size = attn_args.attn_scale, attn_args.bm_size

        q, k, v = (
            F.linear(x, sa_lambdas[0] * self.qkvo_w[: self.dim * 3].type_as(x))
            .view(B, T, 3 * self.num_heads, self.head_dim)
            .chunk(3, dim=-2)
        )
        q, k = norm(q), norm(k)  # QK norm
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        if key_offset:
            # shift keys forward for the stationary head dims; read from a copy: the real
            # script runs under torch.compile, whose functionalized copy shifts by one,
            # while eager CPU copies the overlapping views in place, position by position,
            # so that every position would get position 0's keys
            k[:, 1:, :, self.head_dim // 4 : self.head_dim // 2] = k[
                :, :-1, :, self.head_dim // 4 : self.head_dim // 2
            ].clone()
            k[:, 1:, :, 3 * self.head_dim // 4 :] = k[
                :, :-1, :, 3 * self.head_dim // 4 :
            ].clone()
        if ve is not None:
            ve_gate_out = 2 * torch.sigmoid(
                self.value_embed_gate(x[..., : self.value_embed_gate.weight.size(-1)])
            ).view(B, T, self.num_heads, 1)
            v = v + ve_gate_out * ve.view_as(v)

        # flash_attn_varlen_func(causal=True, window_size=(bm_size, 0)) on one document a row
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=sliding_window_mask(T, bm_size, x.device),
            scale=attn_scale,
        ).transpose(1, 2)
        y = y * torch.sigmoid(
            self.attn_gate(x[..., : self.attn_gate.weight.size(-1)])
        ).view(B, T, self.num_heads, 1)
        y = y.contiguous().view(B, T, self.num_heads * self.head_dim)
        y = F.linear(y, sa_lambdas[1] * self.qkvo_w[self.dim * 3 :].type_as(y))
        return y


class MLP(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        hdim = 4 * dim
        # transposed layout to match the attention weights
        self.c_fc = nn.Parameter(torch.empty(hdim, dim))
        self.c_proj = nn.Parameter(torch.empty(hdim, dim))
        std = 0.5 * (dim**-0.5)
        bound = (3**0.5) * std
        with torch.no_grad():
            self.c_fc.uniform_(-bound, bound)
            self.c_proj.zero_()

    def forward(self, x: Tensor):
        x = F.linear(x, self.c_fc.type_as(x))
        x = F.relu(x).square()
        x = F.linear(x, self.c_proj.T.type_as(x))
        return x


class Block(nn.Module):
    def __init__(self, dim: int, head_dim: int, num_heads: int, layer_idx: int):
        super().__init__()
        self.attn = CausalSelfAttention(dim, head_dim, num_heads, layer_idx)
        self.mlp = MLP(dim)

    def forward(self, x: Tensor, attn_args: AttnArgs):
        x = x + self.attn(norm(x), attn_args)
        x = x + self.mlp(norm(x))
        return x


def next_multiple_of_n(v: float | int, *, n: int):
    return next(x for x in range(n, int(v) + 1 + n, n) if x >= v)


class GPT(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        num_layers: int,
        num_heads: int,
        head_dim: int,
        model_dim: int,
        max_seq_len: int,
        *,
        world_size: int = 8,
        block_size: int = 128,
        ws_short: int = 11,
        ws_long: int = 23,
    ):
        super().__init__()
        self.num_layers = num_layers
        self.block_size = block_size
        self.ws_short, self.ws_long = ws_short, ws_long
        vocab_size = next_multiple_of_n(vocab_size, n=128)

        self.smear_gate = CastedLinear(16, 1)
        self.skip_gates = nn.ModuleList([CastedLinear(16, 1) for _ in range(3)])

        # token value embeddings
        self.value_embeds = nn.ModuleList(
            [nn.Embedding(vocab_size, model_dim) for _ in range(5)]
        )
        for embed in self.value_embeds:
            nn.init.zeros_(embed.weight)
        self.blocks = nn.ModuleList(
            [Block(model_dim, head_dim, num_heads, i) for i in range(num_layers)]
        )
        self.yarn = Yarn(head_dim, max_seq_len)
        self.lm_head = CastedLinear(
            model_dim,
            vocab_size,
            use_fp8=False,
            x_s=100 / 448,
            w_s=1.6 / 448,
            grad_s=0.75 / 448,
        )
        nn.init.normal_(self.lm_head.weight, mean=0, std=0.005)
        self.embed = nn.Embedding(vocab_size, model_dim)
        self.embed2 = nn.Embedding(vocab_size, model_dim)
        self.x0_lambdas = nn.Parameter(torch.zeros(2 * num_layers))

        pad = (-num_layers * 3 - 5) % world_size
        self.scalars = nn.Parameter(
            torch.cat(
                [
                    1.05 * torch.ones(num_layers),  # resid lambdas
                    *[
                        torch.tensor([0.5, 1.0]) for _ in range(num_layers)
                    ],  # SA lambdas
                    torch.zeros(1),  # smear_lambda
                    0.5 * torch.ones(1),  # backout_lambda
                    -1.5 * torch.ones(3),  # skip_lambdas
                    torch.ones(pad),
                ]
            )
        )
        # start training with tied embed/lm_head
        self.split_embed = False

    def forward(self, input_seq: Tensor) -> Tensor:
        """The logits `[B, T, vocab]` (bf16) of `input_seq` `[B, T]`, one document per row."""
        assert input_seq.ndim == 2

        skip_connections = []
        skip_in = [2, 4, 6]
        skip_out = [9, 10, 11]
        x_backout = None
        backout_layer = 11

        resid_lambdas = self.scalars[: 1 * self.num_layers]
        x0_lambdas = self.x0_lambdas.view(-1, 2)
        sa_lambdas = self.scalars[1 * self.num_layers : 3 * self.num_layers].view(-1, 2)
        smear_lambda = self.scalars[3 * self.num_layers]
        backout_lambda = self.scalars[3 * self.num_layers + 1]
        skip_lambdas = self.scalars[3 * self.num_layers + 2 : 3 * self.num_layers + 5]

        short_bm = self.ws_short * self.block_size
        long_bm = self.ws_long * self.block_size
        bm_sizes = [long_bm, short_bm, short_bm, short_bm, long_bm, short_bm, short_bm, short_bm,
                    short_bm, short_bm, short_bm, long_bm, short_bm, short_bm, short_bm, long_bm]  # fmt: skip
        assert len(bm_sizes) == self.num_layers
        key_offset = [b == long_bm for b in bm_sizes]

        if self.split_embed:
            x = self.embed(input_seq)
        else:
            x = F.embedding(input_seq, self.lm_head.weight)
        ve = [value_embed(input_seq) for value_embed in self.value_embeds]
        ve = (
            [ve[0], ve[1], ve[2], ve[3], ve[4]]
            + [None] * (self.num_layers - 10)
            + [ve[0], ve[1], ve[2], ve[3], ve[4]]
        )
        assert len(ve) == self.num_layers

        # smear the token embedding forward one position (within each row)
        smear_gate_out = smear_lambda * torch.sigmoid(
            self.smear_gate(x[:, 1:, : self.smear_gate.weight.size(-1)])
        )
        x = torch.cat([x[:, :1], x[:, 1:] + smear_gate_out * x[:, :-1]], dim=1)
        x = x0 = norm(x)

        x02 = norm(self.embed2(input_seq))

        skip_idx = 0
        for i in range(self.num_layers):
            attn_args = AttnArgs(
                ve=ve[i],
                sa_lambdas=sa_lambdas[i],
                bm_size=bm_sizes[i],
                cos=self.yarn.cos,
                sin=self.yarn.sin,
                attn_scale=self.yarn.attn_scale,
                key_offset=key_offset[i],
            )
            if i in skip_out:
                skip_gate_out = (
                    torch.sigmoid(skip_lambdas[skip_idx])
                    * 2
                    * torch.sigmoid(
                        self.skip_gates[skip_idx](
                            x0[..., : self.skip_gates[skip_idx].weight.size(-1)]
                        )
                    )
                )
                skip_idx += 1
                x = x + skip_gate_out * skip_connections.pop()
            if i == 0:
                x = (resid_lambdas[0] + x0_lambdas[0, 0]) * x + x0_lambdas[0, 1] * x02
            else:
                x = (
                    resid_lambdas[i] * x
                    + x0_lambdas[i, 0] * x0
                    + x0_lambdas[i, 1] * x02
                )
            x = self.blocks[i](x, attn_args)
            if i in skip_in:
                skip_connections.append(x)
            if i == backout_layer:
                x_backout = x

        # back out the contributions of the first 2/3 of the layers
        x -= backout_lambda * x_backout
        x = norm(x)

        logits = self.lm_head(x)
        return 23 * torch.sigmoid((logits + 5) / 7.5)

    def loss(self, input_seq: Tensor, target_seq: Tensor) -> Tensor:
        """The training loss: the cross-entropy summed over tokens, on the bf16 logits."""
        logits = self.forward(input_seq)
        return F.cross_entropy(
            logits.view(-1, logits.size(-1)), target_seq.reshape(-1), reduction="sum"
        )


def build_reference(
    vocab_size: int = 50257,
    num_layers: int = 16,
    num_heads: int = 8,
    head_dim: int = 128,
    model_dim: int = 1024,
    max_seq_len: int = 4096,
    **options,
) -> GPT:
    """The model as `train_gpt_medium.py` builds it (its sizes are the defaults): f32
    parameters, then every `nn.Embedding` and `nn.Linear` weight (`CastedLinear` included)
    stored in bf16. The script's `max_seq_len` is 262144 (the validation length); the Yarn
    tables are only read up to T, so any length >= T gives the same logits.
    """
    model = GPT(
        vocab_size, num_layers, num_heads, head_dim, model_dim, max_seq_len, **options
    )
    for m in model.modules():
        if isinstance(m, (nn.Embedding, nn.Linear)):
            m.weight.data = m.weight.data.bfloat16()
    return model
