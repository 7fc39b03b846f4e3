"""`sx2torch explain --html`: the explain report as one self-contained HTML page.

The page is built from `explain.run`'s data (the `--json` schema) and the source text: every
source line, coloured by what the policy does there (an f32 island, a bf16 region, an
`:out :f32` GEMM, f32 for another reason, inserted casts), with the reasons shown on hover;
the warnings; the parameter table with bytes and totals. Inline CSS only, no scripts, no
external assets: it works offline and from a file. Every piece of source text is escaped.

Warnings slot in through the report's optional `"warnings"` list: each item is a message, or
an object with `"message"` and optionally `"line"` (the line is then marked and linked).
"""

from __future__ import annotations

from html import escape

from sx2torch.errors import source_lines

# (kind, legend label, what it means), in the order a line's colour is chosen.
KINDS = (
    ("gemm", ":out :f32 GEMM", "a bf16 GEMM that stores its f32 accumulator"),
    ("island", "f32 island", "a sensitive or library mark keeps f32 here"),
    ("region", "bf16 region", "computed in bf16 (a region, or an explicit cast)"),
    ("f32", "f32, other reason", "an explicit cast, a :numerics :high parameter, ..."),
)
# How explain words each reason: its prefix gives the kind (the rest is "f32").
PREFIXES = (
    (":out :f32", "gemm"),
    ("sensitive mark", "island"),
    ("library mark", "island"),
    ("bf16 region", "region"),
    ("library region", "region"),
    ("explicit (cast ... :bf16)", "region"),
)


def kind(reason: str) -> str:
    return next((k for prefix, k in PREFIXES if reason.startswith(prefix)), "f32")


def render(report: dict, text: str) -> str:
    """The page for `report` (from `explain.run`) of the source `text`."""
    title = f"sx2torch explain: {report['file']}"
    warnings = report.get("warnings") or []
    return "\n".join(
        [
            "<!doctype html>",
            '<html lang="en">',
            '<head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{escape(title)}</title>",
            f"<style>{STYLE}</style>",
            "</head>",
            "<body>",
            _header(report, warnings),
            _legend(),
            '<main><section id="source"><h2>Source</h2>',
            _source(report, text, warnings),
            "</section>",
            _warnings(warnings),
            _params(report),
            "</main>",
            "</body>",
            "</html>",
            "",
        ]
    )


def _header(report: dict, warnings: list) -> str:
    where = "f32 is kept" if report["kept"] == "f32" else "bf16 regions are"
    facts = [
        f"run <b>{escape(report['run'] or '(none)')}</b>",
        f"precision <b>{escape(report['precision'])}</b>",
        f"{len(report['lines'])} lines where {where}",
        f"{len(warnings)} warning{'' if len(warnings) == 1 else 's'}",
        f"{_bytes(report['totals']['all'])} of parameters",
    ]
    return (
        f"<header><h1>{escape(report['file'])}</h1>"
        f"<p class=\"facts\">{' · '.join(facts)}</p></header>"
    )


def _legend() -> str:
    chips = [
        f'<li><span class="chip {k}">{escape(label)}</span> {escape(means)}</li>'
        for k, label, means in KINDS
    ]
    chips.append(
        '<li><span class="chip cast">cast</span> the compiler inserts a cast</li>'
    )
    chips.append('<li><span class="chip warn">warning</span> see Warnings</li>')
    return (
        '<nav class="legend"><ul>'
        + "".join(chips)
        + "</ul><p>Hover a coloured line for the reasons.</p></nav>"
    )


