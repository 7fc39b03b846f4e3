"""Pass 7, format: the emitted module -> black's formatting of it, byte for byte.

Black's time grows faster than a file's length (a 21,000-line module takes 2.6x the time of
its classes formatted one by one), so each class is formatted alone and the pieces joined
as black joins top-level blocks, with two blank lines. Black's output also depends on the
Python versions it infers from the file's syntax; those are inferred from every piece
(the file's features are the union of the pieces'), and each piece is formatted for them.
"""

import black
import libcst as cst


def run(tree: cst.Module) -> str:
    pieces = _pieces(tree)
    versions = set(black.TargetVersion)
    for piece in pieces:
        node = black.lib2to3_parse(piece.lstrip())
        future = black.get_future_imports(node)
        versions &= black.detect_target_versions(node, future_imports=future)
    mode = black.Mode(target_versions=versions)
    return "\n\n".join(black.format_str(piece, mode=mode) for piece in pieces)


def _pieces(tree: cst.Module) -> list:
    """The module's code in pieces: each class alone, the statements between classes
    together; the header goes with the first, the footer with the last."""
    groups: list = []
    for statement in tree.body:
        if isinstance(statement, cst.ClassDef) or not groups or _is_class(groups[-1]):
            groups.append([statement])
        else:
            groups[-1].append(statement)
    last = len(groups) - 1
    return [
        tree.with_changes(
            body=group,
            header=tree.header if i == 0 else [],
            footer=tree.footer if i == last else [],
        ).code
        for i, group in enumerate(groups)
    ]


def _is_class(group: list) -> bool:
    return isinstance(group[0], cst.ClassDef)
