"""The format pass: the emitted module's text -> black's formatting of it.

Black is the formatter of record. Given a whole module, it parses and formats all of it
twice (a second pass settles the trailing commas the first one adds), and that was most of
a compile's time; so this pass has black format only what the emitter cannot write as
black would: the statements too long for a line.

Black's output depends on its input's tokens, comments, blank lines and magic trailing
commas, not on where its lines break. The emitted module has one line per statement,
spaced as black spaces them (sx2torch/build.py), with no trailing commas. The pass
(`guess`) keeps each line that fits in black's width; writes black's split of a statement
whose value is a long chain of one operator (`_operands`: the sums a long expression
compiles to, quickly), and of the other long statements the emitter writes (assignments,
returns, calls, `def` lines) by black's own algorithm, transcribed in sx2torch/lines.py;
has black format the few it leaves (a string black re-quotes, an assignment to a
subscript), one copy of each, all in one small module, at their depths; and adds the
blank lines black requires (after the imports, before a method): so its tokens, comments
and blank lines are black's own, and black leaves the result as it is. A compile whose
long lines are all split here does not import black (a fifth of a small compile's
start-up). Each golden module, on every target and with `--source-lines`, is
checked to be so (tests/format/test_format.py, tests/test_golden.py), and the fuzzer
checks every module it makes. A module the guess cannot take (a string over several
lines) is formatted by black whole.

Black's result depends only on the text, black's version and its mode (always the
default), so it is kept in a user-level cache by content hash, and compiling or `check`ing
an unchanged model again skips black: it does not even import it, reading black's version
from its one-line version module. The cache
is the folder $SX2TORCH_CACHE_DIR, else $XDG_CACHE_HOME/sx2torch, else
~/.cache/sx2torch; SX2TORCH_NO_CACHE=1 turns it off. An entry that cannot be read or
written is as if absent: the cache never fails a compile.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import Optional

import sx2torch.lines as lines_
from sx2torch.build import LINE_LENGTH

# The major version of black whose stable style `guess` and sx2torch/lines.py write: black
# changes that style only in a year's first release (its stability policy).
STYLE = "26"
KEPT = 256  # entries kept; the oldest beyond that are removed when one is added


def run(code: str) -> str:
    folder = cache_dir()
    if folder is None:
        return formatted(code)
    key = hashlib.sha256(f"{black_version()}\0{code}".encode("utf-8", "surrogatepass"))
    entry = folder / f"{key.hexdigest()}.py"
    try:
        cached = entry.read_text(encoding="utf-8")
        os.utime(entry)  # pruning removes the least recently used
        return cached
    except (OSError, UnicodeDecodeError):
        pass
    result = formatted(code)
    _store(folder, entry, result)
    return result


def black_version() -> str:
    """Black's version, without importing black: its package writes it in a module of its
    own, `_black_version`, which black's `__init__` imports it from."""
    try:
        from _black_version import version
    except ImportError:  # a black built otherwise
        import black

        version = black.__version__
    return version


def formatted(code: str) -> str:
    """`black.format_str(code)` of a module spaced as the emitter spaces it: `guess(code)`
    where black's style is the one the guess writes, else black's formatting of the whole
    module."""
    written = guess(code) if black_version().split(".")[0] == STYLE else None
    if written is not None:
        return written
    import black  # here: a compile whose module is cached never imports it

    return black.format_str(code, mode=black.Mode())


MARK = "# sx2torch: one statement"


def guess(code: str) -> Optional[str]:
    """The module black would write for `code`, one statement a line; None where a line
    is not one whole statement (a string over several lines)."""
    lines = code.split("\n")
    long = long_lines(lines)
    if long is None:
        return None
    if long:
        written = _written(code, tuple(long))
        if written is None:
            return None
        for line, indices in long.items():
            for index in indices:
                lines[index] = written[line]
    return "\n".join(_blank_lines(lines))


def long_lines(lines: list) -> Optional[dict]:
    """The lines black may write otherwise (each -> its indices): those too long, and
    those with a string it would re-quote; None where a line is not one whole statement.
    """
    long: dict = {}
    for index, line in enumerate(lines):
        if line.count('"""') % 2 or line.rstrip().endswith("\\"):
            return None
        if _kept_string(line):
            continue
        # Black also re-quotes strings with quotes or escapes in them, and measures
        # width, not length: such a line is left to it too. It leaves comments be.
        if not line.lstrip(" ").startswith("#") and (
            len(line) > LINE_LENGTH or not line.isascii() or "'" in line or "\\" in line
        ):
            long.setdefault(line, []).append(index)
    return long


