"""The naming pass on its own: the names it gives, read from its output before emission."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.nn import functional as F

from sx2torch import compiler
from sx2torch.compiler import Options, Unit
from sx2torch.ir import Kind, walk

ROOT = Path(__file__).resolve().parents[2]


def names_of(source: str, precision: str = "bf16", target: str = "cuda"):
    """The names a compile gives, its passes run through `names`, for a defrun of
    `precision`."""
    return compiled(source, precision, target).names


def compiled(source: str, precision: str = "bf16", target: str = "cuda"):
    text = f"{source}\n(defrun r :precision :{precision})\n"
    unit = Unit(text, "model.lisp", Options(target=target))
    return compiler.run(unit, until="names")


def method(result, name: str, model: str = "model"):
    return next(t for t, n in result.methods.items() if n == name and t.model == model)


def test_a_let_name_is_never_given_to_a_temporary():
    """`h` is bound by the source twice; the temporary `relu` beside it gets a name of
    its own, and each `h` keeps its source name."""
    result = names_of("""
(defparam w (normal [4 4]))
(defun forward (x)
  (let ((h (matmul x w))
        (h (+ (relu h) (relu (neg h)))))
    (* h h)))
""")
    locals_ = result.locals[method(result, "forward")]
    by_source = [
        name
        for node, name in locals_.values.items()
        if node.kind is Kind.OP and node.name
    ]
    assert by_source == ["h", "h"]
    assert all(
        name.startswith(node.name) for node, name in locals_.values.items() if node.name
    )


def test_a_dead_local_gives_its_name_but_a_live_one_does_not():
    result = names_of(
        """
(defun forward (x)
  (let ((a (exp x))
        (b (exp (+ a 1)))
        (c (exp (+ b a))))
    (+ c b)))
""",
        precision="f32",
    )
    values = result.locals[method(result, "forward")].values
    assert sorted(n for node, n in values.items() if node.name) == ["a", "b", "c", "x"]


def test_the_loop_variables_and_carried_values_take_the_source_names():
    result = names_of("""
(defmodel block ()
  (defparam w (normal [4 4]))
  (defun forward (x) (matmul x w)))
(defparam blocks (stack 3 (block)))
(defun forward (x0)
  (let (([x skip]
         (for (i layer blocks) ((x x0) (skip x0))
           [(layer x) (if (= i 1) x skip)])))
    (- x skip)))
""")
    typed = method(result, "forward")
    locals_ = result.locals[typed]
    (loop,) = [n for n in walk(typed.graph.nodes) if n.kind is Kind.FOR]
    assert locals_.loops[loop] == ("i", "layer")
    (body,) = loop.regions
    assert [locals_.values[c] for c in body.inputs] == ["x", "skip"]
    assert locals_.values[typed.graph.inputs[0]] == "x0"


def test_a_value_read_inside_a_loop_keeps_its_name_until_the_loop_ends():
    """The outer `g` is read by every iteration: the inner `g`, bound after the last
    read of the outer one in the body, must not take its name."""
    result = names_of("""
(defmodel block ()
  (defparam w (normal [4 4]))
  (defun forward (x g) (* (matmul x w) g)))
(defparam blocks (stack 3 (block)))
(defun forward (x0)
  (let ((g (exp x0)))
    (for (i layer blocks) ((x x0))
      (let ((h (layer x g))
            (g (exp h)))
        (* g g)))))
