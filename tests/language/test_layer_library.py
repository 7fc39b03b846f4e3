"""The layer library (golden/layer-library): `(defparam proj (Linear 8 6 :bias false))` is
torch.nn.Linear with no model of the user's. Each layer against torch's own module: the
same state_dict keys and shapes, the same initial bits under one seed (the module and the
interpreter), the same forward values in f32, what torch's module computes on bf16 under a
`:bf16` run (f32 master weights cast at their read), the same gradients; bad instances are
located diagnostics."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm

from conftest import load_module, refused_alike
from sx2torch import interpret
from sx2torch.compiler import Options, compile_source
from sx2torch.errors import SourceError

# (the instance's source, torch's module of the same arguments, the input's shape)
LAYERS = {
    "linear": ("(Linear 8 6)", lambda: nn.Linear(8, 6), [3, 8]),
    "linear-no-bias": (
        "(Linear 8 6 :bias false)",
        lambda: nn.Linear(8, 6, bias=False),
        [2, 3, 8],
    ),
    "embedding": ("(Embedding 10 4)", lambda: nn.Embedding(10, 4), None),
    # its row zeroed after the draw, and no gradient to it (the ids read row 1 three
    # times, row 9 once)
    "embedding-padding": (
        "(Embedding 10 4 :padding-idx 1)",
        lambda: nn.Embedding(10, 4, padding_idx=1),
        None,
    ),
    "embedding-padding-last": (
        "(Embedding 10 4 -1)",
        lambda: nn.Embedding(10, 4, padding_idx=-1),
        None,
    ),
    "layer-norm": ("(LayerNorm 8 :eps 1e-6)", lambda: nn.LayerNorm(8, 1e-6), [3, 8]),
    "layer-norm-no-bias": (
        "(LayerNorm 8 :bias false)",
        lambda: nn.LayerNorm(8, bias=False),
        [3, 8],
    ),
    "layer-norm-plain": (
        "(LayerNorm 8 :elementwise-affine false)",
        lambda: nn.LayerNorm(8, elementwise_affine=False),
        [3, 8],
    ),
    "rms-norm": ("(RMSNorm 8)", lambda: nn.RMSNorm(8), [3, 8]),
    "group-norm": ("(GroupNorm 2 6)", lambda: nn.GroupNorm(2, 6), [2, 6, 5]),
    "group-norm-plain": (
        "(GroupNorm 3 6 :affine false :eps 1e-3)",
        lambda: nn.GroupNorm(3, 6, eps=1e-3, affine=False),
        [2, 6, 5],
    ),
    "conv1d": (
        "(Conv1d 4 6 3 :padding 1 :groups 2)",
        lambda: nn.Conv1d(4, 6, 3, padding=1, groups=2),
        [2, 4, 7],
    ),
    "conv2d": (
        "(Conv2d 3 4 3 :stride 2 :bias false)",
        lambda: nn.Conv2d(3, 4, 3, stride=2, bias=False),
        [2, 3, 7, 7],
    ),
    "conv-transpose1d": (
        "(ConvTranspose1d 4 6 3 :stride 2 :output-padding 1 :groups 2)",
        lambda: nn.ConvTranspose1d(4, 6, 3, stride=2, output_padding=1, groups=2),
        [2, 4, 5],
    ),
    "conv-transpose2d": (
        "(ConvTranspose2d 3 2 2 :stride 2)",
        lambda: nn.ConvTranspose2d(3, 2, 2, stride=2),
        [2, 3, 4, 4],
    ),
    # Wav2Vec2's positional convolution, and a Linear's default dim 0 (g [out, 1])
    "weight-norm-conv1d": (
        "(weight-norm (Conv1d 4 6 3 :padding 1 :groups 2) :name weight :dim 2)",
        lambda: weight_norm(
            nn.Conv1d(4, 6, 3, padding=1, groups=2), name="weight", dim=2
        ),
        [2, 4, 7],
    ),
    "weight-norm-linear": (
        "(weight-norm (Linear 8 6))",
        lambda: weight_norm(nn.Linear(8, 6)),
        [3, 8],
    ),
}


def source(instance: str, ids: bool = False) -> str:
    """The layer as a model's parameter; `rounded` gives it a bf16 activation (ids are
    integers)."""
    rounded = "" if ids else "(defun rounded (x) (layer (cast x :bf16)))\n"
    return (
        f"(defparam layer {instance})\n"
        "(defun forward (x) (layer x))\n"
        "(defun loss (x) (sum (cast (layer x) :f32)))\n"
        f"{rounded}(defrun exact :precision :f32)\n(defrun train :precision :bf16)\n"
    )


def example(shape):
    g = torch.Generator().manual_seed(3)
    if shape is None:  # ids, a repeated one among them
        return torch.tensor([[1, 7, 1], [9, 0, 1]])
    return torch.randn(*shape, generator=g)


def built(name: str, run: str = "exact"):
    instance, make, shape = LAYERS[name]
    text = source(instance, shape is None)
    module = load_module(compile_source(text, "model.lisp", Options(run=run)))
    torch.manual_seed(0)
    model = module.Model()
    torch.manual_seed(0)
    reference = make()
    return model, reference, example(shape)


@pytest.mark.parametrize("name", LAYERS)
def test_keys_shapes_and_initial_bits_are_torchs(name):
    model, reference, _ = built(name)
    got, want = model.layer.state_dict(), reference.state_dict()
    assert list(got) == list(want)
    for key in want:
        assert got[key].dtype == want[key].dtype == torch.float32
        assert torch.equal(got[key], want[key]), key
    torch.manual_seed(0)
    interpreted = interpret.load(
        source(LAYERS[name][0], LAYERS[name][2] is None)
    ).state_dict()
    assert list(interpreted) == [f"layer.{key}" for key in want]
    for key in want:
        assert torch.equal(interpreted[f"layer.{key}"], want[key]), key


@pytest.mark.parametrize("name", LAYERS)
def test_forward_and_gradients_are_torchs_in_f32(name):
    model, reference, x = built(name)
    got, want = model(x), reference(x)
    assert got.dtype == want.dtype == torch.float32
    assert torch.equal(got, want)
    torch.manual_seed(0)
    interpreted = interpret.load(source(LAYERS[name][0], LAYERS[name][2] is None))
    with torch.no_grad():
        assert torch.equal(interpreted.evaluate("forward", [x]), want)
    float = x.is_floating_point()
    mine, theirs = (x.clone().requires_grad_(float) for _ in range(2))
    model.loss(mine).backward()
    reference(theirs).sum().backward()
    grads = {k: p.grad for k, p in model.layer.named_parameters()}
    pairs = [(grads[k], p.grad) for k, p in reference.named_parameters()]
    pairs += [(mine.grad, theirs.grad)] if float else []
    assert pairs
    for got_grad, want_grad in pairs:
        # a row gather's and a convolution's gradients add in another order than torch's
        # fused backward kernels may
        torch.testing.assert_close(got_grad, want_grad, rtol=1e-6, atol=1e-6)


# what torch's module computes on a bf16 activation, with its weights rounded to bf16 as
# a bf16 model holds them; group-norm in f32 from the f32 masters, as bf16 autocast runs
# it
def _group_norm(reference, x):
    return F.group_norm(
        x.float(), reference.num_groups, reference.weight, reference.bias, reference.eps
    )


BF16 = {"group-norm": _group_norm, "group-norm-plain": _group_norm}


def _computed(reference):
    """A weight-normed module as the plain one holding the weight torch computes from its
    f32 g and v: a bf16 run reads that weight, rounded where it is read, as bf16
    autocast runs the module (test_weight_norm_under_bf16_is_autocasts)."""
    with torch.enable_grad():  # else torch leaves the weight a buffer
        for name in list(getattr(reference, "parametrizations", {})):
            parametrize.remove_parametrizations(reference, name)
    return reference


@pytest.mark.parametrize("name", LAYERS)
def test_a_bf16_run_computes_what_torchs_bf16_module_does(name):
    model, reference, x = built(name, run="train")
    assert all(p.dtype == torch.float32 for p in model.parameters())  # f32 masters
    float = x.is_floating_point()
    with torch.no_grad():
        # a bf16 activation, as the layers of a bf16 model read one
        got = model.rounded(x) if float else model(x)
        x = x.bfloat16() if float else x
        if name in BF16:
            want = BF16[name](reference, x)
        else:
            want = _computed(reference).to(torch.bfloat16)(x)
    assert got.dtype == want.dtype
    assert torch.equal(got, want)
    if float:
        interpreted = interpret.load(
            source(LAYERS[name][0]), run="train", state=model.state_dict()
        )
        assert torch.equal(interpreted.evaluate("rounded", [x.float()]), got)


def _rounded(tensor):
    return tensor.bfloat16().float() if tensor.is_floating_point() else tensor


@pytest.mark.parametrize("name", LAYERS)
def test_a_held_target_computes_torchs_f32_module_on_rounded_values_rounded_once(name):
    """The cpu target holds bf16 in f32: each layer's one kernel runs in f32 on the
    rounded activation and weights and rounds its result once (group-norm's island: not
    at all, from the f32 masters)."""
    instance, make, shape = LAYERS[name]
    text = source(instance, shape is None)
    module = load_module(
        compile_source(text, "model.lisp", Options(run="train", target="cpu"))
    )
    torch.manual_seed(0)
    model = module.Model()
    torch.manual_seed(0)
    reference = make()
    x = example(shape)
    with torch.no_grad():
        got = model.rounded(x) if x.is_floating_point() else model(x)
        if name in BF16:
            want = BF16[name](reference, _rounded(x))
        else:
            reference = _computed(reference)
            for param in reference.parameters():
                param.copy_(_rounded(param))
            want = _rounded(reference(_rounded(x)))
    assert got.dtype == want.dtype == torch.float32
    assert torch.equal(got, want)


@pytest.mark.parametrize("target", ["cuda", "cpu"])
@pytest.mark.parametrize("run", ["exact", "train"])
def test_an_embeddings_padding_row_gets_no_gradient_as_torchs(run, target):
    """torch's nn.Embedding(n, d, padding_idx=p): a fresh module's row p zero and no
    gradient to it, under :bf16 too (the rows gathered in f32 and cast, as torch's module
    under bf16 autocast reads them), on the cuda target and the held cpu target."""
    text = source("(Embedding 10 4 :padding-idx 1)", ids=True)
    code = compile_source(text, "model.lisp", Options(run=run, target=target))
    assert "F.embedding(x, self.weight, padding_idx=self.padding_idx)" in code
    torch.manual_seed(0)
    model = load_module(code).Model()
    torch.manual_seed(0)
    reference = nn.Embedding(10, 4, padding_idx=1)
    assert torch.equal(model.layer.weight, reference.weight)
    assert torch.equal(model.layer.weight[1], torch.zeros(4))
    ids = example(None)
    model.loss(ids).backward()
    rows = reference(ids)
    rows = rows.bfloat16().float() if run == "train" else rows
    rows.sum().backward()
    got, want = model.layer.weight.grad, reference.weight.grad
    assert got.dtype == want.dtype == torch.float32
    assert torch.equal(got, want)
    assert torch.equal(got[1], torch.zeros(4)) and torch.equal(got[7], torch.ones(4))


def test_the_generated_classes_read_as_torchs():
    code = compile_source(source("(Linear 8 6 :bias false)"), "model.lisp")
    assert "self.layer = Linear(in_features=8, out_features=6, bias=False)" in code
    assert "def __init__(self, *, in_features, out_features, bias=True):" in code
    assert "        if bias:\n            self.bias = nn.Parameter(\n" in code
    assert "-1 / math.sqrt(in_features)," in code
    assert (
        "        if self.has_bias:\n"
        "            return F.linear(x, self.weight, self.bias)\n"
        "        return F.linear(x, self.weight)\n"
    ) in code
    code = compile_source(source("(Embedding 10 4 :padding-idx 1)", True), "model.lisp")
    assert (
        "self.layer = Embedding(num_embeddings=10, embedding_dim=4, padding_idx=1)"
        in code
    )
    assert (
        "    def __init__(self, *, num_embeddings, embedding_dim, padding_idx=None):\n"
        "        super().__init__()\n"
        "        self.padding_idx = padding_idx\n"
        "        self.weight = nn.Parameter(\n"
        "            torch.normal(0.0, 1.0, size=(num_embeddings, embedding_dim))\n"
        "        )\n"
        "        if padding_idx is not None:\n"
        "            with torch.no_grad():\n"
        "                self.weight[padding_idx].fill_(0)\n"
        "\n"
        "    def forward(self, x):\n"
        "        return F.embedding(x, self.weight, padding_idx=self.padding_idx)\n"
    ) in code


def test_a_model_of_the_sources_own_takes_the_name():
    text = (
        "(defmodel Linear (&key (n 2))\n  (defparam w (ones [n]))\n"
        "  (defun forward (x) (* x w)))\n"
        "(defparam layer (Linear :n 3))\n(defun forward (x) (layer x))\n"
    )
    module = load_module(compile_source(text, "model.lisp"))
    assert list(module.Model().state_dict()) == ["layer.w"]


def test_keys_by_name_and_a_computed_size():
    text = (
        "(defconst d 4)\n"
        "(defparam up (Linear :in-features d :out-features (* 2 d)))\n"
        "(defun forward (x) (up x))\n"
    )
    module = load_module(compile_source(text, "model.lisp"))
    torch.manual_seed(0)
    model = module.Model(d=3)
    torch.manual_seed(0)
    assert torch.equal(model.up.weight, nn.Linear(3, 6).weight)


@pytest.mark.parametrize(
    "instance, line_col, message",
    [
        ("(Linear 8 6 true 2)", "1:34", "takes at most 3 arguments"),
        ("(Linear 8)", "1:17", "needs :out-features"),
        ("(Linear 8 6 :bias-free true)", "1:29", "no key :bias-free"),
        ("(Linear 8 6 :out-features 2)", "1:29", ":out-features is given twice"),
        ("(Linear 8.5 6)", "1:17", "parameter 'weight' has a size 8.5"),
        ("(Conv2d 4 6 :stride 2)", "1:17", "needs :kernel-size"),
        ("(Embedding 10 (/ 8 3))", "1:17", "has a size 2.6666666666666665"),
        ("(Conv2d 4 4 0)", "1:17", "parameter 'bias' has a fan-in of 0"),
        ("(Linear [1 2] 3)", "1:25", "Linear's :in-features is not a list, got [1 2]"),
        # torch's weight_norm: NAME a parameter every instance makes, DIM one of its axes
        (
            "(weight-norm (Linear 4 4) :name w)",
            "1:49",
            "weight-norm's :name must name a parameter of Linear, got 'w' "
            "(its parameters: weight, bias)",
        ),
        (
            "(weight-norm (Linear 4 4) :name bias)",
            "1:49",
            "Linear's 'bias' is made only where its :when holds",
        ),
        (
            "(weight-norm (Linear 4 4) :dim 2)",
            "1:17",
            "weight-norm's :dim must be an axis of Linear's 'weight' (rank 2), got 2",
        ),
        ("(weight-norm (Linear 4 4) :dim 0.5)", "1:48", "must be an integer"),
        ("(weight-norm (weight-norm (Linear 4 4)))", "1:30", "takes one weight-norm"),
        ("(weight-norm (stack 2 (Linear 4 4)))", "1:30", "takes sub-model instances"),
    ],
)
def test_bad_instances_are_located_diagnostics(instance, line_col, message):
    error = refused_alike(
        f"(defparam layer {instance})\n(defun forward (x) (layer x))\n"
    )
    assert message in str(error)
    assert f"{error.span.line}:{error.span.col}" == line_col


@pytest.mark.parametrize("bias", ["true", "false"])
def test_library_linears_split_under_tensor_parallelism_as_a_linear_layer_of_ones_own(
    bias,
):
    """The library's Linear chooses between `linear` with and without its bias by a
    const; the shard pass follows the split through both branches, so an MLP of them gets
    the plan of an MLP of the source's own one-`linear` layers."""
    body = "(defun forward (x) (down (relu (up x))))\n"
    library = (
        f"(defparam up (Linear 8 32 :bias {bias}))\n(defparam down (Linear 32 8))\n"
    )
    own = (
        "(defmodel lin (&key (i 1) (o 1))\n  (defparam weight (normal [o i]))\n"
        "  (defun forward (x) (linear x weight)))\n"
        "(defparam up (lin :i 8 :o 32))\n(defparam down (lin :i 32 :o 8))\n"
    )
    plan = 'TP_PLAN = {"up": "colwise", "down": "rowwise"}'
    assert plan in compile_source(own + body, "model.lisp")
    assert plan in compile_source(library + body, "model.lisp")


