"""Rank rules against PyTorch: each op, at known input shapes, compiled and run; the shape the
analysis gives the output must be the shape of the tensor the generated module returns.
"""

from __future__ import annotations

import libcst as cst
import pytest
import torch
import torch.nn.functional as F

from sx2torch import ranks, resolve, runtime, trace
from sx2torch.ops.shapes import Analysis, ranked
from sx2torch.api import compile_string
from sx2torch.errors import SourceError
from sx2torch.syntax import read
import sx2torch.build as b
from sx2torch.ir import Kind, Scalar
from sx2torch.ops import REGISTRY, EmitContext

# (op, expression, {argument: shape}, the sizes the analysis cannot know, by axis)
CASES = [
    ("+", "(+ x y)", {"x": [3, 4], "y": [4]}),
    ("*", "(* x y z)", {"x": [2, 1, 4], "y": [3, 1], "z": []}),
    ("-", "(- x y)", {"x": [3, 1], "y": [1, 5]}),
    ("-", "(- x)", {"x": [3]}),
    ("/", "(/ x 2.0)", {"x": [3, 4]}),
    ("//", "(// x y)", {"x": [3, 4], "y": [1]}),
    ("neg", "(neg x)", {"x": [2, 3]}),
    ("pow", "(pow x y)", {"x": [3, 1], "y": [4]}),
    ("maximum", "(maximum x 0.5)", {"x": [3]}),
    ("maximum", "(maximum x y)", {"x": [2, 3], "y": [3]}),
    ("minimum", "(minimum x y)", {"x": [2, 1], "y": [5]}),
    ("where", "(where (> x 0.0) y 1.0)", {"x": [3, 1], "y": [4]}),
    ("clamp", "(clamp x :min 0.0)", {"x": [5, 2]}),
    ("sum", "(sum x)", {"x": [3, 4]}),
    ("sum", "(sum x :axes [1])", {"x": [3, 4]}),
    ("sum", "(sum x :axes [0 -1] :keepdims true)", {"x": [2, 3, 4]}),
    ("sum", "(sum x :keepdims true)", {"x": [2, 3]}),
    ("sum", "(sum x :axes [0])", {"x": []}),
    ("sum", "(sum x :axes [])", {"x": [2, 3]}),
    ("amax", "(amax x :axes [] :keepdims true)", {"x": [2, 3]}),
    ("mean", "(mean x :axes [-1])", {"x": [2, 3, 4]}),
    ("amax", "(amax x :axes [0] :keepdims true)", {"x": [2, 3]}),
    ("amin", "(amin x)", {"x": [2, 3]}),
    ("logsumexp", "(logsumexp x :axes [1])", {"x": [2, 3, 4]}),
    ("logsumexp", "(logsumexp x :keepdims true)", {"x": [2, 3]}),
    ("softmax", "(softmax x)", {"x": [2, 3]}),
    ("einsum", '(einsum "bij,bjk->bki" x y)', {"x": [2, 3, 4], "y": [2, 4, 5]}),
    ("einsum", '(einsum "...ij,j->...i" x y)', {"x": [2, 1, 3, 4], "y": [4]}),
    ("einsum", '(einsum "ij->" x)', {"x": [2, 3]}),
    ("log-softmax", "(log-softmax x :axis 0)", {"x": [2, 3]}),
    ("cross-entropy", "(cross-entropy x labels)", {"x": [4, 5], "labels": [4]}),
    ("softcap", "(softcap x 2.0)", {"x": [2, 3]}),
    ("rms-norm", "(rms-norm x)", {"x": [4, 3]}),
    ("layer-norm", "(layer-norm x)", {"x": [2, 4, 3]}),
    ("batch-norm", "(batch-norm x)", {"x": [4, 3]}),
    ("causal-mask", "(causal-mask x)", {"x": [2, 3, 3]}),
    (
        "causal-attention",
        "(causal-attention q k v)",
        {"q": [2, 3, 4], "k": [3, 4], "v": [1, 3, 5]},
    ),
    ("matmul", "(matmul x y)", {"x": [2, 3, 4], "y": [4, 5]}),
    ("matmul", "(matmul x y)", {"x": [4], "y": [2, 4, 5]}),
    ("matmul", "(matmul x y)", {"x": [3, 4], "y": [4]}),
    ("matmul", "(matmul x y)", {"x": [4], "y": [4]}),
    ("reshape", "(reshape x [2 0 -1])", {"x": [3, 4, 2]}),  # -1 inferred
    ("reshape-as", "(reshape-as x y)", {"x": [6], "y": [2, 3]}),
    ("transpose", "(transpose x [2 0 1])", {"x": [2, 3, 4]}),
    ("swap-axes", "(swap-axes x 0 -1)", {"x": [2, 3, 4]}),
    ("concat", "(concat [x y x] :axis 1)", {"x": [2, 3], "y": [2, 5]}),
    ("slice", "(slice x :axis 1 :start 1 :end 3)", {"x": [2, 5]}),
    ("slice", "(slice x :axis -1 :start -2)", {"x": [2, 5]}),
    ("slice", "(slice x :axis -1 :start 1 :step 2)", {"x": [2, 6]}),
    ("unsqueeze", "(unsqueeze x :axis -1)", {"x": [2, 5]}),
    ("unsqueeze", "(unsqueeze x :axis 0)", {"x": []}),
    ("squeeze", "(squeeze x :axis 1)", {"x": [2, 1, 5]}),
    ("squeeze", "(squeeze x)", {"x": [1, 2, 1, 5]}),
    ("contiguous", "(contiguous (swap-axes x 0 1))", {"x": [2, 3, 5]}),
    ("flatten", "(flatten x :start 1)", {"x": [2, 3, 5]}),
    ("flatten", "(flatten x :start 0 :end -2)", {"x": [2, 3, 5]}),
    ("flatten", "(flatten x)", {"x": []}),
    ("repeat-interleave", "(repeat-interleave x :repeats 3 :axis 1)", {"x": [2, 5]}),
    ("repeat-interleave", "(repeat-interleave x :repeats 2)", {"x": [2, 5]}),
    ("roll", "(roll x :shifts 2 :axis -1)", {"x": [2, 5]}),
    ("group-norm", "(group-norm x 2 w b)", {"x": [2, 4, 3], "w": [4], "b": [4]}),
    ("stack", "(stack [x y x] :axis 1)", {"x": [2, 5], "y": [2, 5]}),
    ("stack", "(stack [x y] :axis -1)", {"x": [2, 5], "y": [2, 5]}),
    ("pad", "(pad x [1 2 -1 0])", {"x": [2, 3, 5]}),
    ("floor", "(floor x)", {"x": [2, 5]}),
    ("ceil", "(ceil x)", {"x": [2, 5]}),
    ("int", "(int x)", {"x": [2, 5]}),
    (
        "eager-attention",
        "(eager-attention q k v m)",
        {"q": [2, 3, 4], "k": [2, 5, 4], "v": [2, 5, 6], "m": [3, 5]},
    ),
    ("take", "(take x ids)", {"x": [5, 3], "ids": [2, 4]}),
    ("at", "(at x 2)", {"x": [5, 3]}),
    ("one-hot", "(one-hot ids 7)", {"ids": [2, 3]}),
    ("ones-like", "(ones-like x)", {"x": [2, 3]}),
    ("zeros-like", "(zeros-like x)", {"x": [2, 3]}),
    ("expand-as", "(expand-as g x)", {"g": [4], "x": [3, 4]}),
    ("linear-scan", "(linear-scan a b)", {"a": [2, 3, 1], "b": [2, 3, 4]}),
    ("matrix-scan", "(matrix-scan a b)", {"a": [2, 2], "b": [2, 3, 2]}),
    ("previous", "(previous x)", {"x": [2, 3, 4]}),
    ("outer", "(outer x y)", {"x": [2, 3], "y": [2, 4]}),
    ("newton-schulz", "(newton-schulz x)", {"x": [3, 4]}),
    (
        "cross-entropy",
        "(cross-entropy x labels :reduction :none)",
        {"x": [4, 5], "labels": [4]},
    ),
    ("fused-rms-norm", "(fused-rms-norm x w)", {"x": [2, 3, 4], "w": [4]}),
    (
        "fused-layer-norm",
        "(fused-layer-norm x w b)",
        {"x": [2, 3, 4], "w": [4], "b": [4]},
    ),
    ("mod", "(mod x y)", {"x": [2, 3], "y": [3]}),
    ("positions", "(positions x :axis 1)", {"x": [2, 3, 4]}),
    ("size", "(size x :axis 1)", {"x": [2, 3]}),
    ("len", "(len x)", {"x": [2, 3]}),
    ("dropout", "(dropout x 0.5)", {"x": [2, 3]}),
    ("randn-like", "(randn-like x)", {"x": [2, 3, 4]}),
    ("rand-like", "(rand-like x)", {"x": [3]}),
    ("linear", "(linear x w b)", {"x": [2, 3, 4], "w": [5, 4], "b": [5]}),
    (
        "attention",
        "(attention q k v :causal true :window 2)",
        {"q": [2, 2, 3, 4], "k": [2, 2, 3, 4], "v": [2, 2, 3, 5]},
    ),
    (
        "attention",
        "(attention q k v :causal true :enable-gqa true)",
        {"q": [2, 4, 3, 4], "k": [2, 2, 3, 4], "v": [2, 2, 3, 5]},
    ),
    ("arange-of", "(arange-of x :axis 1)", {"x": [2, 3, 4]}),
    ("arange", "(arange x 0 16 2)", {"x": [2]}),
    ("arange", "(arange x 1 10 4)", {"x": [2]}),
    ("attention-scale", "(attention-scale s q)", {"s": [2, 3, 3], "q": [2, 3, 4]}),
    ("linspace", "(linspace x 0.0 1.0 5)", {"x": [2]}),
    (
        "conv2d",
        "(conv2d x w b :stride [2 1] :padding 1 :dilation [1 2])",
        {"x": [2, 3, 9, 8], "w": [4, 3, 3, 3], "b": [4]},
    ),
    ("conv2d", "(conv2d x w :padding :same)", {"x": [2, 3, 7, 6], "w": [5, 3, 3, 5]}),
    ("conv2d", "(conv2d x w :groups 2)", {"x": [3, 4, 6, 6], "w": [6, 2, 3, 3]}),
    ("conv1d", "(conv1d x w :stride 2)", {"x": [4, 11], "w": [5, 4, 3]}),
    (
        "conv-transpose1d",
        "(conv-transpose1d x w :stride 2 :padding 1 :output-padding 1 :groups 2)",
        {"x": [2, 4, 5], "w": [4, 3, 3]},
    ),
    (
        "conv-transpose2d",
        "(conv-transpose2d x w :stride [2 1] :dilation 2)",
        {"x": [2, 4, 3], "w": [2, 3, 3, 2]},
    ),
    (
        "conv1d",
        "(conv1d x w b :padding 2 :groups 4)",
        {"x": [2, 4, 10], "w": [8, 1, 3], "b": [8]},
    ),
    ("max-pool2d", "(max-pool2d x 3 :stride 2 :padding 1)", {"x": [2, 3, 9, 8]}),
    ("avg-pool2d", "(avg-pool2d x [2 3])", {"x": [2, 3, 8, 9]}),
    ("max-pool1d", "(max-pool1d x 3)", {"x": [2, 3, 10]}),
    ("avg-pool1d", "(avg-pool1d x 2 :stride 1)", {"x": [3, 7]}),
    ("interpolate", "(interpolate x :size [5 7] :mode :bilinear)", {"x": [2, 3, 4, 4]}),
    ("interpolate", "(interpolate x :scale-factor 2.0)", {"x": [2, 3, 4]}, {2}),
    # the values of topk, its rule given its K as the source writes it
    ("topk", "(let (([v i] (topk x 2))) v)", {"x": [3, 4]}, set(), {"k": 2}),
    ("argmax", "(argmax x :axis 0)", {"x": [3, 4]}),
    ("gather", "(gather x ids)", {"x": [3, 4], "ids": [3, 2]}),
    ("index-select", "(index-select x ids)", {"x": [3, 4], "ids": [5]}),
    ("scatter-add", "(scatter-add x ids y)", {"x": [3, 4], "ids": [3, 2], "y": [3, 2]}),
    ("index-add", "(index-add x ids y)", {"x": [3, 4], "ids": [2], "y": [2, 4]}),
    ("cumsum", "(cumsum x :axis 0)", {"x": [3, 4]}),
    ("scalar-like", "(scalar-like x 0.5)", {"x": [2, 3]}),
    ("cast-run", "(cast-run x)", {"x": [2, 3]}),
    (
        "sparse-experts",
        "(sparse-experts x ids y a b)",
        {"x": [5, 4], "ids": [5, 2], "y": [5, 2], "a": [3, 6, 4], "b": [3, 4, 3]},
    ),
]
for (
    _name
) in "exp log sqrt rsqrt tanh sigmoid sin cos erf abs relu square gelu silu softplus log1p expm1".split():
    CASES.append((_name, f"({_name} x)", {"x": [2, 3, 4]}))