""")
    typed = method(result, "forward")
    values = result.locals[typed].values
    outer, inner = [n for n in walk(typed.graph.nodes) if n.name == "g"]
    assert values[outer] == "g" and values[inner] == "g_2"


def test_specializations_are_named_after_the_source_defuns_they_do_not_shadow():
    """On a held target f's bf16 specialization reads x through `sx.as_f32` for its
    island, so it is a method of its own (its name taken by the source's f-bf16)."""
    unit = compiled(
        """
(require sexpgpu/nn)
(defparam w (normal [4 4]))
(defun f (x) (matmul (softmax x) w))
(defun f-bf16 (x) (neg x))
(defun forward (x) (+ (f (f x)) (f-bf16 x)))
""",
        target="cpu",
    )
    result, plans = unit.names, unit.plans
    by_name = {name: t.graph.name for t, name in result.methods.items()}
    assert by_name["f"] == "f" and by_name["f_bf16"] == "f-bf16"
    assert by_name["f_bf16_2"] == "f"
    assert method(result, "f_bf16_2") in plans.specialized


def test_a_const_does_not_take_the_name_of_a_class_its_constructor_builds():
    result = names_of("""
(defconst Block 3)
(defmodel block () (defparam w (normal [2 2])) (defun forward (x) (matmul x w)))
(defparam b (block))
(defun forward (x) (* (b x) Block))
""")
    assert result.classes["block"] == "Block"
    assert result.attrs["model"]["Block"] == "Block_"


def test_a_carried_value_rebound_in_the_body_keeps_its_source_name(build):
    """`(let ((x (+ x ...))) ...)` inside a loop carrying x: once the body has read the
    carried x for the last time, the new x takes its name (it was `x_2`, with `x` written
    back by the loop's store), and a carried value left as it is is not stored again."""
    source = """
(defmodel block ()
  (defparam w (normal [4 4]))
  (defun forward (x) (matmul x w)))
(defparam blocks (stack 3 (block)))
(defun forward (x0)
  (let (([x skip]
         (for (i layer blocks) ((x x0) (skip x0))
           (let ((x (+ x (* 0.5 skip)))
                 (x (layer x)))
             [x (if (= i 1) x skip)]))))
    (- x skip)))
"""
    module, code = build(source)
    assert "x = x + 0.5 * skip" in code and "x_2" not in code
    assert "skip = x if i == 1 else skip" in code
    model = module.Model()
    x0 = torch.randn(2, 4)
    x, skip = x0, x0
    for i, block in enumerate(model.blocks):
        x = (x + 0.5 * skip) @ block.w
        skip = x if i == 1 else skip
    assert torch.equal(model(x0), x - skip)


def test_an_if_statement_is_named_as_its_first_branchs_value(build):
    source = """
(defparam w (normal [4 4]))
(defun forward (x &key (gated true))
  (let ((h (matmul x w)))
    (if gated (let ((r (relu h))) (* r 2.0)) (exp h))))
"""
    module, code = build(source)
    assert "if_" not in code and "mul_r = r * 2.0" in code
    model = module.Model()
    x = torch.randn(2, 4)
    h = x @ model.w
    assert torch.equal(model(x), torch.relu(h) * 2.0)
    assert torch.equal(model(x, gated=False), torch.exp(h))


def test_a_name_bound_to_another_name_keeps_its_name(build):
    """`saved-early` names the first `x`, which `x` is then rebound around: the output
    assigns it by its name and reads it so, and no temporary takes its place."""
    model, code = build(
        """
(defparam w (normal [4 4]))
(defun forward (x)
  (let ((x (matmul x w))
        (saved-early x)
        (x (tanh (matmul x w)))
        (x (+ x saved-early)))
    x))
""",
        run=None,
    )
    body = code.split("def forward(self, x):\n")[1].split("\n\n")[0]
    assert body.splitlines() == [
        "        x = x @ self.w",
        "        saved_early = x",
        "        x = torch.tanh(saved_early @ self.w)",
        "        x = x + saved_early",
        "        return x",
    ]
    net, x = model.Model(), torch.randn(3, 4)
    early = x @ net.w
    torch.testing.assert_close(
        net(x), torch.tanh(early @ net.w) + early, rtol=0, atol=0
    )


def test_a_sub_model_called_only_with_bf16_is_one_method_casting_at_entry(build):
    """No f32 copy of the block that nothing calls: its one forward casts f32 from
    outside at entry, and inside the model reads the bf16 value as it is."""
    module, code = build(
        """
(defmodel block ()
  (defparam w (normal [4 4]))
  (defun forward (x) (+ x (relu (matmul x w)))))
(defparam w0 (normal [4 4]))
(defparam b (block))
(defun forward (x) (b (matmul x w0)))
(defrun train :precision :bf16)
""",
        run="train",
    )
    methods = [name for name in vars(module.Block) if not name.startswith("__")]
    assert methods == ["forward"]
    assert "x = x.to(torch.bfloat16)" in code
    net, x = module.Model(), torch.randn(3, 4)
    bf16 = torch.bfloat16
    h = x.to(bf16) @ net.w0.to(bf16)
    expected = h + torch.relu(h @ net.b.w.to(bf16))
    assert torch.equal(net(x), expected) and net(x).dtype == bf16
    assert torch.equal(net.b(x), net.b(x.to(bf16)))


def test_a_specialization_kept_beside_the_public_method_says_why(build):
    """The bf16 gate computes its sigmoid in bf16 where the public f32 one computes it in
    f32, so it is a method of its own, and its comment says so."""
    _, code = build(
        """
(defparam w (normal [4 4]))
(defun gate (x) (* x (sigmoid x)))
(defun forward (x) (+ (gate x) (gate (matmul x w))))
(defrun train :precision :bf16)
""",
        run="train",
    )
    lines = code.splitlines()
    at = lines.index("    def gate_bf16(self, x):")
    assert lines[at - 2 : at] == [
        "    # a method of its own: (sigmoid x) is bf16 here, f32 in gate",
        "    # gate for x: bf16",
    ]


def test_mixed_matmul_and_products_are_parenthesized_and_no_local_is_a_method(build):
    module, code = build(
        """
(defparam w (normal [4 4]))
(defun forward (x) (* (matmul (* x 2.0) w) 3.0))
(defun loss (x) (sum (reshape (forward x) [-1])))
""",
    )
    assert "return ((x * 2.0) @ self.w) * 3.0" in code
    # the reshape reads no size of its input, so the call is no local of its own
    assert "return torch.sum(self.forward(x).reshape(-1))" in code
    assert "forward =" not in code
    net, x = module.Model(), torch.randn(3, 4)
    assert torch.equal(net(x), ((x * 2.0) @ net.w) * 3.0)


TABLE = """
(defparam wte (normal [16 4]))
(defun forward (ids) (take wte ids))
(defrun train :precision :bf16)
"""


def test_a_table_is_gathered_then_cast_and_repeated_ids_sum_in_f32(build):
    """The rows are cast, not the table: the same bits (the cast is elementwise), and the
    master's gradient sums repeated ids in f32, as the cast's backward widens each row.
    """
    module, code = build(TABLE, run="train")
    assert "return self.wte[ids].to(torch.bfloat16)" in code
    assert "wte_bf16" not in code
    net = module.Model()
    ids = torch.tensor([[3, 3, 3, 5], [3, 7, 3, 3]])
    out = net(ids)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, net.wte.to(torch.bfloat16)[ids])
    upstream = torch.linspace(-1.0, 1.0, out.numel()).reshape(out.shape)
    upstream = (1.0 + upstream / 3).to(torch.bfloat16)
    (grad,) = torch.autograd.grad(out, net.wte, upstream)
    expected = torch.zeros(16, 4).index_add_(
        0, ids.reshape(-1), upstream.float().reshape(-1, 4)
    )
    assert torch.equal(grad, expected)
    held, held_code = build(TABLE, run="train", target="cpu")
    assert "return sx.round_to_bf16(self.wte[ids])" in held_code
    rows = held.Model()
    rows.load_state_dict(net.state_dict())
    assert torch.equal(rows(ids), out.float())


