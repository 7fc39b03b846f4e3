"""The HTML page of `sx2torch explain --html`: content, escaping, self-containment."""

import re


from sx2torch.tools import explain, report
from sx2torch.cli import main
from cases import SOURCES, lisp

CASES = SOURCES

HOSTILE = """\
;; </div><script>alert("comment")</script> & friends
(defparam w (normal [4 4]))
(defun forward (x)
  "<script>alert('docstring')</script>"
  (with-numerics (:sensitivity :high) (exp (matmul x w)))) ; <b>bold</b>
(defrun train :precision :bf16)
"""


def page(text: str, filename: str = "model.lisp", **extra) -> str:
    data = explain.run(text, filename)
    data.update(extra)
    return report.render(data, text)


def test_source_text_is_escaped_everywhere():
    html = page(HOSTILE, filename="<i>model</i>.lisp")
    assert "<script" not in html and "<b>bold" not in html and "<i>" not in html
    assert (
        "&lt;script&gt;alert(&quot;comment&quot;)&lt;/script&gt; &amp; friends" in html
    )
    assert "&lt;script&gt;alert(&#x27;docstring&#x27;)&lt;/script&gt;" in html
    assert "&lt;i&gt;model&lt;/i&gt;.lisp" in html


def test_no_external_assets():
    html = page(lisp("tiny-gpt").read_text(encoding="utf-8"))
    for marker in ("<link", "<script", "<img", "<iframe", "src=", "@import", "url("):
        assert marker not in html, marker
    assert not re.search(r'href="(?!#L\d+")', html)


def test_every_line_of_the_source_is_shown_and_marked_lines_are_coloured():
    text = lisp("tiny-gpt").read_text(encoding="utf-8")
    html = page(text)
    assert len(re.findall(r'<div class="line[ "]', html)) == len(text.splitlines())
    assert '<div class="line gemm" id="L39">' in html
    assert '<div class="line island" id="L25">' in html
    assert '<div class="line" id="L26">' in html


def test_every_reason_of_every_golden_case_has_its_colour():
    """Each reason explain gives is classified: the islands and regions by their
    marks, the rest (explicit casts, :numerics :high, not yet bf16) as other f32."""
    kinds = {}
    for path in CASES:
        data = explain.run(path.read_text(encoding="utf-8"), path.name)
        for line in data["lines"]:
            for reason in line["reasons"]:
                kinds.setdefault(report.kind(reason), set()).add(reason.split(":")[0])
    assert set(kinds) == {"gemm", "island", "region", "f32"}
    assert kinds["island"] == {"library mark", "sensitive mark"}
    assert kinds["region"] == {"bf16 region"}


def test_warnings_are_listed_and_their_lines_marked():
    html = page(
        HOSTILE,
        warnings=[
            {"line": 5, "message": "exp of a <bf16> value"},
            "a warning without a place",
        ],
    )
    assert '<a href="#L5">line 5</a>: exp of a &lt;bf16&gt; value' in html
    assert "<li>a warning without a place</li>" in html
    assert 'class="line island warned" id="L5"' in html
    assert "no warnings" not in html
    assert "no warnings" in page(HOSTILE)


def test_parameter_table_has_bytes_and_totals():
    html = page(lisp("distill").read_text(encoding="utf-8"))
    assert re.search(r"<td>teacher</td><td>\[32, 32\]</td>.*?bf16.*?frozen", html)
    assert '<td class="num" id="total-frozen">2,048</td>' in html
    assert '<td class="num" id="total-trainable">4,096</td>' in html
    assert '<td class="num" id="total-all">6,144</td>' in html


def test_cli_writes_the_page(tmp_path, capsys):
    out = tmp_path / "report.html"
    assert main(["explain", str(lisp("tiny-gpt")), "--html", str(out)]) == 0
    assert capsys.readouterr().out == ""
    assert out.read_text(encoding="utf-8").startswith("<!doctype html>")


def test_cli_reports_an_unwritable_page(tmp_path, capsys):
    out = tmp_path / "missing" / "report.html"
    assert main(["explain", str(lisp("tiny-gpt")), "--html", str(out)]) == 2
    assert "cannot write" in capsys.readouterr().err