for _name in ("<", "<=", ">", ">=", "="):
    CASES.append((_name, f"({_name} x y)", {"x": [3, 1], "y": [4]}))

# Internal ops cannot be called from source: each is emitted alone, on arguments of these
# shapes and with these attributes, and the code run. (op, {argument: shape}, {key: value})
INTERNAL = [
    ("cast-bool", {"x": [2, 3]}, {}),
    ("cross-entropy-backward", {"g": [], "x": [4, 5], "labels": [4]}, {}),
    ("sum-to", {"g": [3, 4], "x": [4]}, {}),
    ("mean-ones", {"x": [3, 4]}, {}),
    ("matmul-ones", {"x": [2, 3, 4], "w": [4, 5]}, {}),
    ("matmul-ones", {"x": [4], "w": [4, 5]}, {}),
    ("expand-reduced", {"g": [3], "x": [3, 4]}, {"axes": (1,), "mean": True}),
    ("take-backward", {"g": [2, 4, 3], "x": [5, 3], "ids": [2, 4]}, {}),
    ("slice-backward", {"g": [2, 2], "x": [2, 5]}, {"axis": 1, "start": 1, "end": 3}),
    ("concat-part", {"g": [2, 8], "x": [2, 3], "y": [2, 5]}, {"index": 1, "axis": 1}),
    ("concat-part", {"g": [2, 8], "x": [2, 3], "y": [2, 5]}, {"index": -2, "axis": 1}),
    ("expect-scalar", {"x": []}, {"form": "(sum x)"}),
    ("linear-scan-adjoint", {"a": [2, 3, 1], "g": [2, 3, 4]}, {}),
    ("matrix-scan-adjoint", {"a": [2, 2], "g": [2, 3, 2]}, {}),
    ("newton-schulz-bf16", {"x": [3, 4]}, {}),
    ("rms-norm-backward", {"g": [2, 4], "x": [2, 4], "y": [4]}, {"eps": None}),
    ("rms-norm-weight-backward", {"g": [2, 4], "x": [2, 4]}, {"eps": 1e-3}),
    (
        "conv2d-input-grad",
        {"g": [2, 4, 4, 4], "w": [4, 3, 3, 3], "x": [2, 3, 9, 9]},
        {"stride": 2},
    ),
    (
        "conv2d-weight-grad",
        {"x": [2, 3, 9, 9], "g": [2, 4, 4, 4], "w": [4, 3, 3, 3]},
        {"stride": 2},
    ),
    ("conv1d-input-grad", {"g": [2, 4, 8], "w": [4, 3, 3], "x": [2, 3, 10]}, {}),
    ("conv1d-weight-grad", {"x": [2, 3, 10], "g": [2, 4, 8], "w": [4, 3, 3]}, {}),
    ("topk-indices", {"x": [3, 4]}, {"k": 2}),
    (
        "repeat-interleave-backward",
        {"g": [2, 6], "x": [2, 3]},
        {"repeats": 2, "axis": 1},
    ),
    ("repeat-interleave-backward", {"g": [12], "x": [2, 3]}, {"repeats": 2}),
    (
        "slice-backward",
        {"g": [2, 3], "x": [2, 6]},
        {"axis": -1, "start": 1, "end": None, "step": 2},
    ),
    ("group-norm-backward", {"g": [2, 4, 3], "x": [2, 4, 3], "w": [4]}, {"groups": 2}),
    ("run-number", {"value": []}, {}),  # a let's arithmetic on sizes: a number
    # the cache's ops without a generation running (the plain ops' values); last-position
    # on one position, which it keeps while generating
    ("cached-attention", {"q": [2, 4, 5, 8], "k": [2, 4, 5, 8], "v": [2, 4, 5, 8]}, {}),
    ("cached-arange-of", {"like": [2, 5, 3]}, {}),
    ("cached-positions", {"like": [2, 5]}, {}),
    (
        "cached-conv1d",
        {"x": [2, 3, 10], "w": [3, 1, 4], "bias": [3]},
        {"padding": 3, "groups": 3},
    ),
    ("cached-linear-scan", {"a": [2, 5, 1], "b": [2, 5, 3]}, {"axis": 1}),
    ("cached-matmul", {"a": [2, 4, 5, 8], "b": [2, 4, 8, 5]}, {"keys": -1}),
    ("cached-matmul", {"a": [2, 4, 5, 5], "b": [2, 4, 5, 8]}, {"keys": -2}),
    ("cached-causal-mask", {"x": [2, 4, 5, 5]}, {}),
    ("last-position", {"x": [2, 1, 3]}, {}),
    (
        "group-norm-backward",
        {"g": [2, 4, 3], "x": [2, 4, 3], "w": [4]},
        {"groups": 2, "part": 1},
    ),
]

