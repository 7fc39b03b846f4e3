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


class Block(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels, track_running_stats=False)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(channels, track_running_stats=False)

    def forward(self, x):
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


class HandWritten(nn.Module):
    def __init__(self, in_channels=1, channels=16, depth=2, num_classes=4):
        super().__init__()
        self.stem = nn.Conv2d(in_channels, channels, 3, padding=1)
        self.stem_bn = nn.BatchNorm2d(channels, track_running_stats=False)
        self.blocks = nn.ModuleList(Block(channels) for _ in range(depth))
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


@pytest.fixture(scope="module")
def hand_losses():
    torch.manual_seed(0)
    source = convnet("exact")()
    hand = HandWritten()
    hand.load_state_dict(source.state_dict(), strict=True)
    return losses(hand, hand_loss)


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_f32_losses_are_the_hand_written_modules(hand_losses, target):
    torch.manual_seed(0)
    model = convnet("exact", target)()
    got = losses(model, compiled_loss)
    # F.batch_norm's kernel and the seed's mean and variance sum in other orders
    torch.testing.assert_close(got, hand_losses, rtol=1e-5, atol=1e-6)
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