def _written(code: str, long: tuple) -> Optional[dict]:
    """Each long line as black writes it: a chain of one operator by `_operands`, what
    sx2torch/lines.py knows by it, the rest by black, in one module."""
    targets = lines_.Targets(code)
    written = {line: _operands(line) or lines_.split(line, targets) for line in long}
    rest = [line for line, text in written.items() if text is None]
    if rest:
        split = _split(tuple(rest))
        if split is None:
            return None
        written.update(zip(rest, split))
    return written


# Black's priorities of the binary operators the emitter writes spaced (black/brackets.py,
# MATH_PRIORITIES): a line is split before each operator of the highest one.
OPERATOR_PRIORITY = {"+": 5, "-": 5, "*": 4, "/": 4, "//": 4, "%": 4, "@": 4, "**": 2}
OPERAND_STATEMENT = re.compile(
    r"( *)((?:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)* = )|return )(.+)"
)
# Black re-quotes a string holding one of the first two, keeps a comment where it stands,
# and splits a bracket whose last item ends in a comma (a magic trailing comma).
QUOTED = ("'", "\\", "#", ",)", ",]", ",}")
OPERAND_CHARACTER = re.compile(
    r"[\w.*~+-]"
)  # in an operand, outside brackets and strings


def _operands(line: str) -> Optional[str]:
    """Black's formatting of `target = a + b - c ...` or `return a + b ...`, too long for a
    line, where the value has two operators or more of its loosest kind outside brackets,
    each operand fits a line and the line holds nothing black would write otherwise (a
    comment, a quote, a comma, a keyword, a comparison); else None, and black formats it.

    Black wraps such a value in parentheses and puts each operand on a line of its own, its
    operator first (linegen.py: `right_hand_split` keeps the optional parentheses when
    `can_omit_invisible_parens` finds several delimiters of the loosest priority, then
    `delimiter_split` splits the body). A long sum is the one statement a long expression
    compiles to, in chunks of a few dozen operands: black's own split of those took half
    of such a compile. sx2torch/lines.py writes the same split, but with black's whole
    machinery: this way a 20k-term sum compiles in 5.0 s instead of 6.8."""
    match = OPERAND_STATEMENT.fullmatch(line)
    if match is None or not line.isascii() or any(c in line for c in QUOTED):
        return None
    indent, head, value = match.groups()
    cuts = _operator_cuts(value)
    if not cuts:
        return None
    loosest = max(priority for _, priority in cuts)
    at = [index for index, priority in cuts if priority == loosest]
    if len(at) < 2 or loosest < OPERATOR_PRIORITY["@"]:
        # with one, black may split the value's last brackets instead; a hugged `**`
        # (`x**2`) is a delimiter too, which the cuts do not count
        return None
    inner = indent + "    "
    pieces = [value]  # the value alone fits its line: black keeps it whole
    if len(inner + value) > LINE_LENGTH:
        pieces = [value[: at[0]]]
        pieces += [value[a + 1 : b] for a, b in zip(at, at[1:] + [len(value)])]
    written = [indent + head + "(", *(inner + piece for piece in pieces), indent + ")"]
    if any(len(text) > LINE_LENGTH for text in written):
        return None  # black would split an operand further
    return "\n".join(written)


def _operator_cuts(value: str) -> Optional[list]:
    """(index of the space before it, priority) of each binary operator in `value` outside
    brackets and strings (none in a value that is one bracketed whole, whose parentheses
    black would make its own); None where anything else stands there but operands."""
    cuts = []
    depth = 0
    index = 0
    while index < len(value):
        char = value[index]
        if char == '"':
            quote = '"""' if value.startswith('"""', index) else '"'
            end = value.find(quote, index + len(quote))
            if end < 0:
                return None
            index = end + len(quote)
            continue
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif depth == 0:
            if char == " ":
                end = value.find(" ", index + 1)
                operator = value[index + 1 : end] if end > 0 else ""
                if operator not in OPERATOR_PRIORITY:
                    return None  # a keyword, a comparison, a conditional
                cuts.append((index, OPERATOR_PRIORITY[operator]))
                index = end + 1
                continue
            if not OPERAND_CHARACTER.match(char):
                return None  # a comma, a comparison, a colon, a comment
        index += 1
    return cuts if depth == 0 else None