INTEGER_ARGUMENTS = ("ids", "labels")


def _case_id(case) -> str:
    return f"{case[0]}:{case[1]}"


def traced(text: str, name: str = "forward"):
    program = resolve.run(read.run(text), "model")
    graphs = trace.run(program)
    return program, graphs, graphs["model", name]


def analysed(graph, program, given=None, graphs=None) -> dict:
    """{node: shape} as the ranks pass refines them, the arguments named in `given` shaped
    so, the calls shaped as their callees' graphs in `graphs`."""
    shaped = {x: (given or {}).get(x.name) for x in graph.inputs}
    found = Analysis(program, graphs).refined(graph, shaped)
    return {node: ranked(found.get(node)) for node in ranks.valued(graph)}


def made(graph) -> dict:
    """{node: shape} as each node of a traced graph was made."""
    return {
        node: ranked(node.shape.dims) if node.shape else None
        for node in ranks.valued(graph)
    }


def tensor(name: str, shape: list) -> torch.Tensor:
    generator = torch.Generator().manual_seed(len(shape))
    if name in INTEGER_ARGUMENTS:
        return torch.randint(0, 3, shape, generator=generator)
    return torch.randn(shape, generator=generator)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_the_analysis_gives_the_shape_torch_returns(case, build):
    name, expression, shapes, *unknown = case
    arguments = " ".join(shapes)
    text = f"(require sexpgpu/nn)\n(require sexpgpu/optim)\n(defun forward ({arguments}) {expression})\n"
    module, _ = build(text)
    model = module.__dict__[module.__all__[0]]()
    returned = tuple(  # a size is a Python integer, of shape ()
        torch.as_tensor(
            model.forward(*(tensor(n, shape) for n, shape in shapes.items()))
        ).shape
    )

    program, graphs, graph = traced(text)
    given = {n: tuple(shape) for n, shape in shapes.items()}
    found = analysed(graph, program, given, graphs)[graph.output]
    blind = unknown[0] if unknown else set()
    assert found == tuple(
        None if axis in blind else size for axis, size in enumerate(returned)
    )
    op = REGISTRY[name]
    if op.expand is None:
        assert (
            graph.output.op is op
        )  # the output is the op's own node: its rule decided
    else:  # traced as its definition: the op's own rule must agree with it
        attrs = {key.name: key.default for key in op.keys}
        attrs.update(
            unknown[1] if len(unknown) > 1 else {}
        )  # its compile-time arguments
        assert op.rank.shape(list(given.values()), attrs) == found