def test_layers_in_a_stack_and_a_sequential_are_torchs_containers_of_them():
    """A stack whose layers choose their bias by the layer index, and ConvNeXt's kind of
    nn.Sequential(LayerNorm, Linear): torch's keys and bits; the interpreter agrees."""
    text = (
        "(defconst d 4)\n"
        "(defparam layers (stack (i 2) (Linear d d :bias (= i 0))))\n"
        "(defparam head (sequential (LayerNorm d) (Linear d 2)))\n"
        "(defun forward (x) (head (chain layers x)))\n"
    )
    module = load_module(compile_source(text, "model.lisp"))
    torch.manual_seed(0)
    model = module.Model()
    torch.manual_seed(0)
    layers = nn.ModuleList([nn.Linear(4, 4, bias=i == 0) for i in range(2)])
    head = nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 2))
    want = {
        **{f"layers.{k}": v for k, v in layers.state_dict().items()},
        **{f"head.{k}": v for k, v in head.state_dict().items()},
    }
    torch.manual_seed(0)
    interpreted = interpret.load(text)
    for got in (model.state_dict(), interpreted.state_dict()):
        assert list(got) == list(want)
        assert all(torch.equal(got[k], want[k]) for k in want)
    x = example([3, 4])
    with torch.no_grad():
        expected = head(layers[1](layers[0](x)))
        assert torch.equal(model(x), expected)
        assert torch.equal(interpreted.evaluate("forward", [x]), expected)


