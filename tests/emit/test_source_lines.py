"""--source-lines: a `# file.lisp:LINE:COL` comment after each statement, and nothing else changes."""

import re

import black

from cases import EXAMPLES
from sx2torch.compiler import Options, compile_source

SOURCE = (EXAMPLES / "rms-mlp.lisp").read_text()


def test_statements_name_their_source_line():
    code = compile_source(SOURCE, "rms-mlp.lisp", Options(source_lines=True))
    assert (
        "h = torch.relu(x.to(torch.bfloat16) @ w1_bf16 + b1_bf16)  # rms-mlp.lisp:19:12"
        in code
    )
    assert (
        "return sx.matmul_f32_out(self.rms_norm_star(h), w2_bf16)  # rms-mlp.lisp:20:5"
        in code
    )


def test_without_the_comments_the_code_is_the_default_output():
    located = compile_source(SOURCE, "rms-mlp.lisp", Options(source_lines=True))
    plain = compile_source(SOURCE, "rms-mlp.lisp")
    stripped = re.sub(r"  # rms-mlp\.lisp:\d+:\d+$", "", located, flags=re.M)
    flags = "(flags: --run train --target cuda --source-lines)."
    assert flags in located.splitlines()[1]  # the header says how to compile it again
    stripped = stripped.replace(flags, "(flags: --run train --target cuda).")
    assert (
        black.format_str(stripped, mode=black.Mode()) == plain
    )  # black rewraps the shorter lines