@pytest.mark.parametrize("case", INTERNAL, ids=lambda case: case[0])
def test_an_internal_ops_rule_gives_the_shape_its_code_returns(case):
    name, shapes, given = case
    op = REGISTRY[name]
    values = {key.name: key.default for key in op.keys} | given
    context = EmitContext(
        "cuda",
        "f32",
        {k: _expression(v) for k, v in values.items()},
        values,
        (False,) * len(shapes),
    )
    code = cst.Module([]).code_for_node(op.emit([b.name(n) for n in shapes], context))
    arguments = {n: tensor(n, shape) for n, shape in shapes.items()}
    namespace = {"torch": torch, "F": F, "sx": runtime}
    returned = tuple(eval(code, namespace, arguments).shape)
    attrs = {k: _scalar(v) for k, v in values.items()}
    assert op.rank.shape([tuple(s) for s in shapes.values()], attrs) == returned


def _expression(value):
    if isinstance(value, tuple):
        return tuple(b.number(v) for v in value)
    return None if value is None else b.number(value)


def _scalar(value):
    if isinstance(value, tuple):
        return tuple(Scalar.lit(v) for v in value)
    return None if value is None else Scalar.lit(value)


def test_every_op_has_a_rank_rule_and_a_case():
    assert all(op.rank is not None for op in REGISTRY.values())
    public = {name for name, op in REGISTRY.items() if not op.internal}
    assert public == {case[0] for case in CASES}
    assert set(REGISTRY) - public == {case[0] for case in INTERNAL}


