"""Black's split of one long statement line, written without black (the format pass's).

A transcription of black's own algorithm (black 26.10.1, default mode: linegen.py's
`transform_line`, `right_hand_split` with its optional parentheses, `delimiter_split`,
`left_hand_split`, `bracket_split_build_line`; brackets.py's delimiter priorities;
lines.py's magic trailing commas and comments; trans.py's `hug_power_op`), with the same
names, over the tokens of one statement line spaced as black spaces it (the emitter's),
and the comment after it (--source-lines'). Black mutates its leaves as it splits (an
optional parenthesis made visible by one attempt stays so for the next, a line's first
leaf loses its space, each line it builds marks its leaves' bracket depths again), and
which split it keeps depends on that, so this module mutates its leaves where black does.
Black formats a module twice when the first pass changed it, the second reading the
trailing commas the first one added as magic: so does `split`.

Where black's result depends on what this module does not follow (a comment it would
rewrite, or that its second pass would read after another leaf; a string it would
re-quote; a lambda; star-arguments whose trailing comma depends on the target versions
black detects in the module, where they are not known; nested parentheses around a
value; any statement but an assignment to names or attributes, a `return`, a call or a
`def`), `split` answers None and black formats the line.
"""

from __future__ import annotations

import dataclasses
import functools
import keyword
import re
import sys
from typing import Iterator, Optional

from sx2torch.build import LINE_LENGTH

COMPREHENSION_PRIORITY = 20
COMMA_PRIORITY = 18
TERNARY_PRIORITY = 16
LOGIC_PRIORITY = 14
COMPARATOR_PRIORITY = 10
MATH_PRIORITIES = {
    "VBAR": 9, "CIRCUMFLEX": 8, "AMPER": 7, "LEFTSHIFT": 6, "RIGHTSHIFT": 6, "PLUS": 5, "MINUS": 5,
    "STAR": 4, "SLASH": 4, "DOUBLESLASH": 4, "PERCENT": 4, "AT": 4, "DOUBLESTAR": 2,
}  # fmt: skip
DOT_PRIORITY = 1
COMPARATORS = {"LESS", "GREATER", "EQEQUAL", "NOTEQUAL", "LESSEQUAL", "GREATEREQUAL"}
OPENING = {"LPAR": "RPAR", "LSQB": "RSQB", "LBRACE": "RBRACE"}
CLOSING = {"RPAR": "LPAR", "RSQB": "LSQB", "RBRACE": "LBRACE"}
TOKEN_NAMES = {
    "(": "LPAR", ")": "RPAR", "[": "LSQB", "]": "RSQB", "{": "LBRACE", "}": "RBRACE",
    ",": "COMMA", ":": "COLON", ".": "DOT", "=": "EQUAL", "+": "PLUS", "-": "MINUS",
    "*": "STAR", "**": "DOUBLESTAR", "/": "SLASH", "//": "DOUBLESLASH",
    "%": "PERCENT", "@": "AT", "&": "AMPER", "|": "VBAR", "^": "CIRCUMFLEX",
    "~": "TILDE", "<<": "LEFTSHIFT", ">>": "RIGHTSHIFT", "<": "LESS", ">": "GREATER",
    "==": "EQEQUAL", "!=": "NOTEQUAL", "<=": "LESSEQUAL", ">=": "GREATEREQUAL",
}  # fmt: skip
EXPRESSION_WORDS = {"None", "True", "False", "and", "or", "not", "in", "is"}
EXPRESSION_WORDS |= {"if", "else", "for"}

TOKEN = re.compile(
    r"( *)(?:"
    r"(?P<number>(?:0[xX][0-9a-fA-F_]+|(?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)"
    r"(?:[eE][-+]?\d+)?[jJ]?)(?![\w.]))"
    r"|(?P<name>[A-Za-z_]\w*)"
    r'|(?P<string>"[^"\\]*")'
    r"|(?P<op>\*\*|//|<<|>>|<=|>=|==|!=|[-+*/%@&|^~<>]|[()\[\]{},:.=]))"
)


class Unknown(Exception):
    """What black writes here depends on something this module does not follow."""


class CannotTransform(Exception):
    pass


class CannotSplit(CannotTransform):
    pass


class Leaf:
    """A token as black's leaf: `kind` its type (a name, number, string, operator or the
    punctuation itself), `parent` the kind of node black's parser puts it in where a rule
    asks (`atom`, `trailer` or `parameters` for a bracket; `arglist` for a comma between
    arguments; `unary`, `vararg`, `comp_op` or `test` for an operator or keyword), `space`
    the whitespace black writes before it, `attached` False once black's leaf would have
    no parent (a comma black adds, a leaf replaced by a copy)."""

    __slots__ = ("kind", "value", "parent", "space", "prefix", "depth", "opening")
    __slots__ += ("attached", "size")

    def __init__(self, kind, value, parent=None, space="", attached=True):
        self.kind, self.value, self.parent, self.space = kind, value, parent, space
        self.prefix = ""
        self.depth = 0
        self.opening = None
        self.attached = attached
        self.size = 0  # an invisible parenthesis's: the leaves of its atom

    def copy(self) -> Leaf:
        """A leaf as black's append_leaves makes it, in place of this one."""
        return Leaf(self.kind, self.value, self.parent, self.space, self.attached)

    def clone(self) -> Leaf:
        """blib2to3's clone: no parent, its whitespace kept."""
        leaf = Leaf(self.kind, self.value, self.parent, self.space, attached=False)
        leaf.prefix, leaf.depth, leaf.opening = self.prefix, self.depth, self.opening
        return leaf


def is_opening(leaf: Leaf) -> bool:
    return leaf.kind in OPENING


def is_closing(leaf: Leaf) -> bool:
    return leaf.kind in CLOSING


def is_word(leaf: Optional[Leaf], word: str) -> bool:
    return leaf is not None and leaf.kind == "name" and leaf.value == word


