"""The loop's pieces that need no process: the schedule and the optimizer of each parameter."""

from __future__ import annotations

import pytest
import torch

from sx2torch.runtime.train import Objective, _optimizers, lr_scale


def test_schedule():
    flat = [lr_scale(s, 10, 0.0, 0.0) for s in range(10)]
    assert flat == [1.0] * 10
    warm_cool = [lr_scale(s, 10, 0.2, 0.5) for s in range(10)]
    assert warm_cool == pytest.approx(
        [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2]
    )


def test_each_parameter_gets_the_optimizer_its_pattern_names(build):
    module, _ = build(
        "(defmodel block (&key (d 4))\n  (defparam w (normal [d d]))\n  (defparam g (ones [d]))\n"
        "  (defun forward (x) (* (matmul x w) g)))\n"
        "(defparam emb (normal [4 4]))\n(defparam blocks (stack 3 (block :d 4)))\n"
        "(defun forward (x) (chain blocks (matmul x emb)))\n"
    )
    model = module.Model()
    groups = [
        {"name": "muon", "lr": 0.02, "params": ["blocks.*.w"]},
        {"name": "adamw", "lr": 0.001, "params": ["emb", "blocks.*.g"]},
    ]
    muon, adamw = _optimizers(model, groups)
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    named = dict(model.named_parameters())
    assert muon.param_groups[0]["params"] == [named[f"blocks.{i}.w"] for i in range(3)]
    assert adamw.param_groups[0]["params"] == [named["emb"]] + [
        named[f"blocks.{i}.g"] for i in range(3)
    ]
    with pytest.raises(RuntimeError, match="no optimizer for blocks.0.g, blocks.1.g"):
        _optimizers(model, groups[:1] + [{"name": "adamw", "params": ["emb"]}])
    with pytest.raises(RuntimeError, match="blocks.0.w is in both muon and adamw"):
        _optimizers(model, groups + [{"name": "adamw", "params": ["blocks.0.w"]}])


def test_objective_calls_the_loss_method(build):
    module, _ = build(
        "(defparam w (ones [3]))\n(defun forward (x) (* x w))\n"
        "(defun total (x y) (sum (+ (forward x) y)))\n"
    )
    model = module.Model()
    x, y = torch.arange(3.0), torch.ones(3)
    assert Objective(model, "total")(x, y) == model.total(x, y) == 6.0


def test_weight_decay_skips_vectors_unless_asked(build):
    """nanoGPT's split: matrices (and higher) decay; vectors and scalars (norm gains,
    biases, A_log) do not, unless --decay-vectors."""
    module, _ = build(
        "(defparam w (normal [4 4]))\n(defparam b (zeros [4]))\n(defparam s (ones []))\n"
        "(defparam k (normal [2 4 4]))\n"
        "(defun forward (x) (* (+ (matmul (matmul x w) (sum k :axes [0])) b) s))\n"
    )
    model = module.Model()
    named = dict(model.named_parameters())
    groups = [{"name": "adamw", "lr": 0.1, "weight_decay": 0.5, "params": list(named)}]
    (adamw,) = _optimizers(model, groups)
    split = [(g["weight_decay"], g["params"]) for g in adamw.param_groups]
    assert split == [
        (0.5, [named["w"], named["k"]]),
        (0.0, [named["b"], named["s"]]),
    ]
    (adamw,) = _optimizers(model, groups, decay_vectors=True)
    split = [(g["weight_decay"], g["params"]) for g in adamw.param_groups]
    assert split == [
        (0.5, [named["w"], named["k"]]),
        (0.5, [named["b"], named["s"]]),
    ]
    # without weight decay there is nothing to split: one group, as before
    (adamw,) = _optimizers(model, [groups[0] | {"weight_decay": 0.0}])
    assert len(adamw.param_groups) == 1