def _ranks(shapes: dict) -> dict:
    """{node: rank, or None where unknown}."""
    return {node: None if dims is None else len(dims) for node, dims in shapes.items()}


def test_arguments_have_unknown_rank_unless_given():
    program, _, graph = traced("""
(defun forward (x)
  (let ((all (sum x)) (some (sum x :axes [0])) (kept (sum x :keepdims true)))
    (+ (relu x) all some kept)))
""")
    found = _ranks(made(graph))
    by_name = {node.name: found[node] for node in graph.nodes if node.name}
    assert by_name == {"all": 0, "some": None, "kept": None}
    assert found[graph.inputs[0]] is None and found[graph.output] is None
    given = _ranks(analysed(graph, program, {"x": (None, 5)}))
    assert given[graph.output] == 2


def test_parameters_have_their_initializers_shape_a_const_size_unknown():
    program, _, graph = traced("""
(defconst d 8)
(defparam w (normal [d 3]))
(defparam e (eye 4))
(defparam k (eye d))
(defparam b (zeros [3]))
(defun forward (x) (+ (matmul (matmul e (matmul k w)) b) (* 2 d)))
""")
    found = made(graph)
    params = {n.attrs["param"]: found[n] for n in graph.nodes if n.kind is Kind.PARAM}
    assert params == {"w": (None, 3), "e": (4, 4), "k": (None, None), "b": (3,)}
    assert found[graph.output] == (4,)


