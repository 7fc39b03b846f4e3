"""examples/convnet.lisp, a small ResNet, against the same network written by hand with
nn.Conv2d, nn.BatchNorm2d (batch statistics) and nn.Linear: the hand-written module loads
the compiled one's state_dict with strict=True, and over a few AdamW steps on a toy task
(which quadrant of a noisy 16x16 image holds a bright square) the losses are the same.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cases import lisp
from conftest import load_module
from sx2torch.compiler import Options, compile_source

STEPS = 8


def convnet(run: str, target: str = "cuda"):
    path = lisp("convnet")
    code = compile_source(path.read_text(), path.name, Options(run=run, target=target))
    return load_module(code).Convnet


def torch_batch_norm(channels: int) -> nn.Module:
    return nn.BatchNorm2d(channels, track_running_stats=False)


class FormulaBatchNorm(nn.Module):
    """Batch normalization as its definition reads: the batch mean, the mean of the squared
    deviations, and their rsqrt, then the affine map; the arithmetic of the library's
    batch-norm, so a module built with it computes the compiled one's bits on any host,
    where nn.BatchNorm2d's kernel sums in its own order (which differs from host to host:
    AVX-512, AVX2 and ATEN_CPU_CAPABILITY=default each vectorize it differently)."""

    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x):
        mean = torch.mean(x, dim=(0, 2, 3), keepdim=True)
        variance = torch.mean(torch.square(x - mean), dim=(0, 2, 3), keepdim=True)
        normalized = (x - mean) * torch.rsqrt(variance + self.eps)
        return normalized * self.weight.reshape(-1, 1, 1) + self.bias.reshape(-1, 1, 1)


class Block(nn.Module):
    def __init__(self, channels: int, norm=torch_batch_norm):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn1 = norm(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn2 = norm(channels)

    def forward(self, x):
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


class HandWritten(nn.Module):
    def __init__(
        self, in_channels=1, channels=16, depth=2, num_classes=4, norm=torch_batch_norm
    ):
        super().__init__()
        self.stem = nn.Conv2d(in_channels, channels, 3, padding=1)
        self.stem_bn = norm(channels)
        self.blocks = nn.ModuleList(Block(channels, norm) for _ in range(depth))
        self.head = nn.Linear(channels, num_classes)

    def forward(self, images):
        h = nn.functional.max_pool2d(torch.relu(self.stem_bn(self.stem(images))), 2)
        for block in self.blocks:
            h = block(h)
        return self.head(h.mean((2, 3)))


def toy_batch(n: int = 32, seed: int = 0):
    """Noise, and a bright 4x4 square in the quadrant the label names."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=g)
    images = 0.5 * torch.randn(n, 1, 16, 16, generator=g)
    for i, label in enumerate(labels.tolist()):
        row, col = 2 + 8 * (label // 2), 2 + 8 * (label % 2)
        images[i, 0, row : row + 4, col : col + 4] += 2.0
    return images, labels


def losses(model, loss_fn, steps: int = STEPS) -> list:
    images, labels = toy_batch()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    found = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(model, images, labels)
        loss.backward()
        optimizer.step()
        found.append(loss.item())
    return found


def compiled_loss(model, images, labels):
    return model.loss(images, labels)


def hand_loss(model, images, labels):
    return nn.functional.cross_entropy(model(images), labels)


def hand_written_losses(norm) -> list:
    torch.manual_seed(0)
    source = convnet("exact")()
    hand = HandWritten(norm=norm)
    hand.load_state_dict(source.state_dict(), strict=True)
    return losses(hand, hand_loss)


@pytest.fixture(scope="module")
def hand_losses():
    return hand_written_losses(torch_batch_norm)


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_f32_losses_are_the_hand_written_modules(target):
    """Bit for bit, against the module written with the formula's batch norm: the same
    kernels (conv2d, the means, rsqrt, linear, cross_entropy, AdamW) in the same order.
    Against nn.BatchNorm2d, whose kernel sums in another order, eight AdamW steps grow the
    first step's reordering differences by a factor no bound follows from, so the test
    of nn.BatchNorm2d's agreement is the first logits' (below)."""
    torch.manual_seed(0)
    model = convnet("exact", target)()
    got = losses(model, compiled_loss)
    assert got == hand_written_losses(FormulaBatchNorm)
    assert got[-1] < 0.5 * got[0]


def test_the_first_logits_agree_in_f32():
    torch.manual_seed(0)
    model = convnet("exact")()
    hand = HandWritten()
    hand.load_state_dict(model.state_dict(), strict=True)
    images, _ = toy_batch()
    with torch.no_grad():
        got, want = model(images), hand(images)
    assert got.dtype == torch.float32 and got.shape == (32, 4)
    assert (got - want).abs().max() <= 1e-5


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_bf16_trains_and_follows_the_f32_losses(hand_losses, target):
    torch.manual_seed(0)
    model = convnet("train", target)()
    got = losses(model, compiled_loss)
    assert got[-1] < 0.5 * got[0]
    # bf16 activations: the losses keep to the f32 run's within bf16's few digits
    torch.testing.assert_close(got, hand_losses, rtol=0.05, atol=0.02)


def test_the_stride_and_blocks_follow_the_constructor():
    torch.manual_seed(1)
    model = convnet("exact")(channels=8, depth=3, num_classes=3)
    hand = HandWritten(channels=8, depth=3, num_classes=3)
    hand.load_state_dict(model.state_dict(), strict=True)
    images, _ = toy_batch(8, seed=2)
    with torch.no_grad():
        assert (model(images) - hand(images)).abs().max() <= 1e-5
