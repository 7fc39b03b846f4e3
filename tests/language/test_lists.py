"""List consts and list &keys (golden/list-consts): `(at LIST I)` and `(len LIST)` in stack
counts, shapes, layer arguments and bodies, `(in I LIST)` in conditions, against the same
model written in plain PyTorch; the interpreter agrees; bad lists are located diagnostics.
"""

from __future__ import annotations

import pytest
import torch

from cases import lisp
from conftest import load_module
from sx2torch import interpret
from sx2torch.compiler import compile_source
from sx2torch.errors import SourceError

torch.set_num_threads(1)


def compiled():
    path = lisp("list-consts")
    return load_module(compile_source(path.read_text(), path.name))


def reference(model, x, scales, gated, depths):
    """The golden model's forward in plain PyTorch, reading its parameters by key."""
    state = model.state_dict()
    h = x
    for i, depth in enumerate(depths):
        h = h @ state[f"stages.{i}.down"]
        for j in range(depth):
            h = h + torch.relu(h @ state[f"stages.{i}.blocks.{j}.w"])
            if j in gated:
                h = h * state[f"stages.{i}.blocks.{j}.gate"]
        h = h * scales[i]
    return h @ state["head"]


@pytest.mark.parametrize(
    "config",
    [
        {},  # the defaults: depths [2 1 3], widths [8 16 16]
        {"depths": [1, 3], "hidden_sizes": [6, 5], "gated_layers": [1], "in_size": 3},
    ],
)
def test_the_lists_decide_each_stage_and_the_constructor_takes_them_as_lists(config):
    torch.manual_seed(0)
    module = compiled()
    model = module.ListConsts(**config)
    depths = config.get("depths", [2, 1, 3])
    widths = config.get("hidden_sizes", [8, 16, 16])
    gated = config.get("gated_layers", [0, 2])
    inputs = config.get("in_size", 4)
    expected = {"head": (widths[-1], 2)}
    for i, depth in enumerate(depths):
        expected[f"stages.{i}.down"] = ([inputs] + widths)[i], widths[i]
        for j in range(depth):
            expected[f"stages.{i}.blocks.{j}.w"] = widths[i], widths[i]
            if j in gated:
                expected[f"stages.{i}.blocks.{j}.gate"] = (widths[i],)
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert got == expected
    with torch.no_grad():
        for name, value in model.named_parameters():
            if name.endswith("gate"):
                value.normal_()
    x = torch.randn(5, inputs)
    scales = [1.0, 0.5, 0.25][: len(depths)]
    assert torch.equal(model(x), reference(model, x, scales, gated, depths))
    # a list &key is the caller's: passed as a list, read element by element
    other = [2.0, -1.0, 3.0][: len(depths)]
    assert torch.equal(
        model(x, scales=other), reference(model, x, other, gated, depths)
    )
    # the interpreter builds the same model from the same lists and computes the same
    consts = {k.replace("_", "-"): v for k, v in config.items()}
    path = lisp("list-consts")
    interpreted = interpret.load(
        path.read_text(), path.name, consts=consts, state=model.state_dict()
    )
    assert torch.equal(interpreted.evaluate("forward", [x]), model(x))


def test_list_reads_are_written_as_python_reads_them():
    path = lisp("list-consts")
    code = compile_source(path.read_text(), path.name)
    assert "depths=(2, 1, 3)," in code  # an immutable default
    assert "for i in sx.layers(len(depths))" in code
    assert "in_dim=in_size if i == 0 else hidden_sizes[i - 1]," in code
    assert "size=(hidden_sizes[-1], 2)" in code
    assert "if idx in gated:" in code
    assert "h = stage(h) * scales[i]" in code


def test_len_of_a_tensor_is_its_first_size_when_the_module_runs(build):
    module, code = build("(defun forward (x) (* x (len x)))")
    assert "x * len(x)" in code
    x = torch.randn(3, 2)
    assert torch.equal(module.Model()(x), x * 3)


def test_a_list_key_of_a_defun_is_passed_and_read(build):
    module, code = build(
        "(defun scale (x &key (by [1.0 2.0])) (* x (at by 1)))\n"
        "(defun forward (x) (+ (scale x) (scale x :by [0.5 4.0])))"
    )
    assert "self.scale(x, by=(0.5, 4.0))" in code
    x = torch.randn(4)
    assert torch.equal(module.Model()(x), x * 2.0 + x * 4.0)