def _source(report: dict, text: str, warnings: list) -> str:
    marked = {line["line"]: line for line in report["lines"]}
    warned: dict[int, list] = {}
    for warning in warnings:
        if isinstance(warning, dict) and warning.get("line"):
            warned.setdefault(warning["line"], []).append(warning["message"])
    rows = []
    for number, source in enumerate(source_lines(text), start=1):
        entry = marked.get(number)
        kinds = [] if entry is None else [kind(r) for r in entry["reasons"]]
        shown = [k for k, _, _ in KINDS if k in kinds]
        classes = ["line"] + shown[:1]
        chips, why = [], []
        labels = {k: label for k, label, _ in KINDS}
        chips += [f'<span class="chip {k}">{escape(labels[k])}</span>' for k in shown]
        if entry is not None:
            why += [
                f'<li><span class="chip {kind(r)}">why</span> {escape(r)}</li>'
                for r in entry["reasons"]
            ]
            why += [
                f'<li><span class="chip cast">cast</span> {escape(c)}</li>'
                for c in entry["casts"]
            ]
            if entry["casts"]:
                chips.append('<span class="chip cast">cast</span>')
        if number in warned:
            classes.append("warned")
            chips.append('<span class="chip warn">warning</span>')
            why += [
                f'<li><span class="chip warn">warning</span> {escape(m)}</li>'
                for m in warned[number]
            ]
        box = f'<ul class="why">{"".join(why)}</ul>' if why else ""
        rows.append(
            f'<div class="{" ".join(classes)}" id="L{number}">'
            f'<span class="no">{number}</span>'
            f'<code>{escape(source) or " "}</code>'
            f'<span class="chips">{"".join(chips)}</span>{box}</div>'
        )
    return f'<div class="code">{"".join(rows)}</div>'


def _warnings(warnings: list) -> str:
    if not warnings:
        items = '<p class="none">no warnings</p>'
    else:
        rows = []
        for warning in warnings:
            if isinstance(warning, dict):
                line, message = warning.get("line"), warning["message"]
            else:
                line, message = None, warning
            at = f'<a href="#L{line}">line {line}</a>: ' if line else ""
            rows.append(f"<li>{at}{escape(str(message))}</li>")
        items = f'<ul class="warnings">{"".join(rows)}</ul>'
    return f'<section id="warnings"><h2>Warnings</h2>{items}</section>'


def _params(report: dict) -> str:
    head = (
        "<tr><th>name</th><th>shape</th><th>stored</th><th>trained</th>"
        '<th class="num">bytes</th></tr>'
    )
    rows = []
    for p in report["params"]:
        shape = "[" + ", ".join(map(str, p["shape"])) + "]"
        trained = "trainable" if p["trainable"] else "frozen"
        saved = "" if p["persistent"] else ", not in state_dict"
        rows.append(
            f'<tr class="{trained}"><td>{escape(p["name"])}</td><td>{shape}</td>'
            f'<td><span class="dtype {escape(p["dtype"])}">{escape(p["dtype"])}</span></td>'
            f'<td>{trained}{saved}</td><td class="num">{p["bytes"]:,}</td></tr>'
        )
    totals = report["totals"]
    foot = "".join(
        f'<tr class="total"><th colspan="4">{name}</th>'
        f'<td class="num" id="total-{name}">{totals[name]:,}</td></tr>'
        for name in ("trainable", "frozen", "all")
    )
    return (
        '<section id="params"><h2>Parameters</h2><table>'
        f"<thead>{head}</thead><tbody>{''.join(rows)}</tbody><tfoot>{foot}</tfoot>"
        "</table></section>"
    )


def _bytes(count: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} bytes"