def test_a_concat_parameter_has_the_sum_of_its_parts_sizes():
    program, _, graph = traced("""
(defconst n 3)
(defparam s (concat [(full [4] 1.05) (tensor [0.5 1]) (zeros [1])]))
(defparam t (concat [(full [n] 1.05) (zeros [1])]))
(defun forward (x) (+ (sum s) (sum t)))
""")
    found = made(graph)
    params = {n.attrs["param"]: found[n] for n in graph.nodes if n.kind is Kind.PARAM}
    assert params == {"s": (7,), "t": (None,)}


def test_calls_have_their_callees_output_shape():
    text = """
(defmodel block (&key (d 4))
  (defparam w (normal [d 6]))
  (defun forward (x) (relu w)))
(defparam layer (block))
(defparam layers (stack 2 (block)))
(defparam none (stack 0 (block)))
(defparam v (normal [3 4]))
(defun square-of (x) (matmul v (transpose v [1 0])))
(defun forward (x)
  (let ((a (square-of x)) (b (layer x)) (c (chain layers x)) (d (chain none x)))
    (+ (sum a) (sum b) (sum c) (sum d))))
"""
    program, graphs, graph = traced(text)
    found = analysed(graph, program, graphs=graphs)
    by_name = {node.name: found[node] for node in graph.nodes if node.name}
    assert by_name == {"a": (3, 3), "b": (None, 6), "c": (None, 6), "d": None}
    alone = made(graph)  # as the calls were made, before their callees': unknown
    assert {alone[n] for n in graph.nodes if n.kind in (Kind.CALL, Kind.SUBMODEL)} == {
        None
    }


def test_check_passes_where_a_const_could_make_the_sizes_agree():
    program, graphs, _ = traced("""
(defconst d 5)
(defparam a (normal [3 4]))
(defparam b (normal [d 6]))
(defun forward (x) (+ (matmul a b) (reshape x [3 6])))
""")
    ranks.check(graphs)