@pytest.mark.parametrize(
    "keys, line_col, message",
    [
        ("((:a b) 1) (a 2)", "1:31", "takes the key :a twice"),
        ("((a b) 1)", "1:20", "expected (:KEY NAME)"),
    ],
)
def test_a_models_keys_are_passed_once_each(keys, line_col, message):
    text = (
        f"(defmodel m (&key {keys})\n  (defun forward (x) x))\n"
        "(defparam s (m))\n(defun forward (x) (s x))\n"
    )
    with pytest.raises(SourceError) as caught:
        compile_source(text, "model.lisp")
    assert message in str(caught.value)
    assert f"{caught.value.span.line}:{caught.value.span.col}" == line_col


def test_weight_norm_under_bf16_is_autocasts():
    """Under :bf16 the weight is computed in f32 from the f32 masters g and v (torch's
    parametrization, which autocast leaves in f32) and rounded where the convolution
    reads it: what torch's module computes under bf16 autocast."""
    model, reference, x = built("weight-norm-conv1d", run="train")
    x = x.bfloat16()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = reference(x)
    with torch.no_grad():
        assert torch.equal(model(x), want)
    assert "self.weight.to(torch.bfloat16)" in compile_source(
        source(LAYERS["weight-norm-conv1d"][0]), "model.lisp", Options(run="train")
    )