STYLE = """
:root { --ink: #1f2933; --muted: #616e7c; --rule: #e4e7eb; --paper: #fbfbfa;
  --island: #fde68a; --island-edge: #d97706; --region: #bae6fd; --region-edge: #0284c7;
  --gemm: #ddd6fe; --gemm-edge: #7c3aed; --f32: #bbf7d0; --f32-edge: #16a34a;
  --cast: #fecdd3; --cast-edge: #e11d48; --warn: #fee2e2; --warn-edge: #b91c1c; }
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 32px; background: var(--paper); color: var(--ink);
  font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
h1 { margin: 0; font-size: 22px; font-family: ui-monospace, "DejaVu Sans Mono", monospace; }
h2 { font-size: 16px; margin: 28px 0 10px; text-transform: uppercase;
  letter-spacing: .06em; color: var(--muted); }
.facts { margin: 4px 0 0; color: var(--muted); }
.facts b { color: var(--ink); }
.legend { margin-top: 16px; padding: 10px 14px; background: #fff; border: 1px solid var(--rule);
  border-radius: 8px; }
.legend ul { list-style: none; margin: 0; padding: 0; display: flex; flex-wrap: wrap;
  gap: 6px 22px; }
.legend p { margin: 6px 0 0; color: var(--muted); font-size: 13px; }
.chip { display: inline-block; padding: 0 7px; border-radius: 10px; font-size: 12px;
  line-height: 18px; border: 1px solid; white-space: nowrap; font-family: system-ui, sans-serif; }
.chip.island { background: var(--island); border-color: var(--island-edge); }
.chip.region { background: var(--region); border-color: var(--region-edge); }
.chip.gemm { background: var(--gemm); border-color: var(--gemm-edge); }
.chip.f32 { background: var(--f32); border-color: var(--f32-edge); }
.chip.cast { background: var(--cast); border-color: var(--cast-edge); }
.chip.warn { background: var(--warn); border-color: var(--warn-edge); color: var(--warn-edge); }
.code { background: #fff; border: 1px solid var(--rule); border-radius: 8px; padding: 8px 0;
  font: 13.5px/1.6 ui-monospace, "DejaVu Sans Mono", Menlo, monospace; }
.line { position: relative; display: flex; align-items: center; padding: 0 12px 0 0;
  border-left: 4px solid transparent; }
.line .no { width: 3.5em; flex: none; text-align: right; padding-right: 14px;
  color: #9aa5b1; user-select: none; }
.line code { white-space: pre; font: inherit; flex: 1; }
.line .chips { display: flex; gap: 4px; margin-left: 12px; }
.line.island { background: color-mix(in srgb, var(--island) 55%, white);
  border-left-color: var(--island-edge); }
.line.region { background: color-mix(in srgb, var(--region) 55%, white);
  border-left-color: var(--region-edge); }
.line.gemm { background: color-mix(in srgb, var(--gemm) 60%, white);
  border-left-color: var(--gemm-edge); }
.line.f32 { background: color-mix(in srgb, var(--f32) 55%, white);
  border-left-color: var(--f32-edge); }
.line.warned { outline: 2px solid var(--warn-edge); outline-offset: -2px; }
.why { display: none; position: absolute; z-index: 2; left: 4.5em; top: 100%; margin: 2px 0 0;
  padding: 8px 12px; list-style: none; background: #fff; border: 1px solid var(--rule);
  border-radius: 8px; box-shadow: 0 6px 20px rgba(15, 23, 42, .18);
  font: 13px/1.7 system-ui, sans-serif; max-width: 60em; }
.line:hover .why { display: block; }
.line:hover { filter: brightness(.97); }
.none { color: var(--muted); font-style: italic; }
.warnings { margin: 0; padding-left: 20px; }
.warnings li { color: var(--warn-edge); }
table { border-collapse: collapse; background: #fff; border: 1px solid var(--rule);
  border-radius: 8px; font-variant-numeric: tabular-nums; }
th, td { padding: 5px 14px; text-align: left; border-bottom: 1px solid var(--rule); }
thead th { font-size: 12px; text-transform: uppercase; letter-spacing: .05em;
  color: var(--muted); }
td:first-child { font-family: ui-monospace, "DejaVu Sans Mono", monospace; }
.num { text-align: right; }
tr.frozen td { color: var(--muted); }
.dtype { padding: 0 6px; border-radius: 4px; font-size: 12px; }
.dtype.f32 { background: var(--f32); }
.dtype.bf16 { background: var(--region); }
tfoot th { text-align: right; font-weight: 600; }
tfoot td { font-weight: 600; }
"""