# A chain whose first op reads an argument of unknown rank: the sizes its literal operands
# give are followed to the mismatch further down (line 4 of the source below), with the
# same chain in plain PyTorch, which fails for an X of any rank.
CHAINS = [
    (
        "matmul",
        "(matmul (matmul x a) b)",
        lambda x, a, b: (x @ a) @ b,
        "matmul of [... 8] and [5 3]: the inner sizes differ (8 against 5)",
    ),
    (
        "broadcast",
        "(+ (matmul x a) c)",
        lambda x, a, c: (x @ a) + c,
        "the shapes [... 8] and [6] do not broadcast: 8 against 6 on axis -1",
    ),
    (
        "broadcast-then-matmul",
        "(matmul (* x a) b)",
        lambda x, a, b: (x * a) @ b,
        "matmul of [... 4 8] and [5 3]: the inner sizes differ (8 against 5)",
    ),
    (
        "transpose",
        "(matmul b (transpose (matmul x a) [1 0]))",
        lambda x, a, b: b @ (x @ a).permute(1, 0),
        "matmul of [5 3] and [8 ?]: the inner sizes differ (3 against 8)",
    ),
    (
        "swap-axes",
        "(matmul (swap-axes (+ x a) -1 -2) b)",
        lambda x, a, b: (x + a).transpose(-1, -2) @ b,
        "matmul of [... 8 4] and [5 3]: the inner sizes differ (4 against 5)",
    ),
    (
        "reshape",
        "(matmul (matmul (reshape x [-1 4]) a) b)",
        lambda x, a, b: (x.reshape(-1, 4) @ a) @ b,
        "matmul of [? 8] and [5 3]: the inner sizes differ (8 against 5)",
    ),
    (
        "softmax",
        "(matmul (softmax (matmul x a) :axis -1) b)",
        lambda x, a, b: torch.softmax(x @ a, -1) @ b,
        "matmul of [... 8] and [5 3]: the inner sizes differ (8 against 5)",
    ),
]
CHAIN_PARAMS = {"a": [4, 8], "b": [5, 3], "c": [6]}


def _chain_source(expression: str, params: dict) -> str:
    declared = "".join(
        f"(defparam {k} (normal {v}))\n".replace(",", "") for k, v in params.items()
    )
    return declared + f"(defun forward (x)\n  {expression})\n"


@pytest.mark.parametrize("case", CHAINS, ids=[c[0] for c in CHAINS])
def test_a_mismatch_down_a_chain_of_ops_is_a_located_error(case):
    _, expression, in_torch, message = case
    source = _chain_source(expression, CHAIN_PARAMS)
    with pytest.raises(SourceError) as raised:
        compile_string(source, "chain.lisp")
    assert (raised.value.line, raised.value.column) == (5, 3)
    assert raised.value.message == message
    names = [n for n in ("a", "b", "c") if n in expression]
    params = [torch.randn(CHAIN_PARAMS[n]) for n in names]
    for shape in ([2, 4], [3, 2, 4], [4]):
        with pytest.raises(RuntimeError):
            in_torch(torch.randn(shape), *params)


@pytest.mark.parametrize(
    "expression, params, x",
    [
        ("(matmul (matmul x a) b)", {"a": [4, 8], "b": [8, 3]}, [3, 2, 4]),
        ("(matmul (matmul x a) v)", {"a": [4, 8], "v": [8]}, [2, 4]),
        ("(+ (matmul x a) c)", {"a": [4, 8], "c": [8]}, [4]),
        ("(matmul (* x a) b)", {"a": [4, 8], "b": [8, 3]}, [2, 1, 1]),
        ("(matmul (swap-axes (+ x a) -1 -2) b)", {"a": [4, 8], "b": [4, 2]}, [4, 1]),
        (
            "(matmul b (transpose (matmul x a) [1 0]))",
            {"a": [4, 8], "b": [5, 8]},
            [2, 4],
        ),
        ("(matmul (matmul x a) (matmul x a))", {"a": [4, 4]}, [4, 4]),
    ],
)
def test_a_chain_that_can_run_compiles_and_runs(expression, params, x, build):
    module, _ = build(_chain_source(expression, params))
    model = module.Model()
    out = model(torch.randn(x))
    assert torch.isfinite(out).all()


def test_a_chain_through_a_const_size_is_not_refused():
    program, graphs, _ = traced("""
(defconst d 5)
(defparam a (normal [4 8]))
(defparam b (normal [d 3]))
(defun forward (x) (matmul (matmul x a) b))
""")
    ranks.check(graphs)


