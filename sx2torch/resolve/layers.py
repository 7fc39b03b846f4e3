"""The layer library: torch.nn's layers as SexpGPU models, each spelled as its torch class
(`Linear`, `Conv2d`, ...), with torch's constructor arguments in torch's order, its
parameter names, shapes and default initialisation (docs/LANGUAGE.md, "The layer
library"). A program that makes an instance of one and defines no model of that name gets
its definition, read from the source below as any defmodel is: each becomes a class of the
generated module, written before the classes that use it."""

from __future__ import annotations

import functools
from dataclasses import replace

from sx2torch.syntax import read

# Each bias that torch makes optional is `:when has-bias`, passed as `:bias` (the key torch
# names it by: `bias` is the parameter's name in the model). The weights and biases of
# Linear and the convolutions draw as torch's reset_parameters does: kaiming-uniform with
# a = sqrt(5), then uniform in +-1/math.sqrt(fan_in), fan_in the weight's second axis
# times its kernel (the transposed convolutions' weight is [in, out/groups, k...]).
SOURCE = """
(defmodel Linear (&key in-features out-features ((:bias has-bias) true))
  "torch.nn.Linear: x W^T + b"
  (defparam weight (kaiming-uniform [out-features in-features] :a (sqrt 5)))
  (defparam bias (fan-in-uniform [out-features] :fan-in in-features) :when has-bias)
  (defun forward (x)
    (if has-bias (linear x weight bias) (linear x weight))))

(defmodel Embedding (&key num-embeddings embedding-dim (padding-idx none))
  "torch.nn.Embedding: rows of the table"
  (defparam weight (normal [num-embeddings embedding-dim] :padding-idx padding-idx))
  (defun forward (x) (take weight x :padding-idx padding-idx)))

(defmodel LayerNorm (&key normalized-shape (eps 1e-5) (elementwise-affine true)
                          ((:bias has-bias) true))
  "torch.nn.LayerNorm over the last axis"
  (defparam weight (ones [normalized-shape]) :when elementwise-affine)
  (defparam bias (zeros [normalized-shape]) :when (and elementwise-affine has-bias))
  (defun forward (x)
    (if (and elementwise-affine has-bias)
        (fused-layer-norm x weight bias :eps eps)
        (if elementwise-affine
            (fused-layer-norm x weight :eps eps)
            (fused-layer-norm x :eps eps)))))

(defmodel RMSNorm (&key normalized-shape (eps 1.1920928955078125e-07)
                        (elementwise-affine true))
  "torch.nn.RMSNorm over the last axis; eps torch's default, finfo(float32).eps"
  (defparam weight (ones [normalized-shape]) :when elementwise-affine)
  (defun forward (x)
    (if elementwise-affine
        (fused-rms-norm x weight :eps eps)
        (fused-rms-norm x :eps eps))))

(defmodel GroupNorm (&key num-groups num-channels (eps 1e-5) (affine true))
  "torch.nn.GroupNorm"
  (defparam weight (ones [num-channels]) :when affine)
  (defparam bias (zeros [num-channels]) :when affine)
  ;; one call, torch's: its weight and bias None where it has none (an f32 island, whose
  ;; operands are never cast, so None is passed as it is)
  (defun forward (x)
    (group-norm x num-groups (if affine weight none) (if affine bias none) :eps eps)))

(defmodel Conv1d (&key in-channels out-channels kernel-size (stride 1) (padding 0)
                       (dilation 1) (groups 1) ((:bias has-bias) true))
  "torch.nn.Conv1d"
  (defparam weight
    (kaiming-uniform [out-channels (// in-channels groups) kernel-size] :a (sqrt 5)))
  (defparam bias
    (fan-in-uniform [out-channels] :fan-in (* (// in-channels groups) kernel-size))
    :when has-bias)
  (defun forward (x)
    (if has-bias
        (conv1d x weight bias :stride stride :padding padding :dilation dilation
                :groups groups)
        (conv1d x weight :stride stride :padding padding :dilation dilation
                :groups groups))))

(defmodel Conv2d (&key in-channels out-channels kernel-size (stride 1) (padding 0)
                       (dilation 1) (groups 1) ((:bias has-bias) true))
  "torch.nn.Conv2d, a square kernel"
  (defparam weight
    (kaiming-uniform [out-channels (// in-channels groups) kernel-size kernel-size]
                     :a (sqrt 5)))
  (defparam bias
    (fan-in-uniform [out-channels]
                    :fan-in (* (// in-channels groups) kernel-size kernel-size))
    :when has-bias)
  (defun forward (x)
    (if has-bias
        (conv2d x weight bias :stride stride :padding padding :dilation dilation
                :groups groups)
        (conv2d x weight :stride stride :padding padding :dilation dilation
                :groups groups))))

(defmodel ConvTranspose1d (&key in-channels out-channels kernel-size (stride 1)
                                (padding 0) (output-padding 0) (groups 1)
                                ((:bias has-bias) true) (dilation 1))
  "torch.nn.ConvTranspose1d"
  (defparam weight
    (kaiming-uniform [in-channels (// out-channels groups) kernel-size] :a (sqrt 5)))
  (defparam bias
    (fan-in-uniform [out-channels] :fan-in (* (// out-channels groups) kernel-size))
    :when has-bias)
  (defun forward (x)
    (if has-bias
        (conv-transpose1d x weight bias :stride stride :padding padding
                          :output-padding output-padding :groups groups
                          :dilation dilation)
        (conv-transpose1d x weight :stride stride :padding padding
                          :output-padding output-padding :groups groups
                          :dilation dilation))))

(defmodel ConvTranspose2d (&key in-channels out-channels kernel-size (stride 1)
                                (padding 0) (output-padding 0) (groups 1)
                                ((:bias has-bias) true) (dilation 1))
  "torch.nn.ConvTranspose2d, a square kernel"
  (defparam weight
    (kaiming-uniform [in-channels (// out-channels groups) kernel-size kernel-size]
                     :a (sqrt 5)))
  (defparam bias
    (fan-in-uniform [out-channels]
                    :fan-in (* (// out-channels groups) kernel-size kernel-size))
    :when has-bias)
  (defun forward (x)
    (if has-bias
        (conv-transpose2d x weight bias :stride stride :padding padding
                          :output-padding output-padding :groups groups
                          :dilation dilation)
        (conv-transpose2d x weight :stride stride :padding padding
                          :output-padding output-padding :groups groups
                          :dilation dilation))))
"""