@pytest.mark.parametrize(
    "source, message, where",
    [
        (
            "(defconst depths [3 3 9 3])\n(defun forward (x) (* x (at depths 4)))",
            "index 4 is out of range for the list [3 3 9 3] of 4 elements",
            (2, 25),
        ),
        (
            "(defconst depths [3 3])\n(defparam w (zeros [(at depths -3)]))\n"
            "(defun forward (x) (* x w))",
            "index -3 is out of range for the list [3 3] of 2 elements",
            (2, 21),
        ),
        (
            "(defconst depths [3 3 9 3])\n(defun forward (x) (* x depths))",
            "'*' of a list: a list is read by (at LIST I) and (len LIST)",
            (2, 20),
        ),
        (
            "(defconst depths [3 [3 9] 3])\n(defun forward (x) x)",
            "a list's elements are numbers, booleans or keywords, not lists",
            (1, 18),
        ),
        (
            "(defconst d 4)\n(defconst n (len d))\n(defun forward (x) x)",
            "'len' of numbers needs a list, got 4",
            (2, 13),
        ),
        (
            "(defconst d [4 5])\n(defparam w (zeros [d]))\n(defun forward (x) (* x w))",
            "a size must be an integer, got [4 5]",
            (2, 21),
        ),
        (
            "(defconst d [4 5])\n(defun forward (x) (* x (at d (size x :axis 0))))",
            "a Python integer known only when the module runs",
            (2, 31),
        ),
        (
            "(defconst d [4 5])\n(defconst e (+ d 1))\n(defun forward (x) x)",
            "arithmetic needs numbers, got [4 5]",
            (2, 13),
        ),
        (  # out of range only with the arguments an instance is built with
            "(defmodel stage (&key (dims [4 8]) (k 0))\n"
            "  (defparam w (zeros [(at dims k) 2]))\n"
            "  (defun forward (x) (matmul x w)))\n"
            "(defparam s (stage :k 2))\n(defun forward (x) (s x))",
            "building 'stage' with these arguments: dims[k] cannot be computed",
            (4, 13),
        ),
        (  # len of a tensor is known only when the module runs
            "(defconst d [4 5])\n(defun forward (x) (* x (at d (len x))))",
            "got (len ...), a Python integer known only when the module runs",
            (2, 31),
        ),
        (  # a list &key passed a number, and a number &key passed a list
            "(defun f (x &key (by [1.0 2.0])) (* x (at by 1)))\n"
            "(defun forward (x) (f x :by 3.0))",
            "f's :by is a list (its default is [1.0 2.0]), got 3.0",
            (2, 29),
        ),
        (
            "(defun f (x &key (by 2.0)) (* x by))\n(defun forward (x) (f x :by [1 2]))",
            "f's :by is not a list (its default is 2.0), got [1 2]",
            (2, 29),
        ),
        (
            "(defmodel m (&key (dims [1 2]))\n"
            "  (defparam w (zeros [(at dims 0)]))\n"
            "  (defun forward (x) (* x w)))\n"
            "(defparam s (m :dims 3))\n(defun forward (x) (s x))",
            "m's :dims is a list (its default is [1 2]), got 3",
            (4, 16),
        ),
        (
            "(defmodel m (&key (dims 1)) (defun forward (x) x))\n"
            "(defparam s (m :dims [3 4]))\n(defun forward (x) (s x))",
            "m's :dims is not a list (its default is 1), got [3 4]",
            (2, 16),
        ),
        (
            "(defun forward (x) (* x (< :a :b)))",
            "'<' compares numbers (or '=' two keywords), got :a",
            (1, 25),
        ),
        (
            "(defun forward (x) (+ x :a))",
            ":a is a keyword, not a number or a tensor",
            (1, 25),
        ),
        (
            "(defconst m :fast)\n(defun forward (x) (+ x (= m 1)))",
            "'=' compares numbers (or '=' two keywords), got :fast",
            (2, 25),
        ),
    ],
)
def test_a_bad_list_or_keyword_is_a_located_diagnostic(source, message, where):
    with pytest.raises(SourceError) as caught:
        compile_source(source, "model.lisp")
    assert message in caught.value.message
    assert (caught.value.span.line, caught.value.span.col) == where


TYPES = """
(defconst layer-types [:sliding :full :sliding] "as Gemma's config.layer_types")
(defmodel blk (&key (kind :full) (w 2))
  (defparam scale (ones [w]) :when (= kind :sliding))
  (defun forward (x &key (window 0))
    (if (= kind :sliding) (* x scale window) x)))
(defparam layers (stack (i (len layer-types)) (blk :kind (at layer-types i))))
(defun forward (x)
  (for (i layer layers) ((h x))
    (layer h :window (if (= (at layer-types i) :sliding) (+ i 2) 0))))
"""


@pytest.mark.parametrize("types", [None, ["full", "sliding", "sliding", "full"]])
def test_a_list_of_keywords_chooses_each_layers_kind(build, types):
    module, code = build(TYPES)
    assert 'if kind == "sliding":' in code
    assert 'window=i + 2 if self.layer_types[i] == "sliding" else 0' in code
    torch.manual_seed(0)
    model = module.Model() if types is None else module.Model(layer_types=types)
    types = types or ["sliding", "full", "sliding"]
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    sliding = [i for i, t in enumerate(types) if t == "sliding"]
    assert sorted(model.state_dict()) == [f"layers.{i}.scale" for i in sliding]
    x = torch.randn(2)
    h = x
    for i in sliding:
        h = h * model.layers[i].scale * (i + 2)
    assert torch.equal(model(x), h)
