"""The `if __name__ == "__main__":` block of a trainable run: the model class and a literal of
the run's settings, handed to the loop in sx2torch/runtime/train.py."""

from __future__ import annotations

import libcst as cst

import sx2torch.build as b
from sx2torch.ops import initializers
from sx2torch.syntax.program import LISTS, Model, Optimizer, Program, Run

# torch's own defaults, written into the settings so that every value the run uses is visible
DEFAULTS = {
    "adamw": {"lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-08, "weight_decay": 0.01},
    "muon": {
        "lr": 0.001,
        "momentum": 0.95,
        "weight_decay": 0.1,
        "nesterov": True,
        "ns_steps": 5,
    },
}


def block(
    program: Program, run: Run, class_name: str, loss_method: str, attrs: dict
) -> cst.If:
    settings = {"loss": loss_method}
    for key in ("steps", "batch_size", "seq_len", "grad_clip"):
        if getattr(run, key) is not None:
            settings[key] = getattr(run, key)
    if run.warmup or run.cooldown:
        settings["schedule"] = {"warmup": run.warmup, "cooldown": run.cooldown}
    if run.inputs is not None:
        settings["inputs"] = {
            i.name.name: {"shape": i.shape}
            | ({"high": i.high} if i.high is not None else {})
            for i in run.inputs
        }
    if isinstance(run.generate, str):  # its `generate` command starts a decoder
        settings["encoder_decoder"] = True
    settings["optimizers"] = _optimizers(
        run.optimizer or Optimizer("adamw", {}), _params(program, program.top, attrs)
    )
    code = (
        'if __name__ == "__main__":\n'
        "    from sx2torch.runtime import train\n\n"
        f"    train.main({class_name}, {b.code(b.literal(settings))})\n"
    )
    statement = cst.parse_statement(code)
    return statement.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])


def _optimizers(optimizer: Optimizer, params: list) -> list:
    """One entry per optimizer, each naming its parameters (`*` stands for a layer's index):
    Muon takes the matrices inside sub-models, as modded-nanogpt does; AdamW the rest.
    """
    if optimizer.kind == "muon":
        matrices = [name for name, inside, ndim in params if inside and ndim == 2]
        rest = [name for name, inside, ndim in params if not (inside and ndim == 2)]
        groups = [(optimizer, matrices), (optimizer.rest, rest)]
    else:
        groups = [(optimizer, [name for name, _, _ in params])]
    return [
        {"name": o.kind} | DEFAULTS[o.kind] | o.settings | {"params": names}
        for o, names in groups
        if names
    ]


def _params(
    program: Program, model: Model, attrs: dict, prefix: str = "", normed: str = ""
) -> list:
    """[(state_dict name pattern, inside a sub-model, ndim)] of the trainable parameters;
    `normed`, the parameter a weight-norm holds as its g and v."""
    names = attrs[model.name]
    found = []
    for param in model.params.values():
        name = prefix + names[param.name]
        for k, init in enumerate(param.init.instances if param.is_module else ()):
            sub = program.models[init.model]
            inner = f"{name}.*." if init.kind == "stack" else f"{name}."
            inner += f"{k}." if param.init.kind in LISTS else ""
            norm = init.weight_norm.name.name if init.weight_norm else ""
            found += _params(program, sub, attrs, inner, norm)
        if param.is_module or not param.trainable:
            continue
        ndim = len(initializers.sizes(param.init))
        if param.name == normed:
            # g, one norm per slice along dim, counts as a vector: Muon would
            # orthogonalize the [out, 1] norms of a Linear's
            torch_name = f"{prefix}parametrizations.{names[param.name]}.original"
            found += [(torch_name + "0", True, 1), (torch_name + "1", True, ndim)]
        else:
            found.append((name, bool(prefix), ndim))
    return found