# torch.nn.utils.parametrizations.weight_norm, which wraps a layer rather than being one:
# resolve reads the form (resolve/initializers.py), emit writes torch's own call, and this
# is its row in the op table's layers (its usage, its parameters, what its forward reads)
WEIGHT_NORM_ROW = (
    "(weight-norm (LAYER ...) &key :name weight :dim 0)",
    "LAYER's, its NAME stored as torch stores it, `parametrizations.NAME.original0` (g: "
    "NAME's sizes, 1 on every axis but :dim) and `original1` (v), g the norms of the "
    "drawn v",
    "torch.nn.utils.parametrizations.weight_norm: LAYER's forward reads NAME as "
    "torch._weight_norm(v, g, dim), g v / ‖v‖, in f32 from the f32 masters (under "
    ":bf16 rounded where a bf16 op reads it, as bf16 autocast runs the layer); its "
    "derivative torch's autograd",
)


@functools.cache
def _data() -> dict:
    """Each layer's defmodel form, by name."""
    return {datum.items[1].name: datum for datum in read.run(SOURCE)}


def forms() -> list:
    """Every layer's defmodel form, in the library's order."""
    return list(_data().values())


def wanted(models: dict, top) -> list:
    """The defmodel forms of the library's layers the program makes instances of and does
    not define itself (`models`, its own by name; `top`, its top model), in the library's
    order. Each form is placed at the program's first instance of it: what the compiler
    reports inside a layer (a warning, a shape that cannot fit, explain's lines) points
    there, in the program's own file."""
    first: dict = {}
    for model in [top, *models.values()]:
        for param in model.params.values():
            for init in param.init.instances if param.is_module else ():
                if init.model not in first or init.span < first[init.model]:
                    first[init.model] = init.span
    return [
        _placed(form, first[name])
        for name, form in _data().items()
        if name in first and name not in models
    ]


def _placed(datum, span):
    """`datum` with every span `span`."""
    items = getattr(datum, "items", None)
    if items is None:
        return replace(datum, span=span)
    return replace(datum, span=span, items=tuple(_placed(i, span) for i in items))
