"""Every op: the registry (sx2torch/ops/registry.py) filled by the op modules beside it, each
of which registers its entries when imported. Importing this package imports them all.
"""

import importlib
import pkgutil

from sx2torch.ops.registry import (
    REGISTRY,
    SYMBOLIC,
    Arg,
    ArgKind,
    EmitContext,
    Key,
    Op,
    Result,
    register,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "REGISTRY",
    "SYMBOLIC",
    "Arg",
    "ArgKind",
    "EmitContext",
    "Key",
    "Op",
    "Result",
    "register",
]
