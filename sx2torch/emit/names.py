"""Lisp names -> Python identifiers that shadow and capture nothing.

`mangle` (sx2torch/syntax/names.py) spells a source name as an identifier. A `Namespace` hands out
names within one scope (a method, or a class's attributes): reserved names get
a trailing underscore, and two values wanting one name are numbered per base
name (`x`, `x_2`), so a change in one function never renames things in another.
"""

from __future__ import annotations

import builtins
import keyword
from sx2torch.syntax.names import mangle

# What the generated module itself binds: its imports, and `self`.
MODULE_NAMES = {"torch", "nn", "F", "sx", "self", "super", "__all__"}
# nn.Module's own attributes (torch 2.13), which a parameter, const or method must not replace;
# `forward` is meant to be replaced, and only the defun of that name can take it.
MODULE_ATTRIBUTES = set(
    """T_destination add_module apply bfloat16 buffers call_super_init children compile cpu cuda
    double dump_patches eval extra_repr float get_buffer get_extra_state get_parameter
    get_submodule half ipu load_state_dict modules mtia named_buffers named_children named_modules
    named_parameters parameters register_backward_hook register_buffer register_forward_hook
    register_forward_pre_hook register_full_backward_hook register_full_backward_pre_hook
    register_load_state_dict_post_hook register_load_state_dict_pre_hook register_module
    register_parameter register_state_dict_post_hook register_state_dict_pre_hook requires_grad_
    set_extra_state set_submodule share_memory state_dict to to_empty train type xpu zero_grad
    training""".split()
)
RESERVED = (
    set(keyword.kwlist) | set(keyword.softkwlist) | set(dir(builtins)) | MODULE_NAMES
)


def plain_attribute(key: str) -> bool:
    """Whether `self.KEY` reads the member registered under KEY."""
    return not keyword.iskeyword(key) and key not in MODULE_ATTRIBUTES


class Namespace:
    def __init__(self, reserved: set = frozenset()):
        self.reserved = RESERVED | set(reserved)
        self.taken: set[str] = set()

    def fresh(
        self, base: str, reusable=lambda name: False, avoid: frozenset = frozenset()
    ) -> str:
        """A name for a new value; `reusable(name)` says a taken name's old value is dead;
        `avoid` holds names this one must not shadow, as the reserved ones."""
        base = mangle(base)
        if base in self.reserved or base in avoid:
            base += "_"
        candidate, n = base, 1
        while candidate in self.taken and not reusable(candidate):
            n += 1
            candidate = f"{base}_{n}"
        self.taken.add(candidate)
        return candidate
