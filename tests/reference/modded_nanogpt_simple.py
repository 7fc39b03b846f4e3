"""modded-nanogpt's simple GPT (the optimization track's `train_gpt_simple.py`), ported by
hand: the reference that `examples/modded-nanogpt-simple.lisp` is measured against.

Source: KellerJordan/modded-nanogpt at commit f411b3d346aa52d3504324ca93c230fd84c6c07f,
`records/track_3_optimization/train_gpt_simple.py`, lines 55-153 (`RMSNorm`, `Linear`,
`Rotary`, `CausalSelfAttention`, `MLP`, `Block`, `GPT`) and 252 (how the script builds the
model). Copyright (c) 2024 Keller Jordan, MIT License:

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

The modules, names, shapes and dtypes are the real ones, so a real `state_dict` loads
strictly (strip the `_orig_mod.` prefix a compiled model's keys carry). The one change: the
real `GPT.forward(inputs, targets)` returns the summed loss; here `forward(inputs)` returns
the logits it computes (f32, after the softcap) and `loss(inputs, targets)` the same
`F.cross_entropy(..., reduction="sum")` of them. It already runs on the CPU: its attention is
`F.scaled_dot_product_attention(is_causal=True)` and it reads no globals.

Rounding points under the real dtypes (no autocast; `embed.weight` bf16 from
`nn.Embedding(...).bfloat16()`, every other parameter and the `angular_freq` buffer f32, so
the activations are bf16 from the embedding on). R marks a rounding to bf16; "f32 inside" a
kernel that accumulates in f32 and rounds once (measured on CPU eager: `F.rms_norm` on bf16
uses eps = finfo(float32).eps and multiplies by the gain before its one rounding; `F.linear`
adds the bias before its one rounding).

- `RMSNorm` (each block's `norm1`, `norm2`, the model's `norm1`, `norm2`): `gains.type_as(x)`
  R, then `F.rms_norm(x, weight=gains)` R once, f32 inside.
- `Linear` (q, k, v, the projections, fc, the head): `weight.type_as(x)` R and
  `bias.type_as(x)` R, then `F.linear` R once, f32 inside.
- qk-norm: `F.rms_norm` without a gain, R once.
- `Rotary`: positions, angles, sin and cos in f32; q and k cast up exactly, rotated in f32,
  `.type_as(x)` R once.
- attention: `F.scaled_dot_product_attention(scale=0.12, is_causal=True)` on bf16, f32
  inside, R once.
- residuals: `x + attn(...)` R, `x + mlp(...)` R; MLP: relu exact, square R.
- head: `proj` R, `.float()` exact, then the softcap `15 * l * rsqrt(l² + 225)` and the
  cross-entropy in f32.

The real script runs `model.compile(dynamic=False)`, whose fused kernels round only where
they store; the points above are eager PyTorch's, which this port runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.gains = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, (x.size(-1),), weight=self.gains.type_as(x))


class Linear(nn.Linear):
    def __init__(self, in_features, out_features):
        super().__init__(in_features, out_features, bias=True)

    def forward(self, x):
        return F.linear(x, self.weight.type_as(x), self.bias.type_as(x))


class Rotary(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        # half-truncate RoPE (w/ base freq tuning)
        angular_freq = (1 / 1024) ** torch.linspace(
            0, 1, steps=dim // 4, dtype=torch.float32
        )
        self.register_buffer(
            "angular_freq", torch.cat([angular_freq, angular_freq.new_zeros(dim // 4)])
        )

    def forward(self, x_BTHD: Tensor):
        pos = torch.arange(x_BTHD.size(1), dtype=torch.float32, device=x_BTHD.device)
        theta = torch.outer(pos, self.angular_freq)[None, :, None, :]
        cos, sin = theta.cos(), theta.sin()
        x1, x2 = x_BTHD.to(dtype=torch.float32).chunk(2, dim=-1)
        y1 = x1 * cos + x2 * sin
        y2 = x1 * (-sin) + x2 * cos
        return torch.cat((y1, y2), 3).type_as(x_BTHD)


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, head_dim=128):
        super().__init__()
        self.num_heads = dim // head_dim
        self.head_dim = head_dim
        hdim = self.num_heads * self.head_dim
        self.q = Linear(dim, hdim)
        self.k = Linear(dim, hdim)
        self.v = Linear(dim, hdim)
        self.proj = Linear(hdim, dim)
        self.rotary = Rotary(head_dim)

    def forward(self, x: Tensor):
        B, T = x.size(0), x.size(1)
        q = self.q(x).view(B, T, self.num_heads, self.head_dim)
        k = self.k(x).view(B, T, self.num_heads, self.head_dim)
        v = self.v(x).view(B, T, self.num_heads, self.head_dim)
        q, k = F.rms_norm(q, (q.size(-1),)), F.rms_norm(k, (k.size(-1),))
        q, k = self.rotary(q), self.rotary(k)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            scale=0.12,
            is_causal=True,
        ).transpose(1, 2)
        y = y.contiguous().view(B, T, self.num_heads * self.head_dim)
        y = self.proj(y)
        return y


class MLP(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        hdim = 4 * dim
        self.fc = Linear(dim, hdim)
        self.proj = Linear(hdim, dim)

    def forward(self, x: Tensor):
        x = self.fc(x)
        x = x.relu().square()
        x = self.proj(x)
        return x


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.attn = CausalSelfAttention(dim)
        self.mlp = MLP(dim)
        self.norm1 = RMSNorm(dim)
        self.norm2 = RMSNorm(dim)

    def forward(self, x: Tensor):
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return x


class GPT(nn.Module):
    def __init__(self, vocab_size: int, num_layers: int, model_dim: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, model_dim).bfloat16()
        self.blocks = nn.ModuleList([Block(model_dim) for _ in range(num_layers)])
        self.proj = Linear(model_dim, vocab_size)
        self.norm1 = RMSNorm(model_dim)
        self.norm2 = RMSNorm(model_dim)

    def forward(self, inputs: Tensor) -> Tensor:
        """The softcapped logits `[B, T, vocab]` (f32) of `inputs` `[B, T]`."""
        x = self.norm1(self.embed(inputs))
        for block in self.blocks:
            x = block(x)
        logits = self.proj(self.norm2(x)).float()
        return 15 * logits * (logits.square() + 15**2).rsqrt()

    def loss(self, inputs: Tensor, targets: Tensor) -> Tensor:
        """The real forward's value: the cross-entropy summed over tokens."""
        logits = self.forward(inputs)
        return F.cross_entropy(
            logits.view(targets.numel(), -1), targets.view(-1), reduction="sum"
        )


def build_reference(
    vocab_size: int = 50304, num_layers: int = 12, model_dim: int = 768
) -> GPT:
    """The model as `train_gpt_simple.py` builds it (its sizes are the defaults). The GPT
    makes its embedding bf16 itself; nothing else is cast."""
    return GPT(vocab_size=vocab_size, num_layers=num_layers, model_dim=model_dim)