def test_a_method_serves_the_dtypes_its_casts_are_identities_on(build):
    """Called with f32 and with bf16, a sub-model's f32 method casts its argument where
    it reads it, a no-op on bf16: so it is the bf16 callers' method too (no
    `forward_bf16`), and the public forward takes bf16 from outside (issue 21: a public
    forward raised `expected scalar type Float but found BFloat16`)."""
    module, code = build(
        """
(defmodel lin ()
  (defparam w (normal [4 4]) :dtype :bf16)
  (defun forward (x) (relu (matmul x w))))
(defparam l (lin))
(defparam w0 (normal [4 4]))
(defun forward (x) (+ (l (matmul x w0)) (l x)))
(defrun train :precision :bf16)
""",
        run="train",
    )
    assert "_bf16(" not in code
    assert [n for n in vars(module.Lin) if not n.startswith("__")] == ["forward"]
    net, x = module.Model(), torch.randn(3, 4)
    bf16 = torch.bfloat16
    h = x.to(bf16) @ net.w0.to(bf16)
    expected = torch.relu(h @ net.l.w) + torch.relu(x.to(bf16) @ net.l.w)
    assert torch.equal(net(x), expected)
    assert torch.equal(net.l(h), torch.relu(h @ net.l.w))
    assert torch.equal(net.l(x), net.l(x.to(bf16)))


