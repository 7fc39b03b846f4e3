"""The HTML report in a real browser: headless Chromium (Debian's `chromium` package,
which `.ci/run` installs when it is missing). Skipped only outside CI without it."""

import os
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest

from sx2torch.tools import explain, report
from sx2torch.cli import main
from cases import lisp

CHROMIUM = shutil.which("chromium")

if CHROMIUM is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError(
            "CI needs chromium for the browser test (.ci/run installs it)"
        )
    pytestmark = pytest.mark.skip(reason="chromium is not installed")


def chromium(tmp_path: Path, *args: str) -> bytes:
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        *args,
    ]
    done = subprocess.run(command, capture_output=True, timeout=120, check=True)
    return done.stdout


# --- PNG, decoded with zlib and struct ------------------------------------


def pixels(png: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, one bytes object per pixel) of an 8-bit RGB or RGBA PNG."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    at, data = 8, b""
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        kind, body = png[at + 4 : at + 8], png[at + 8 : at + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(
                ">IIBBBBB", body
            )
            assert depth == 8 and colour in (2, 6) and interlace == 0
        elif kind == b"IDAT":
            data += body
        at += 12 + length
    size = 4 if colour == 6 else 3
    raw, stride = zlib.decompress(data), width * size
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - size] if i >= size else 0
            b = previous[i]
            c = previous[i - size] if i >= size else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (
                    line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)
                ) & 0xFF
        rows.append(bytes(line))
        previous = line
    flat = b"".join(rows)
    return width, height, [flat[i : i + 3] for i in range(0, len(flat), size)]


# --- DOM ------------------------------------------------------------------


class Elements(HTMLParser):
    """For each element with an id: its class and its text, nested text included."""

    VOID = {"meta", "br", "img", "input", "link", "hr"}

    def __init__(self):
        super().__init__()
        self.by_id: dict[str, dict] = {}
        self.open: list = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in self.VOID:
            return
        entry = None
        if "id" in attrs:
            entry = {"class": (attrs.get("class") or "").split(), "text": ""}
            self.by_id[attrs["id"]] = entry
        self.open.append(entry)

    def handle_endtag(self, tag):
        if tag not in self.VOID and self.open:
            self.open.pop()

    def handle_data(self, data):
        self.text.append(data)
        for entry in self.open:
            if entry is not None:
                entry["text"] += data


def dom(tmp_path: Path, page: Path) -> Elements:
    parsed = Elements()
    parsed.feed(chromium(tmp_path, "--dump-dom", page.as_uri()).decode("utf-8"))
    return parsed


# --- Tests ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_gpt(tmp_path_factory) -> tuple[Path, dict]:
    source = lisp("tiny-gpt")
    page = tmp_path_factory.mktemp("report") / "tiny-gpt.html"
    assert main(["explain", str(source), "--html", str(page)]) == 0
    return page, explain.run(source.read_text(encoding="utf-8"), str(source))


def test_screenshot_is_not_blank(tmp_path, tiny_gpt):
    page, _ = tiny_gpt
    shot = tmp_path / "shot.png"
    chromium(tmp_path, "--window-size=1000,1300", f"--screenshot={shot}", page.as_uri())
    width, height, colours = pixels(shot.read_bytes())
    assert (width, height) == (1000, 1300)
    counts = Counter(colours)
    assert len(counts) > 100, "too few distinct colours for text on coloured lines"
    assert counts.most_common(1)[0][1] < 0.8 * len(colours), "mostly one colour"
    # The island lines' amber background (55% of #fde68a on white) is on screen.
    amber = sum(
        n
        for (r, g, b), n in counts.items()
        if r > 245 and 230 < g < 250 and 175 < b < 205
    )
    assert amber > 2000


def test_dom_holds_each_island_line_and_the_byte_totals(tmp_path, tiny_gpt):
    page, data = tiny_gpt
    parsed = dom(tmp_path, page)
    text = lisp("tiny-gpt").read_text(encoding="utf-8").splitlines()
    islands = [
        line["line"]
        for line in data["lines"]
        if any(report.kind(r) == "island" for r in line["reasons"])
    ]
    assert islands == [25, 29, 30, 37, 39, 40, 43]
    for number in islands:
        element = parsed.by_id[f"L{number}"]
        assert text[number - 1] in element["text"]
        assert "f32 island" in element["text"]
        assert {"island", "gemm"} & set(element["class"]), element
    for name, total in data["totals"].items():
        assert parsed.by_id[f"total-{name}"]["text"] == f"{total:,}"
    assert parsed.by_id["total-all"]["text"] == "2,097,152"
    assert "no warnings" in parsed.by_id["warnings"]["text"]


def test_dom_holds_each_warning(tmp_path):
    source = lisp("tiny-gpt")
    text = source.read_text(encoding="utf-8")
    data = explain.run(text, source.name)
    warnings = [
        {"line": 39, "message": "the head's <f32> logits: 1 MiB per 8 x 64 tokens"},
        "no line for this one",
    ]
    page = tmp_path / "warned.html"
    page.write_text(report.render({**data, "warnings": warnings}, text), "utf-8")
    parsed = dom(tmp_path, page)
    listed = parsed.by_id["warnings"]["text"]
    assert "line 39: the head's <f32> logits: 1 MiB per 8 x 64 tokens" in listed
    assert "no line for this one" in listed
    assert "no warnings" not in listed
    assert "warned" in parsed.by_id["L39"]["class"]