# Values known when the file compiles that torch refuses when the module is built or run:
# each is a located diagnostic, and the same call in plain PyTorch fails.
REFUSED_WHEN_RUN = [
    (
        "(defparam w (normal [4 4]))\n(defun forward (x) (* x (at w 100)))\n",
        (2, 25),
        "index 100 is out of range for the first axis of [4 4] (size 4)",
        lambda: torch.randn(4, 4)[100],
    ),
    (
        "(defparam w (normal [4 4]))\n(defun forward (x) (* x (at w -5)))\n",
        (2, 25),
        "index -5 is out of range for the first axis of [4 4] (size 4)",
        lambda: torch.randn(4, 4)[-5],
    ),
    (
        "(defparam w (repeat -1 (normal [4])))\n(defun forward (x) (* x w))\n",
        (1, 21),
        "repeat's count must not be negative, got -1",
        lambda: torch.randn(4).repeat(-1),
    ),
    (
        "(defun forward (x) (* x (linspace x 0.0 1.0 -3)))\n",
        (1, 25),
        "linspace's steps must not be negative, got -3",
        lambda: torch.linspace(0.0, 1.0, -3),
    ),
    (
        "(defun forward (x) (* x (arange x 0 4 0)))\n",
        (1, 25),
        "arange's step must not be 0",
        lambda: torch.arange(0, 4, 0),
    ),
    (
        "(defun forward (x) (* x (arange x 5 0 1)))\n",
        (1, 25),
        "arange from 5 to 0 by 1: the step goes away from the end",
        lambda: torch.arange(5, 0, 1),
    ),
    (
        "(defparam v (normal [4]))\n(defun forward (x) (* x (transpose v [1 0])))\n",
        (2, 25),
        "transpose of [4] by a permutation of 2 axes: PERM names each of X's axes once",
        lambda: torch.randn(4).permute(1, 0),
    ),
    (
        "(defparam w (normal [4 4]))\n(defun forward (x) (* x (transpose w [0 0])))\n",
        (2, 25),
        "transpose of [4 4] by [0 0]: PERM names each of X's axes once",
        lambda: torch.randn(4, 4).permute(0, 0),
    ),
    (
        "(defparam v (normal [4]))\n(defun forward (x) (let ((y (* x 1.0))) (attention y v x)))\n",
        (2, 41),
        "attention's K is [4]: each of Q, K and V needs at least two axes, [..., T, D]",
        lambda: torch.nn.functional.scaled_dot_product_attention(
            torch.randn(3, 4), torch.randn(4), torch.randn(3, 4)
        ),
    ),
]


@pytest.mark.parametrize(
    "source, where, message, in_torch", REFUSED_WHEN_RUN, ids=lambda c: None
)
def test_a_size_index_or_rank_known_when_compiling_is_checked(
    source, where, message, in_torch
):
    with pytest.raises(SourceError) as raised:
        compile_string(source, "known.lisp")
    assert ((raised.value.line, raised.value.column), raised.value.message) == (
        where,
        message,
    )
    with pytest.raises((RuntimeError, IndexError)):
        in_torch()


def test_the_ranks_pass_runs_the_rules_only_where_calls_change_shapes(monkeypatch):
    """Each node is shaped as it is made; the ranks pass runs a rule again only on what a
    call reaches: a call's value, its readers, and a callee whose arguments a call shapes
    (a long expression's ranks pass was twice its analysis, then once)."""
    program, graphs, _ = traced("""
(defparam w (normal [3 4]))
(defun scaled (x) (* 2.0 (sin x)))
(defun gram (x) (matmul w (transpose w [1 0])))
(defun forward (x) (+ (sin x) (scaled w) (gram x) (cos x)))
""")
    counted: list = []
    node_shape = Analysis._node

    def counting(self, node, model, found):
        counted.append(node)
        return node_shape(self, node, model, found)

    monkeypatch.setattr(Analysis, "_node", counting)
    ranks.run(program, graphs)
    forward = graphs[program.top.name, "forward"]
    scaled = graphs[program.top.name, "scaled"]
    runs = [(n.what, counted.count(n)) for n in forward.nodes]
    # gram's value is known alone, scaled's only as forward calls it: the sums from gram's on
    assert runs == [
        ("sin", 0),
        ("param", 0),
        ("call", 1),
        ("call", 1),
        ("cos", 0),
        ("+", 0),
        ("+", 1),
        ("+", 1),
    ]
    assert [counted.count(n) for n in scaled.nodes] == [1, 1]
    assert scaled.output.shape.dims == (3, 4) and forward.output.shape.dims is None