def _kept_string(line: str) -> bool:
    """Whether `line` is one triple-quoted string alone (a docstring, most often the
    source's, and often longer than a line), which black keeps as it is at any length: it
    cannot split a string, and normalizes a docstring's only where its text starts or ends
    with a space or a quote, or holds a backslash (black/linegen.py, visit_STRING)."""
    match = ONE_STRING.fullmatch(line)
    if match is None:
        return False
    text = match.group(1)
    return text == text.strip() and not text.startswith('"') and not text.endswith('"')


ONE_STRING = re.compile(r' *"""((?:(?!""\")[^\\])+)"""')


@functools.lru_cache(maxsize=1024)
def _split(lines: tuple) -> Optional[tuple]:
    """Black's formatting of each statement line, at its depth, all in one module: each
    behind a marker, inside `if _:` blocks to its depth, with a body when it opens one.

    Kept for the process's later modules: a process that compiles several (each target's,
    `check` over a tree, the interpreter's checks, the test suite) meets the same long
    statements again in modules that differ elsewhere, which the cache of whole modules
    misses (in the suite, 7 of 10 black calls were repeats).
    """
    import black

    chunks = []
    for line in lines:
        depth = _depth(line)
        chunks.append(MARK + "\n")
        chunks += ["    " * level + "if _:\n" for level in range(depth)]
        chunks.append(line + "\n")
        if _opens_block(line):
            chunks.append("    " * (depth + 1) + "pass\n")
    try:
        written = black.format_str("".join(chunks), mode=black.Mode())
    except black.InvalidInput:
        return None
    parts: list = []
    for line in written.split("\n"):
        if line.strip() == MARK:
            parts.append([])
        elif line.strip() and parts:
            parts[-1].append(line)
    if len(parts) != len(lines):
        return None
    split = []
    for line, part in zip(lines, parts):
        part = part[_depth(line) :]  # the `if _:` lines
        if _opens_block(line):
            part = part[:-1]  # the `pass`
        split.append("\n".join(part))
    return tuple(split)


def _opens_block(line: str) -> bool:
    """Whether a statement line ends in `:`, before a comment such as --source-lines adds."""
    return OPENS_BLOCK.search(line) is not None


OPENS_BLOCK = re.compile(r":(  #[^'\"]*)?$")


def _blank_lines(lines: list) -> list:
    """The lines with the blank lines black requires and the emitted module lacks: one
    after the imports, two after a class, and one before each method but the first after
    its class line (before the comments and the decorator right above it)."""
    written: list = []
    top = ""  # the last line at depth 0
    for index, line in enumerate(lines):
        depth, text = _depth(line), line.lstrip(" ")
        before = written[-1] if written else ""
        if depth == 0 and text and before.strip() and _depth(before) > 0:
            if top.startswith(("class ", "def ")):
                written += ["", ""]
        elif (
            depth == 0
            and text
            and not text.startswith(("import ", "from "))
            and before.startswith(("import ", "from "))
        ):
            written.append("")
        elif (
            depth >= 1
            and _opens_method(lines, index, depth)
            and before.strip()
            and not (
                before.lstrip(" ").startswith(("#", "@")) and _depth(before) == depth
            )
            and not (before.lstrip(" ").startswith("class ") and _depth(before) < depth)
        ):
            written.append("")
        written.append(line)
        if depth == 0 and text:
            top = text
    return written


def _opens_method(lines: list, index: int, depth: int) -> bool:
    """Whether line `index` is a `def` at `depth`, or a comment or decorator right above
    one."""
    while index < len(lines) and lines[index].startswith(
        ("    " * depth + "#", "    " * depth + "@")
    ):
        index += 1
    return index < len(lines) and lines[index].startswith("    " * depth + "def ")


def _depth(line: str) -> int:
    return (len(line) - len(line.lstrip(" "))) // 4


def cache_dir() -> Optional[Path]:
    """The cache's folder, or None when it is turned off."""
    if os.environ.get("SX2TORCH_NO_CACHE"):
        return None
    if os.environ.get("SX2TORCH_CACHE_DIR"):
        return Path(os.environ["SX2TORCH_CACHE_DIR"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "sx2torch"
    try:
        return Path.home() / ".cache" / "sx2torch"
    except RuntimeError:  # no home directory to be found
        return None


def _store(folder: Path, entry: Path, text: str) -> None:
    """Write `entry` whole or not at all (a reader never sees half of one), then prune."""
    temporary = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, entry)
        temporary = None
        entries = sorted(folder.glob("*.py"), key=_age)
        for old in entries[:-KEPT]:
            old.unlink(missing_ok=True)
    except (OSError, UnicodeError):
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)


def _age(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