def split(line: str, targets: Optional[Targets] = None) -> Optional[str]:
    """Black's formatting of `line`, one whole statement too long for a line, at its
    depth (four spaces a level), in the module of `targets` (None: one not known);
    None where it is not known for certain."""
    features = Features(targets=targets)
    try:
        leaves = statement_leaves(line)
        if leaves is None:
            return None
        first = format_once(leaves, _depth(line), features)
        again = _pass_again(first)
        if again is None:
            return _text(first)
        return _text(format_once(again, _depth(line), features))
    except (Unknown, RecursionError):  # nested past Python's stack: black's to format
        return None


# What black's get_features_used could find in a module, over-approximated: a string's
# prefix, `:=`, a number's underscore, a positional-only marker, a soft keyword's or
# another feature's statement, a decorator not a dotted name or call, type parameters,
# a star anywhere but as a bare `*` between parameters, an annotated assignment.
FEATURE_MARKS = re.compile(
    r"(?<![\w.])[A-Za-z]{1,2}[\"']|:=|(?<![\w.])\d[\w.]*_|/\s*[,)]"
    r"|^\s*(?:match|case|type|lazy|async|print|exec)\b|\b(?:except|yield|await)\b"
    r"|\bwith\s*\(|__future__|\b(?:def|class)\s+\w+\s*\["
    r"|^\s*@(?![A-Za-z_][\w.]*(?:\(.*\))?\s*$)|^\s*[\w.]+\s*:(?!\s*$)"
    r"|(?:[\[({=:]|\b(?:return|in|else|and|or|not|if|lambda))\s*\*"
    r"|,\s*\*(?!\s*,)",
    re.M,
)