def test_a_temporary_made_for_one_operand_is_named_as_the_operand(build):
    """Cross-entropy's operands say what they are: the reshapes made for them alone are
    `logits` and `labels`, as transformers names them (they were
    `reshape_forward_input_ids` and `reshape_targets`); a name the source gives to a value
    of its own is left to it, and the temporary is named as before."""
    loss = """
(defparam w (normal [4 6]))
(defun forward (x) (matmul x w))
(defun loss (input-ids targets)
  (cross-entropy (reshape (forward input-ids) [-1 6]) (reshape targets [-1])))
"""
    result = names_of(loss)
    named = set(result.locals[method(result, "loss")].values.values())
    assert {"logits", "labels"} <= named
    result = names_of(loss.replace("targets", "labels"))
    named = set(result.locals[method(result, "loss")].values.values())
    assert "logits" in named and "reshape_labels" in named
    module, code = build(loss + "(defrun r :precision :bf16)\n")
    torch.manual_seed(0)
    model = module.Model()
    ids, targets = torch.randn(2, 3, 4), torch.randint(0, 6, (2, 3))
    logits = (ids.to(torch.bfloat16) @ model.w.to(torch.bfloat16)).float()
    wanted = torch.nn.functional.cross_entropy(logits.reshape(-1, 6), targets.reshape(-1))
    assert torch.equal(model.loss(ids, targets), wanted), code


def test_two_values_an_op_makes_of_one_input_take_two_names(build):
    """A temporary named after its op and input (`slice_qkv`) is a computation of its own:
    a second one gets a name of its own, not the first's dead name, which would read as
    one value; a transpose is written `.permute`, and named so."""
    module, code = build("""
(defun forward (qkv)
  (let ((q (fused-rms-norm (slice qkv :axis -1 :end 2)))
        (k (fused-rms-norm (slice qkv :axis -1 :start 2)))
        (qt (transpose q [1 0])))
    (+ (matmul qt k) (matmul qt q))))
(defrun train :precision :f32)
""")
    assert "slice_qkv = qkv[..., :2]" in code
    assert "slice_qkv_2 = qkv[..., 2:]" in code
    assert "permute_q = q.permute(1, 0)" in code or "qt = q.permute(1, 0)" in code
    qkv = torch.randn(4, 4)
    q = F.rms_norm(qkv[:, :2], (2,))
    k = F.rms_norm(qkv[:, 2:], (2,))
    assert torch.equal(module.Model()(qkv), q.T @ k + q.T @ q)


def test_a_transpose_is_named_as_the_permute_it_is_written(build):
    _, code = build("""
(defun forward (q)
  (fused-rms-norm (transpose q [0 2 1])))
(defrun train :precision :f32)
""")
    assert "transpose_q" not in code and "permute_q" in code


def test_a_specialization_for_integer_arguments_is_named_int(build):
    """T5's bucket is called with integer positions, and from outside with f32: the method
    of its own takes integers, so it is named with them, not `_f32`."""
    _, code = build((ROOT / "examples" / "t5.lisp").read_text(), "t5.lisp")
    assert "def relative_position_bucket_int(" in code
    assert "_f32(" not in code