def test_weight_norm_loads_torchs_state_dict_strictly_and_reads_as_torch():
    """A strict load of torch's weight-normed module's state_dict, at other values than
    the fresh ones (g not the norms of v), then the same forward; the constructor is
    torch's own call."""
    model, reference, x = built("weight-norm-conv1d")
    with torch.no_grad():
        reference.parametrizations.weight.original0.mul_(1.5)
    model.layer.load_state_dict(reference.state_dict(), strict=True)
    with torch.no_grad():
        assert torch.equal(model(x), reference(x))
    state = {f"layer.{k}": v for k, v in reference.state_dict().items()}
    interpreted = interpret.load(source(LAYERS["weight-norm-conv1d"][0]), state=state)
    with torch.no_grad():
        assert torch.equal(interpreted.evaluate("forward", [x]), reference(x))
    code = compile_source(source(LAYERS["weight-norm-conv1d"][0]), "model.lisp")
    assert "self.layer = nn.utils.parametrizations.weight_norm(\n" in code
    assert 'name="weight",\n            dim=2,' in code


def test_a_stack_of_weight_normed_layers_and_its_training_names():
    """Each layer of a stack weight-normed, its keys torch's; a training script names g
    and v (g with AdamW under Muon, as a vector of norms), and tensor parallelism keeps
    a weight-normed Linear whole."""
    text = (
        "(defparam layers (stack 2 (weight-norm (Linear 4 4 :bias false))))\n"
        "(defun forward (x) (chain layers x))\n"
        "(defun loss (x y) (mean (* (forward x) y)))\n"
        "(defrun train :loss loss :optimizer (muon :lr 0.01) :batch-size 2 "
        ":seq-len 4 :steps 1)\n"
    )
    code = compile_source(text, "model.lisp")
    module = load_module(code)
    torch.manual_seed(0)
    model = module.Model()
    torch.manual_seed(0)
    layers = nn.ModuleList([weight_norm(nn.Linear(4, 4, bias=False)) for _ in range(2)])
    want = {f"layers.{k}": v for k, v in layers.state_dict().items()}
    got = model.state_dict()
    assert list(got) == list(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
    x = example([3, 4])
    with torch.no_grad():
        assert torch.equal(model(x), layers[1](layers[0](x)))
    muon, adamw = code.split('"name": "adamw"')
    assert '"params": ["layers.*.parametrizations.weight.original1"]' in muon
    assert '"layers.*.parametrizations.weight.original0",' in adamw
    mlp = (
        "(defparam up (weight-norm (Linear 8 32)))\n(defparam down (Linear 32 8))\n"
        "(defun forward (x) (down (relu (up x))))\n"
    )
    assert "TP_PLAN" not in compile_source(mlp, "model.lisp")  # up and down whole


def test_a_weight_normed_weight_is_not_tied():
    text = (
        "(defparam a (weight-norm (Linear 4 4)))\n(defparam b (Linear 4 4))\n"
        "(tie b.weight a.weight)\n(defun forward (x) (b (a x)))\n"
    )
    with pytest.raises(SourceError) as caught:
        compile_source(text, "model.lisp")
    assert "'a.weight' cannot be tied: it is weight-normed" in str(caught.value)
    assert (caught.value.span.line, caught.value.span.col) == (3, 15)