# Strings (their text emptied, their prefixes kept), then comments.
STRINGS = re.compile(r'"""(?:(?!""\").)*"""|"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'')
COMMENTS = re.compile(r"#.*$", re.M)


class Targets:
    """The target versions black detects in a module (one statement a line), as `split`
    needs them: `plain` where it detects no feature in it for certain (it then writes no
    trailing comma after star-arguments). Found when first asked: most modules never
    ask, and the search takes 0.08 s on P1's 230 kB."""

    def __init__(self, module: str) -> None:
        self.module = module

    @functools.cached_property
    def plain(self) -> bool:
        code = COMMENTS.sub("", STRINGS.sub('""', self.module))
        return FEATURE_MARKS.search(code) is None


@dataclasses.dataclass(frozen=True)
class Features:
    """Black's features that `transform_line` reads: FORCE_OPTIONAL_PARENTHESES, which it
    adds for its second opinion, and the trailing commas the module's targets allow."""

    force: bool = False
    targets: Optional[Targets] = None


def _depth(line: str) -> int:
    return (len(line) - len(line.lstrip(" "))) // 4


def _text(lines: list) -> str:
    return "\n".join(str(line) for line in lines)


def _pass_again(lines: list) -> Optional[list]:
    """The leaves black's second pass reads, where the first added a comma (which the
    second reads as a magic trailing comma); None where it added none."""
    leaves = [leaf for line in lines for leaf in line.leaves]
    if all(leaf.attached or leaf.kind != "COMMA" for leaf in leaves):
        return None
    text = "".join(leaf.space + leaf.value for leaf in leaves)
    if any(line.comments for line in lines[:-1]):
        raise Unknown("a comment the second pass reads after another leaf")
    comments = [c for after in lines[-1].comments.values() for c in after]
    return statement_leaves(text + "".join("  " + c.value for c in comments))


def format_once(leaves: list, depth: int, features: Features) -> list:
    line = Line(depth=depth)
    for leaf in leaves:
        line.append(leaf)
    return list(transform_line(line, features))


# The statement's tokens, as black's parser and LineGenerator leave them.


def statement_leaves(line: str) -> Optional[list]:
    """`line`'s leaves with their parents' kinds, and the invisible parentheses black
    puts around an assigned or returned value, a tuple of targets and a conditional;
    None for a statement this module does not take."""
    if not line.isascii() or "'" in line or "\\" in line:
        return None
    statement, comment = _comment(line.strip(" "))
    tokens = tokenize(statement) if statement else None
    if not tokens:
        return None
    start = _value_start(tokens)
    if start is None or not _classify(tokens, start):
        return None
    _words(tokens)
    _space_powers(tokens)
    parens = _optional_parens(tokens, start)
    if parens is None:
        return None
    parens += [span for span in _conditionals(tokens) if span not in parens]
    return _with_parens(tokens, parens) + ([comment] if comment else [])


def _comment(text: str) -> tuple:
    """The statement and the comment after it (a leaf), where black writes that comment
    as it stands (`# TEXT`, two spaces before it: --source-lines' `# FILE:LINE:COL`);
    (None, None) for any other comment."""
    at = text.find("#")
    if at < 0:
        return text, None
    statement, comment = text[:at], text[at:]
    if (
        statement.count('"') % 2
        or not statement.endswith("  ")
        or statement.endswith("   ")
        or not COMMENT.fullmatch(comment)
    ):
        return None, None
    return statement[:-2], Leaf("COMMENT", comment, space="  ")


COMMENT = re.compile(r"# (?!type:)[^\s\"]([^\"]*\S)?")


def tokenize(text: str) -> Optional[list]:
    leaves, index = [], 0
    while index < len(text):
        match = TOKEN.match(text, index)
        if match is None or match.end() == index:
            return None
        kind = match.lastgroup
        value = match.group(kind)
        if kind == "op":
            kind = TOKEN_NAMES[value]
        leaves.append(Leaf(kind, value, space=match.group(1)))
        index = match.end()
    return leaves


def _value_start(tokens: list) -> Optional[int]:
    """Where the value of `return VALUE` or `TARGETS = VALUE` starts (TARGETS: names and
    attributes, a tuple of them), 0 for a call statement, -1 for a `def`; None
    otherwise."""
    head = tokens[0]
    if head.kind != "name" or head.value in ("def", "return"):
        start = {"def": -1, "return": 1}.get(head.value)
        return None if start is None or len(tokens) == start else start
    index = 0
    while index + 1 < len(tokens) and tokens[index].kind == "name":
        if tokens[index + 1].kind not in ("DOT", "COMMA"):
            break
        index += 2
    if tokens[index].kind != "name" or keyword.iskeyword(tokens[index].value):
        return None
    if index + 2 < len(tokens) and tokens[index + 1].kind == "EQUAL":
        return index + 2
    return 0


def _optional_parens(tokens: list, start: int) -> Optional[list]:
    """The spans (first, last token) black wraps in invisible parentheses: an assigned or
    returned value, but a parenthesized one, whose parentheses it makes invisible or keeps
    (a tuple's, a generator's); a tuple of targets. None where black would do otherwise.
    """
    if start <= 0:
        return []
    spans = [(start, len(tokens) - 1)]
    if any(leaf.kind == "COMMA" for leaf in tokens[: start - 1]):
        spans.append((0, start - 2))
    first, last = tokens[start], tokens[-1]
    if first.kind == "LPAR" and last.opening is first:
        spans.remove((start, len(tokens) - 1))
        inner = _levels(tokens[start + 1 : -1])[0]
        if any(leaf.kind == "COMMA" or leaf.parent == "comp_for" for leaf in inner):
            return spans
        if len(inner) == 1 or (
            inner[0].kind == "LPAR" and inner[-1].opening is inner[0]
        ):
            return None  # black's rules for nested parentheses
        first.value = last.value = ""
        last.size = len(tokens) - start
    return spans


def _top_level_commas(leaves: list) -> Iterator[Leaf]:
    depth = 0
    for leaf in leaves:
        depth += is_opening(leaf) - is_closing(leaf)
        if depth == 0 and leaf.kind == "COMMA":
            yield leaf


def _with_parens(tokens: list, spans: list) -> list:
    """`tokens` with invisible parentheses around each span (black's
    wrap_in_parentheses: the first token's whitespace goes before the parenthesis)."""
    opens = [0] * len(tokens)
    for first, _ in spans:
        opens[first] += 1
    leaves = []
    sizes = [(last, last - first + 3) for first, last in spans]
    for index, leaf in enumerate(tokens):
        for _ in range(opens[index]):
            leaves.append(Leaf("LPAR", "", "atom", leaf.space))
            leaf.space = ""
        leaves.append(leaf)
        for _, size in sorted(s for s in sizes if s[0] == index):
            leaves.append(Leaf("RPAR", "", "atom"))
            leaves[-1].size = size
    return leaves


def _words(tokens: list) -> None:
    """Give `for`, `in`, `if` and `else` their parents (a comprehension's, a
    conditional's), each bracket's level apart."""
    for level in _levels(tokens):
        in_for = seen_for = False
        for leaf in level:
            if is_word(leaf, "for"):
                leaf.parent = "comp_for"
                in_for = seen_for = True
            elif is_word(leaf, "in") and in_for:
                leaf.parent = "comp_for"
                in_for = False
            elif is_word(leaf, "if"):
                leaf.parent = "comp_if" if seen_for else "test"
            elif is_word(leaf, "else"):
                leaf.parent = "test"
            elif leaf.kind == "COMMA" and in_for:
                leaf.parent = "exprlist"


def _space_powers(tokens: list) -> None:
    """Black spaces a binary `**` as any operator, and hugs it last (hug_power_op)."""
    for index, leaf in enumerate(tokens):
        if leaf.kind == "DOUBLESTAR" and leaf.parent != "vararg":
            leaf.space = tokens[index + 1].space = " "


def _levels(tokens: list) -> list:
    """The tokens at each bracket level: the statement's, then each bracket's (a nested
    bracket is a token of its owner's level)."""
    levels: list = [[]]
    stack = [levels[0]]
    for leaf in tokens:
        if is_closing(leaf):
            stack.pop()
        stack[-1].append(leaf)
        if is_opening(leaf):
            levels.append([])
            stack.append(levels[-1])
    return levels


def _conditionals(tokens: list) -> list:
    """The spans of the conditionals black wraps in invisible parentheses (visit_test):
    each one but the whole of a parenthesis's content."""
    spans = []
    positions = {id(leaf): index for index, leaf in enumerate(tokens)}
    for level in _levels(tokens):
        for at, leaf in enumerate(level):
            if leaf.parent != "test" or not is_word(leaf, "if"):
                continue
            first = at
            while first > 0 and not _bounds_conditional(level[first - 1]):
                first -= 1
            last = at
            while last + 1 < len(level) and not _ends_conditional(level[last + 1]):
                last += 1
            first, last = positions[id(level[first])], positions[id(level[last])]
            before = tokens[first - 1] if first > 0 else None
            after = tokens[last + 1] if last + 1 < len(tokens) else None
            if not (
                before and before.kind == "LPAR" and after and after.opening is before
            ):
                spans.append((first, last))
    return spans


def _bounds_conditional(leaf: Leaf) -> bool:
    return (
        leaf.kind in ("COMMA", "EQUAL", "COLON")
        or is_word(leaf, "else")
        or is_word(leaf, "return")
    )


def _ends_conditional(leaf: Leaf) -> bool:
    return leaf.kind in ("COMMA", "COLON") or leaf.parent in ("comp_for", "comp_if")


def _classify(tokens: list, start: int) -> bool:
    """Give each token its parent's kind; False where a token is not one this module
    follows (a keyword that opens a lambda, a comprehension or another statement, a
    string black would join or re-quote, an annotation, a colon outside brackets)."""
    stack: list = []
    previous = None
    is_def = start == -1
    for index, leaf in enumerate(tokens):
        if index == 0 and leaf.kind == "name" and leaf.value in ("def", "return"):
            previous = leaf
            continue
        if leaf.kind == "name" and not _is_name(leaf.value):
            return False
        if not _classify_one(leaf, previous, tokens, index, stack, is_def, start):
            return False
        previous = leaf
    return not stack and (not is_def or _is_def(tokens))


def _is_name(value: str) -> bool:
    """A name or a keyword this module follows in an expression (not a lambda, a
    comprehension, a conditional, which black wraps in invisible parentheses of its own,
    or another statement's)."""
    return value in EXPRESSION_WORDS or not keyword.iskeyword(value)


def _is_operand(value: str) -> bool:
    return value in ("None", "True", "False") or not keyword.iskeyword(value)


def _is_def(tokens: list) -> bool:
    """`def NAME(...):`, its parameters without annotations."""
    return (
        len(tokens) >= 5
        and tokens[1].kind == "name"
        and tokens[2].kind == "LPAR"
        and tokens[-2].kind == "RPAR"
        and tokens[-2].opening is tokens[2]
        and tokens[-1].kind == "COLON"
    )


def _classify_one(leaf, previous, tokens, index, stack, is_def, start) -> bool:
    kind = leaf.kind
    operand_before = previous is not None and (
        previous.kind in ("number", "string")
        or is_closing(previous)
        or (previous.kind == "name" and _is_operand(previous.value))
    )
    if kind == "string" and previous is not None and previous.kind == "string":
        return False  # implicit concatenation
    if kind == "string" and previous is not None and previous.kind == "name":
        return leaf.space != ""  # a prefixed string
    if is_opening(leaf):
        leaf.parent = _bracket_parent(leaf, previous, operand_before, is_def, index)
        stack.append(leaf)
    elif is_closing(leaf):
        if not stack or stack[-1].kind != CLOSING[kind]:
            return False
        leaf.opening = stack.pop()
        leaf.parent = leaf.opening.parent
    elif kind == "COMMA":
        if not stack:
            return start > 0
        if stack[-1].parent in ("trailer", "parameters") and stack[-1].kind == "LPAR":
            leaf.parent = "arglist"
    elif kind == "COLON":
        if not stack:
            return is_def and index == len(tokens) - 1
        return stack[-1].kind in ("LSQB", "LBRACE")
    elif kind in ("STAR", "DOUBLESTAR") and not operand_before:
        if not stack or stack[-1].kind != "LPAR" or stack[-1].parent == "atom":
            return False
        leaf.parent = "vararg"
    elif kind in ("MINUS", "PLUS", "TILDE") and not operand_before:
        leaf.parent = "unary"
    elif is_word(leaf, "not"):
        following = tokens[index + 1] if index + 1 < len(tokens) else None
        leaf.parent = "comp_op" if is_word(following, "in") else "unary"
    elif kind == "EQUAL":
        return bool(stack) or index == start - 1
    return True


def _bracket_parent(leaf, previous, operand_before, is_def, index) -> str:
    if is_def and index == 2:
        return "parameters"
    if leaf.kind != "LBRACE" and operand_before:
        return "trailer"
    return "atom"


# black/brackets.py


def is_split_before_delimiter(leaf: Leaf, previous: Optional[Leaf]) -> int:
    if leaf.parent == "vararg":
        return 0
    if leaf.kind == "DOT" and (previous is None or is_closing(previous)):
        return DOT_PRIORITY
    if leaf.kind in MATH_PRIORITIES and leaf.parent != "unary":
        return MATH_PRIORITIES[leaf.kind]
    if leaf.kind in COMPARATORS or is_word(leaf, "is"):
        return COMPARATOR_PRIORITY
    if leaf.parent in ("comp_for", "comp_if"):
        return COMPREHENSION_PRIORITY if not is_word(leaf, "in") else 0
    if leaf.parent == "test":
        return TERNARY_PRIORITY
    if is_word(leaf, "in") and not is_word(previous, "not"):
        return COMPARATOR_PRIORITY
    if is_word(leaf, "not") and leaf.parent == "comp_op":
        if not is_word(previous, "is"):
            return COMPARATOR_PRIORITY
    if is_word(leaf, "and") or is_word(leaf, "or"):
        return LOGIC_PRIORITY
    return 0


def is_split_after_delimiter(leaf: Leaf) -> int:
    return COMMA_PRIORITY if leaf.kind == "COMMA" and leaf.parent != "exprlist" else 0


class Line:
    """black/lines.py's Line with its BracketTracker."""

    def __init__(self, depth: int = 0, inside_brackets: bool = False) -> None:
        self.depth = depth
        self.inside_brackets = inside_brackets
        self.should_split_rhs = False
        self.magic_trailing_comma: Optional[Leaf] = None
        self.leaves: list = []
        self.delimiters: dict = {}
        self.bracket_depth = 0
        self.bracket_match: dict = {}
        self.previous: Optional[Leaf] = None
        self.invisible: list = []
        self.for_loop_depths: list = []
        self.comments: dict = {}  # leaf -> the comments after it

    def append(self, leaf: Leaf, preformatted=False, track_bracket=False) -> None:
        if self.leaves and not preformatted:
            leaf.prefix += leaf.space
        if leaf.kind == "COMMENT":
            self.append_comment(leaf)
            return
        if self.inside_brackets or not preformatted or track_bracket:
            self.mark(leaf)
            if self.has_magic_trailing_comma(leaf):
                self.magic_trailing_comma = leaf
        self.leaves.append(leaf)

    def mark(self, leaf: Leaf) -> None:
        if (
            self.bracket_depth == 0
            and is_closing(leaf)
            and (0, leaf.kind) not in self.bracket_match
        ):
            return
        if (
            self.for_loop_depths
            and self.for_loop_depths[-1] == self.bracket_depth
            and is_word(leaf, "in")
        ):  # a comprehension's targets are a level deeper
            self.bracket_depth -= 1
            self.for_loop_depths.pop()
        if is_closing(leaf):
            self.bracket_depth -= 1
            leaf.opening = self.bracket_match.pop((self.bracket_depth, leaf.kind))
            if not leaf.value:
                self.invisible.append(leaf)
        leaf.depth = self.bracket_depth
        if self.bracket_depth == 0:
            delimiter = is_split_before_delimiter(leaf, self.previous)
            if delimiter and self.previous is not None:
                self.delimiters[self.previous] = delimiter
            else:
                delimiter = is_split_after_delimiter(leaf)
                if delimiter:
                    self.delimiters[leaf] = delimiter
        if is_opening(leaf):
            self.bracket_match[self.bracket_depth, OPENING[leaf.kind]] = leaf
            self.bracket_depth += 1
            if not leaf.value:
                self.invisible.append(leaf)
        self.previous = leaf
        if is_word(leaf, "for"):
            self.bracket_depth += 1
            self.for_loop_depths.append(self.bracket_depth)

    def append_comment(self, comment: Leaf) -> None:
        if not self.leaves:
            raise Unknown("a standalone comment")
        last_leaf = self.leaves[-1]
        if last_leaf.kind == "RPAR" and not last_leaf.value and last_leaf.size <= 3:
            # black's: the comment on optional parentheses around one leaf is the leaf's
            if len(self.leaves) >= 2:
                last_leaf = self.leaves[-2]
        self.comments.setdefault(last_leaf, []).append(comment)

    def comments_after(self, leaf: Leaf) -> list:
        return self.comments.get(leaf, [])

    def append_with_comments(self, leaf: Leaf, original: Line, **track) -> None:
        """`leaf` and the comments after it in `original`, preformatted."""
        self.append(leaf, preformatted=True, **track)
        for comment in original.comments_after(leaf):
            self.append(comment, preformatted=True)

    def length(self, leaf: Leaf) -> int:
        """black's enumerate_with_length: a leaf's, with its comments' text."""
        comments = sum(len(comment.value) for comment in self.comments_after(leaf))
        return len(leaf.prefix) + len(leaf.value) + comments

    def max_delimiter_priority(self, exclude=()) -> int:
        return max(v for k, v in self.delimiters.items() if k not in exclude)

    def delimiter_count_with_priority(self, priority: int = 0) -> int:
        if not self.delimiters:
            return 0
        priority = priority or self.max_delimiter_priority()
        return sum(1 for p in self.delimiters.values() if p == priority)

    def has_magic_trailing_comma(self, closing: Leaf) -> bool:
        if not (
            is_closing(closing) and self.leaves and self.leaves[-1].kind == "COMMA"
        ):
            return False
        if closing.kind == "RBRACE":
            return True
        if closing.kind == "RSQB":
            return not (
                closing.parent == "trailer"
                and is_one_sequence_between(
                    closing.opening, closing, self.leaves, ("LSQB", "RSQB")
                )
            )
        return not is_one_sequence_between(closing.opening, closing, self.leaves)

    @property
    def is_def(self) -> bool:
        return bool(self.leaves) and self.leaves[0].value == "def"

    @property
    def is_chained_assignment(self) -> bool:
        return [leaf.kind for leaf in self.leaves].count("EQUAL") > 1

    def __bool__(self) -> bool:
        return bool(self.leaves)

    def __str__(self) -> str:
        if not self.leaves:
            return ""
        first = self.leaves[0]
        text = first.prefix + "    " * self.depth + first.value
        text += "".join(leaf.prefix + leaf.value for leaf in self.leaves[1:])
        comments = (c for after in self.comments.values() for c in after)
        return text + "".join(comment.prefix + comment.value for comment in comments)


def is_one_sequence_between(
    opening, closing, leaves, brackets=("LPAR", "RPAR")
) -> bool:
    if opening is None or (opening.kind, closing.kind) != brackets:
        return False
    depth = closing.depth + 1
    start = next((i for i, leaf in enumerate(leaves) if leaf is opening), -1)
    if start == -1:
        return False
    commas = 0
    for leaf in leaves[start + 1 :]:
        if leaf is closing:
            break
        if leaf.depth == depth and leaf.kind == "COMMA":
            commas += 1
            if leaf.attached and leaf.parent == "arglist":
                commas += 1
                break
    return commas < 2


def is_line_short_enough(line: Line, line_length: int = LINE_LENGTH) -> bool:
    return len(str(line)) <= line_length


# black/linegen.py


def transform_line(line: Line, features: Features) -> Iterator[Line]:
    """Black's lines for `line`. `features`: black's, those of the target versions it
    detects in the module (none of which this module's callers know but UNKNOWN) and
    FORCE_OPTIONAL_PARENTHESES, which it adds for its second opinion."""
    line_str = str(line)
    hugged = _hugged(line, features)
    if (
        not line.should_split_rhs
        and not line.magic_trailing_comma
        and len(hugged or line_str) <= LINE_LENGTH
    ):
        transformers = []
    elif line.is_def:
        transformers = [left_hand_split]
    elif line.inside_brackets:
        transformers = [delimiter_split, right_hand_split_with_omits]
    else:
        transformers = [right_hand_split_with_omits]
    transformers.append(hug_power_op)
    for transform in transformers:
        try:
            result = run_transformer(line, transform, features, line_str)
        except CannotTransform:
            continue
        yield from result
        return
    yield line


def _hugged(line: Line, features: Features) -> Optional[str]:
    try:
        return str(next(hug_power_op(line, features)))
    except CannotTransform:
        return None


def hug_power_op(line: Line, features: Features) -> Iterator[Line]:
    """black/trans.py's: `**` between simple operands without spaces, the line's own
    (black spaces it first, and measures a line before this)."""
    if not any(leaf.kind == "DOUBLESTAR" for leaf in line.leaves):
        raise CannotTransform("No doublestar token was found in the line.")
    new_line = Line(line.depth, line.inside_brackets)
    new_line.should_split_rhs = line.should_split_rhs
    new_line.magic_trailing_comma = line.magic_trailing_comma
    should_hug = False
    for index, leaf in enumerate(line.leaves):
        hug_this_leaf = should_hug
        should_hug = (
            0 < index < len(line.leaves) - 1
            and leaf.kind == "DOUBLESTAR"
            and _is_simple_operand(line.leaves, index - 1, -1)
            and _is_simple_operand(line.leaves, index + 1, 1)
        )
        new_leaf = leaf
        if hug_this_leaf or should_hug:
            new_leaf = leaf.clone()
            new_leaf.prefix = ""
        new_line.append(new_leaf, preformatted=True)
        for comment in line.comments_after(leaf):
            new_line.append(comment, preformatted=True)
    yield new_line


def _is_simple_operand(leaves: list, index: int, kind: int) -> bool:
    start = leaves[index]
    if start.kind in ("name", "number"):
        return _is_simple_lookup(leaves, index, kind)
    if start.kind in ("PLUS", "MINUS", "TILDE"):
        if leaves[index + 1].kind in ("name", "number"):
            return _is_simple_lookup(leaves, index + 1, 1)
    return False


def _is_simple_lookup(leaves: list, index: int, kind: int) -> bool:
    """black's handle_is_simple_look_up_prev (kind -1) and _forward (kind 1)."""
    if kind == 1:
        for leaf in leaves[index:]:
            if leaf.kind in ("LPAR", "LSQB"):
                return False
            if leaf.kind not in ("name", "DOT") or is_word(leaf, "for"):
                return True
        return True
    contains_disallowed = False
    chain: list = []
    while 0 <= index:
        chain.append(leaves[index])
        contains_disallowed = contains_disallowed or chain[-1].kind in ("RPAR", "RSQB")
        if not _is_expression_chained(chain):
            return not contains_disallowed
        index -= 1
    return True


def _is_expression_chained(chain: list) -> bool:
    if len(chain) < 2:
        return True
    current, past = chain[-1], chain[-2]
    if past.kind == "name":
        return current.kind == "DOT"
    if past.kind in ("RPAR", "RSQB"):
        return current.kind in ("RSQB", "RPAR")
    if past.kind in ("LPAR", "LSQB"):
        return current.kind in ("name", "LPAR", "LSQB")
    return False


def run_transformer(line: Line, transform, features: Features, line_str: str) -> list:
    optional_parens = [b for b in line.invisible if b.depth == 0]
    result: list = []
    for transformed_line in transform(line, features):
        if str(transformed_line) == line_str:
            raise CannotTransform("Line transformer returned an unchanged result")
        result.extend(transform_line(transformed_line, features))
    if (
        features.force
        or transform is not right_hand_split_with_omits
        or not line.invisible
        or any(bracket.value for bracket in optional_parens)
        or is_line_short_enough(result[0])
        or any(not leaf.attached for leaf in line.leaves)
    ):
        return result
    line_copy = Line(line.depth, line.inside_brackets)
    line_copy.should_split_rhs = line.should_split_rhs
    line_copy.magic_trailing_comma = line.magic_trailing_comma
    for leaf in line.leaves:  # black's append_leaves: new leaves, the old ones orphaned
        new = leaf.copy()
        leaf.attached = False
        line_copy.append(new)
        for comment in line.comments_after(leaf):
            line_copy.append(comment, preformatted=True)
    second_opinion = run_transformer(
        line_copy, transform, dataclasses.replace(features, force=True), line_str
    )
    if all(is_line_short_enough(ln) for ln in second_opinion):
        result = second_opinion
    return result


class RHSResult:
    def __init__(self, head, body, tail, opening, closing) -> None:
        self.head, self.body, self.tail = head, body, tail
        self.opening_bracket, self.closing_bracket = opening, closing


def right_hand_split_with_omits(line: Line, features: Features) -> Iterator[Line]:
    first_lines = None
    prefix_lengths = {}
    length = 4 * line.depth
    for leaf in line.leaves:
        prefix_lengths[leaf] = length
        length += len(leaf.prefix) + len(leaf.value)
    for omit in generate_trailers_to_omit(line, LINE_LENGTH):
        if omit:
            target = next(
                (
                    leaf.opening
                    for leaf in reversed(line.leaves)
                    if is_closing(leaf) and leaf not in omit
                ),
                None,
            )
            if (
                target is not None
                and target.value
                and prefix_lengths.get(target, 0) > LINE_LENGTH
            ):
                continue
        lines = list(right_hand_split(line, features, omit=omit))
        if first_lines is None and not omit:
            first_lines = lines
        if is_line_short_enough(lines[0]):
            yield from lines
            return
    if first_lines is not None:
        yield from first_lines
    else:
        yield from right_hand_split(line, features)


def right_hand_split(line: Line, features: Features, omit=()) -> Iterator[Line]:
    rhs = _first_right_hand_split(line, omit=omit)
    yield from _maybe_split_omitting_optional_parens(rhs, line, features, omit=omit)


def _first_right_hand_split(line: Line, omit=()) -> RHSResult:
    tail_leaves: list = []
    body_leaves: list = []
    head_leaves: list = []
    current_leaves = tail_leaves
    opening_bracket = closing_bracket = None
    for leaf in reversed(line.leaves):
        if current_leaves is body_leaves and leaf is opening_bracket:
            current_leaves = head_leaves if body_leaves else tail_leaves
        current_leaves.append(leaf)
        if current_leaves is tail_leaves and is_closing(leaf) and leaf not in omit:
            opening_bracket = leaf.opening
            closing_bracket = leaf
            current_leaves = body_leaves
    if not (opening_bracket and closing_bracket and head_leaves):
        raise CannotSplit("No brackets found")
    tail_leaves.reverse()
    body_leaves.reverse()
    head_leaves.reverse()
    head = bracket_split_build_line(head_leaves, line, opening_bracket, "head")
    body = bracket_split_build_line(body_leaves, line, opening_bracket, "body")
    tail = bracket_split_build_line(tail_leaves, line, opening_bracket, "tail")
    bracket_split_succeeded_or_raise(head, body, tail)
    return RHSResult(head, body, tail, opening_bracket, closing_bracket)


def _maybe_split_omitting_optional_parens(
    rhs: RHSResult, line: Line, features: Features, omit=()
) -> Iterator[Line]:
    if (
        not features.force
        and rhs.opening_bracket.kind == "LPAR"
        and not rhs.opening_bracket.value
        and rhs.closing_bracket.kind == "RPAR"
        and not rhs.closing_bracket.value
        and can_omit_invisible_parens(rhs, LINE_LENGTH)
    ):
        omit = {rhs.closing_bracket, *omit}
        try:
            rhs_oop = _first_right_hand_split(line, omit=omit)
            if _prefer_split_rhs_oop_over_rhs(rhs_oop, rhs):
                yield from _maybe_split_omitting_optional_parens(
                    rhs_oop, line, features, omit=omit
                )
                return
        except CannotSplit as error:
            if line.is_chained_assignment:
                pass
            elif not can_be_split(rhs.body) and not is_line_short_enough(rhs.body):
                raise CannotSplit("the body is still too long") from error
    ensure_visible(rhs.opening_bracket)
    ensure_visible(rhs.closing_bracket)
    for result in (rhs.head, rhs.body, rhs.tail):
        if result:
            yield result


def ensure_visible(leaf: Leaf) -> None:
    if leaf.kind == "LPAR":
        leaf.value = "("
    elif leaf.kind == "RPAR":
        leaf.value = ")"


def _prefer_split_rhs_oop_over_rhs(rhs_oop: RHSResult, rhs: RHSResult) -> bool:
    head = rhs.head.leaves
    if not (len(head) >= 2 and head[-2].kind == "EQUAL"):
        return True
    if not any(is_opening(leaf) or is_closing(leaf) for leaf in head[:-1]):
        return True
    if not is_line_short_enough(rhs.head, LINE_LENGTH - 1):
        return True
    if rhs.head.magic_trailing_comma is not None:
        return True
    rhs_head_equal_count = [leaf.kind for leaf in head].count("EQUAL")
    rhs_oop_head_equal_count = [leaf.kind for leaf in rhs_oop.head.leaves].count(
        "EQUAL"
    )
    if rhs_head_equal_count > 1 and rhs_head_equal_count > rhs_oop_head_equal_count:
        return False
    has_closing_bracket_after_assign = False
    for leaf in reversed(rhs_oop.head.leaves):
        if leaf.kind == "EQUAL":
            break
        if is_closing(leaf):
            has_closing_bracket_after_assign = True
            break
    return has_closing_bracket_after_assign or (
        any(leaf.kind == "EQUAL" for leaf in rhs_oop.head.leaves)
        and is_line_short_enough(rhs_oop.head)
    )


def bracket_split_succeeded_or_raise(head: Line, body: Line, tail: Line) -> None:
    tail_len = len(str(tail).strip())
    if not body:
        if tail_len == 0:
            raise CannotSplit("Splitting brackets produced the same line")
        if tail_len < 3:
            raise CannotSplit("Splitting brackets on an empty body is not worth it")


def _ensure_trailing_comma(leaves: list, original: Line, opening: Leaf) -> bool:
    """(No annotations reach here: the PEP 604 and return-annotation cases are out.)"""
    if not leaves or not original.is_def or opening.value != "(":
        return False
    return not any(leaf.kind == "COMMA" for leaf in leaves)


def bracket_split_build_line(
    leaves: list, original: Line, opening_bracket: Leaf, component: str
) -> Line:
    result = Line(depth=original.depth)
    if component == "body":
        result.inside_brackets = True
        result.depth += 1
        if _ensure_trailing_comma(leaves, original, opening_bracket):
            if leaves[-1].kind != "COMMA":
                leaves.append(Leaf("COMMA", ",", attached=False))
    leaves_to_track = set()
    if component == "head":
        leaves_to_track = get_leaves_inside_matching_brackets(leaves)
    for leaf in leaves:
        track = leaf in leaves_to_track
        result.append_with_comments(leaf, original, track_bracket=track)
    if component == "body" and should_split_line(result, opening_bracket):
        result.should_split_rhs = True
    return result


def get_leaves_inside_matching_brackets(leaves: list) -> set:
    start = next((i for i, leaf in enumerate(leaves) if is_opening(leaf)), None)
    if start is None:
        return set()
    ids: set = set()
    stack: list = []
    for leaf in leaves[start:]:
        if is_opening(leaf):
            stack.append((OPENING[leaf.kind], [leaf]))
        elif is_closing(leaf):
            if stack and leaf.kind == stack[-1][0]:
                _, level = stack.pop()
                level.append(leaf)
                ids.update(level)
            else:
                break
        elif stack:
            stack[-1][1].append(leaf)
    return ids


def should_split_line(line: Line, opening_bracket: Leaf) -> bool:
    exclude = set()
    trailing_comma = False
    try:
        last_leaf = line.leaves[-1]
        if last_leaf.kind == "COMMA":
            trailing_comma = True
            exclude.add(last_leaf)
        max_priority = line.max_delimiter_priority(exclude=exclude)
    except (IndexError, ValueError):
        return False
    return max_priority == COMMA_PRIORITY and (
        trailing_comma or opening_bracket.parent == "atom"
    )


def dont_increase_indentation(split_func):
    def split_wrapper(line: Line, features: Features) -> Iterator[Line]:
        for split_line in split_func(line, features):
            split_line.leaves[0].prefix = ""
            yield split_line

    return split_wrapper


@dont_increase_indentation
def delimiter_split(line: Line, features: Features) -> Iterator[Line]:
    if not line.leaves:
        raise CannotSplit("Line empty")
    last_leaf = line.leaves[-1]
    try:
        delimiter_priority = line.max_delimiter_priority(exclude={last_leaf})
    except ValueError:
        raise CannotSplit("No delimiters found") from None
    if (
        delimiter_priority == DOT_PRIORITY
        and line.delimiter_count_with_priority(delimiter_priority) == 1
    ):
        raise CannotSplit("Splitting a single attribute from its owner looks wrong")
    delimiters = line.delimiters
    current_line = Line(line.depth, line.inside_brackets)
    lowest_depth = sys.maxsize
    trailing_comma_safe = True
    migrates = delimiter_priority == COMMA_PRIORITY  # (black's STRING_PRIORITY too)
    for index, leaf in enumerate(line.leaves):
        current_line.append(leaf, preformatted=True)
        previous = line.leaves[index - 1] if index else None
        if migrates or delimiters.get(previous) != delimiter_priority:
            _append_comments(current_line, line, leaf)
        lowest_depth = min(lowest_depth, leaf.depth)
        if trailing_comma_safe and leaf.depth == lowest_depth:
            trailing_comma_safe = _can_add_trailing_comma(leaf, features)
        if delimiters.get(leaf) == delimiter_priority:
            if index + 1 < len(line.leaves) and not migrates:
                _append_comments(current_line, line, line.leaves[index + 1])
            yield current_line
            current_line = Line(line.depth, line.inside_brackets)
    if current_line:
        if (
            trailing_comma_safe
            and delimiter_priority == COMMA_PRIORITY
            and current_line.leaves[-1].kind != "COMMA"
        ):
            current_line.append(Leaf("COMMA", ",", attached=False))
        yield current_line


def _append_comments(current_line: Line, line: Line, leaf: Leaf) -> None:
    for comment in line.comments_after(leaf):
        current_line.append(comment, preformatted=True)


def _can_add_trailing_comma(leaf: Leaf, features: Features) -> bool:
    """After star-arguments, where the module's target versions allow it: black's
    TRAILING_COMMA_IN_CALL and _IN_DEF features, none in a module it detects none in."""
    if leaf.parent != "vararg":
        return True
    if features.targets is None or not features.targets.plain:
        raise Unknown("a trailing comma after star-arguments")
    return False


def left_hand_split(line: Line, features: Features) -> Iterator[Line]:
    """(A `def` line: its first opening parenthesis is its parameters'.)"""
    tail_leaves: list = []
    body_leaves: list = []
    head_leaves: list = []
    current_leaves = head_leaves
    matching_bracket = None
    for leaf in line.leaves:
        if (
            current_leaves is body_leaves
            and is_closing(leaf)
            and leaf.opening is matching_bracket
        ):
            ensure_visible(leaf)
            ensure_visible(matching_bracket)
            current_leaves = tail_leaves if body_leaves else head_leaves
        current_leaves.append(leaf)
        if current_leaves is head_leaves and leaf.kind == "LPAR":
            matching_bracket = leaf
            current_leaves = body_leaves
    if not matching_bracket or not tail_leaves:
        raise CannotSplit("No brackets found")
    head = bracket_split_build_line(head_leaves, line, matching_bracket, "head")
    body = bracket_split_build_line(body_leaves, line, matching_bracket, "body")
    tail = bracket_split_build_line(tail_leaves, line, matching_bracket, "tail")
    bracket_split_succeeded_or_raise(head, body, tail)
    for result in (head, body, tail):
        if result:
            yield result


def generate_trailers_to_omit(line: Line, line_length: int) -> Iterator[set]:
    omit: set = set()
    if not line.magic_trailing_comma:
        yield omit
    length = 4 * line.depth
    opening_bracket = closing_bracket = None
    inner_brackets: set = set()
    for index in range(len(line.leaves) - 1, -1, -1):
        leaf = line.leaves[index]
        leaf_length = line.length(leaf)
        length += leaf_length
        if length > line_length or leaf_length > len(leaf.prefix) + len(leaf.value):
            break  # (a comment after it)
        prev = line.leaves[index - 1] if index > 0 else None
        trailing_comma = (
            prev is not None
            and prev.kind == "COMMA"
            and leaf.opening is not None
            and not is_one_sequence_between(leaf.opening, leaf, line.leaves)
        )
        if opening_bracket:
            if leaf is opening_bracket:
                opening_bracket = None
            elif is_closing(leaf):
                if trailing_comma:
                    break
                inner_brackets.add(leaf)
        elif is_closing(leaf):
            if prev is not None and is_opening(prev):
                inner_brackets.add(leaf)
                continue
            if closing_bracket:
                omit.add(closing_bracket)
                omit.update(inner_brackets)
                inner_brackets.clear()
                yield omit
            if trailing_comma:
                break
            if leaf.value:
                opening_bracket = leaf.opening
                closing_bracket = leaf


def can_omit_invisible_parens(rhs: RHSResult, line_length: int) -> bool:
    line = rhs.body
    if rhs.head.comments_after(rhs.opening_bracket):
        return False  # (black: omitting them would move the comment)
    if not line.delimiters:
        return True
    max_priority = line.max_delimiter_priority()
    delimiter_count = line.delimiter_count_with_priority(max_priority)
    if delimiter_count > 1:
        return False
    if max_priority == DOT_PRIORITY:
        return True
    first, second = line.leaves[0], line.leaves[1]
    if is_opening(first) and not is_closing(second):
        if _can_omit_opening_paren(line, first=first, line_length=line_length):
            return True
    penultimate, last = line.leaves[-2], line.leaves[-1]
    if (
        last.kind == "RPAR"
        or last.kind == "RBRACE"
        or (last.kind == "RSQB" and last.parent != "trailer")
    ):
        if is_opening(penultimate):
            return False
        if _can_omit_closing_paren(line, last=last, line_length=line_length):
            return True
    return False


def _can_omit_opening_paren(line: Line, *, first: Leaf, line_length: int) -> bool:
    remainder = False
    length = 4 * line.depth
    index = -1
    for index, leaf in enumerate(line.leaves):
        if is_closing(leaf) and leaf.opening is first:
            remainder = True
        if remainder:
            length += line.length(leaf)
            if length > line_length:
                break
            if is_opening(leaf):
                remainder = False
    else:
        if len(line.leaves) == index + 1:
            return True
    return False


def _can_omit_closing_paren(line: Line, *, last: Leaf, line_length: int) -> bool:
    length = 4 * line.depth
    seen_other_brackets = False
    for leaf in line.leaves:
        length += line.length(leaf)
        if leaf is last.opening:
            if seen_other_brackets or length <= line_length:
                return True
        elif is_opening(leaf):
            seen_other_brackets = True
    return False


def can_be_split(line: Line) -> bool:
    leaves = line.leaves
    if len(leaves) < 2:
        return False
    if leaves[0].kind == "string" and leaves[1].kind == "DOT":
        call_count = dot_count = 0
        following = leaves[-1]
        for leaf in leaves[-2::-1]:
            if is_opening(leaf):
                if not is_closing(following):
                    return False
                call_count += 1
            elif leaf.kind == "DOT":
                dot_count += 1
            elif leaf.kind == "name":
                if not (following.kind == "DOT" or is_opening(following)):
                    return False
            elif not is_closing(leaf):
                return False
            if dot_count > 1 and call_count > 1:
                return False
            following = leaf
    return True
