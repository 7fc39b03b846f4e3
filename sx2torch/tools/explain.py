"""`sx2torch explain`: where the precision policy keeps f32 and why, and what each parameter costs.

Under :bf16 it lists, per source line, the nodes that compute in f32 with the reason (a
sensitive mark, a library mark, a :numerics :high parameter, :out :f32, an explicit cast, or a
value that has not met a parameter or bf16 value yet) and the casts the compiler inserts there;
under :f32, the lines of bf16 regions. It names the defuns and sub-models each
`with-numerics` form reaches into: a form's mark stamps every node made while its body is
evaluated, so a model called inside an island computes in f32 too. Then a table of
parameters as in `state_dict`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Optional

import sx2torch.cache as cache
import sx2torch.compiler as compiler
import sx2torch.errors as errors
import sx2torch.lint as lint
import sx2torch.shard as shard
from sx2torch.syntax.echo import echo
from sx2torch.compiler import Options, Unit
from sx2torch.emit.naming import attributes
from sx2torch.ir import CALLS, ISLAND, LIBRARY, Kind, Node, Scalar, walk
from sx2torch.ops import initializers
from sx2torch.ops.rank import ShapeError, Tail
from sx2torch.policy.rules import Why, is_param
from sx2torch.syntax import scalars
from sx2torch.syntax.program import LISTS

BYTES = {"f32": 4, "bf16": 2}
MAX_LISTED = (
    1024  # stack instances listed one by one; more are one row per tensor, counted
)
SCHEMA_VERSION = 1


@dataclass
class Line:
    line: int
    source: str
    reasons: list = field(default_factory=list)
    casts: list = field(default_factory=list)


def run(text: str, filename: str, options: Optional[Options] = None) -> dict:
    """The report as plain data; `render` and `json.dumps` turn it into text."""
    unit = compiler.run(Unit(text, filename, options or Options()), until="names")
    data, program, lowered, chosen, precision = (
        unit.data,
        unit.program,
        unit.lowered,
        unit.chosen,
        unit.precision,
    )
    source_lines = errors.source_lines(text)
    lines: dict[int, Line] = {}
    for typed in lint.reached_specializations(program, lowered):
        if typed.model == LIBRARY:
            continue  # each use's line, below
        for number, owner, node in _at_lines(typed):
            reason = _reason(owner, node, precision)
            if reason is None:
                continue
            entry = lines.setdefault(
                number, Line(number, source_lines[number - 1].strip())
            )
            _add(entry.reasons, reason)
            for cast in _casts(owner, node, lowered):
                _add(entry.casts, cast)
    warnings = _warnings(program, lowered, data, source_lines)
    contagion = _contagion(lowered, precision, source_lines)
    reach = _reach(program, lowered, precision, source_lines)
    elements: dict = {}
    params = _params(program, lowered, elements)
    totals = {
        "trainable": sum(p["bytes"] for p in params if p["trainable"]),
        "frozen": sum(p["bytes"] for p in params if not p["trainable"]),
        "all": sum(p["bytes"] for p in params),
    }
    return {
        "schema": SCHEMA_VERSION,
        "file": filename,
        "run": chosen.name if chosen else None,
        "precision": precision,
        "kept": "f32" if precision == "bf16" else "bf16",
        "lines": [vars(lines[n]) for n in sorted(lines)],
        "contagion": contagion,
        "reach": reach,
        "warnings": warnings,
        "params": params,
        "totals": totals,
        "casts": _cast_bytes(lint.reached_specializations(program, lowered), elements),
        "tp": _tp(unit.tp, params, precision),
        "cache": _cache(unit),
    }


def _cache(unit) -> Optional[dict]:
    """A :generate run's KV cache: what one token costs it, each cached attention's keys
    and values at the sizes of the module built with its defaults (the consts, and the keys
    each model passes its sub-models), in the dtype the attention stores them in (bf16 is
    held in f32 tensors on metal and cpu); None for another run. An attention whose sizes
    are not known when the file compiles (a size read from the input) is counted in
    `unknown`, not in the bytes."""
    if unit.chosen is None or not unit.chosen.generate:
        return None
    top = unit.program.top
    entry = unit.lowered.natural[top.name, "forward"]
    grows = cache.grows(unit.chosen, unit.program)
    # one token of the ids; an encoder-decoder's prompt, whose values are made once and
    # count nothing per token, of one row and sizes not known, at the first rank at which
    # every cached attention's sizes are (T5's ids, Whisper's mel frames [1, bins, frames])
    for rank in range(2, 6):
        sizes = _Sizes(unit.program)
        args = [(1,) + (None,) * (rank - 1)] * len(entry.graph.inputs)
        args[grows] = (1, 1)
        sizes.graph(entry, args, sizes.consts(top, {}), {})
        if len(args) == 1 or not any(_unknown(dims) for _, dims in sizes.met):
            break
    total, unknown = 0, 0
    for dtype, dims in sizes.met:
        if _unknown(dims):
            unknown += 1
        else:
            each = 2 if dtype == "bf16" and not unit.target.held else 4
            total += sum(math.prod(d) for d in dims) * each
    return {
        "attentions": sizes.attentions,
        "bytes_per_token": total,
        "unknown": unknown,
    }


def _unknown(dims: tuple) -> bool:
    return any(d is None or None in d for d in dims)


class _Sizes:
    """The shape of each value of forward called on one token ([1, 1] ids) in the module
    built with its defaults, by the ops' rank rules, through the specializations the run
    computes: each model with the values its parent passes it, each call with its keys.
    `met` gets each cached attention reached, and each product of attention written out:
    the dtype it stores in, the shapes of its keys and values."""

    def __init__(self, program):
        self.program = program
        self.met: list = (
            []
        )  # (dtype, (K's shape, V's shape)), or one of them, a product's
        self.attentions = 0  # the attentions among them: a product's scores count one
        self.outside = False  # within a call made once per prompt, which keeps nothing

    def consts(self, model, passed: dict) -> dict:
        env = dict(passed)
        for const in model.consts.values():
            env.setdefault(const.name, scalars.compute(const.value, env))
        return env

    def graph(self, typed, args: list, model_env: dict, keys: dict):
        graph = typed.graph
        found = dict(zip(graph.inputs, args))
        self._nodes(graph.nodes, found, typed, {**model_env, **keys}, model_env)
        out = graph.output
        return tuple(map(found.get, out)) if isinstance(out, tuple) else found.get(out)

    def _nodes(self, nodes, found: dict, typed, env: dict, model_env: dict):
        for node in nodes:
            found[node] = self._node(node, found, typed, env, model_env)

    def _kept(self, dtype, inputs: list, attrs: dict) -> None:
        """An attention's K and V, or a product's Kᵀ or V (its scores count the attention)."""
        self.met.append((dtype, tuple(inputs[1:])))
        if attrs.get("keys", Scalar.lit(-1)).value == -1:
            self.attentions += 1

    def _node(self, node: Node, found: dict, typed, env: dict, model_env: dict):
        if node.attrs.get("once") and not self.outside:  # the plain module's: no cache
            self.outside = True
            try:
                return self._node(node, found, typed, env, model_env)
            finally:
                self.outside = False
        inputs = [() if isinstance(i, Scalar) else found.get(i) for i in node.inputs]
        model = typed.graph.model
        # the nodes that read a model's members (a library function's graph has none)
        owner = self.program.model(model) if model != LIBRARY else None
        if node.kind is Kind.PARAM:
            if node.attrs.get("owner", model) != model:
                return None  # a sub-model's parameter read in place: not followed
            init = owner.params[node.attrs["param"]].init
            return tuple(scalars.compute(s, env) for s in initializers.sizes(init))
        if node.kind is Kind.CAST:
            return inputs[0]
        if node.kind is Kind.ITEM:
            return inputs[0] and inputs[0][node.attrs["index"]]
        if node.kind is Kind.CALL:
            keys = {k: scalars.compute(v, env) for k, v in node.attrs["keys"].items()}
            return self.graph(typed.callee[node], inputs, model_env, keys)
        if node.kind is Kind.SUBMODEL:
            init = self.program.instance(
                owner, node.attrs["target"], node.attrs.get("item")
            )
            layer = env
            if init.index and node.attrs.get("loop") is not None:
                layer = {**env, init.index: env[node.attrs["loop"]]}
            passed = {k: scalars.compute(v, layer) for k, (_, v) in init.args.items()}
            sub = self.consts(self.program.models[init.model], passed)
            return self.graph(typed.callee[node], inputs, sub, {})
        if node.kind is Kind.FOR:
            (body,) = node.regions
            init = owner.params[node.attrs["stack"]].init
            carried = inputs
            for i in range(scalars.compute(init.count, env)):
                found.update(zip(body.inputs, carried))
                self._nodes(body.nodes, found, typed, {**env, node: i}, model_env)
                carried = [found.get(o) for o in body.outputs]
            return tuple(carried)
        if node.kind is Kind.IF:
            chosen = node.regions[
                0 if scalars.compute(node.attrs["condition"], env) else 1
            ]
            self._nodes(chosen.nodes, found, typed, env, model_env)
            (out,) = chosen.outputs
            return () if isinstance(out, Scalar) else found.get(out)
        op = node.op
        attrs = {k: _valued(v, env) for k, v in node.attrs.items()}
        if op.caches and not self.outside:
            self._kept(typed.decided[node].dtype, inputs, attrs)
        if op.rank.tails:
            inputs = [Tail(()) if dims is None else dims for dims in inputs]
        try:
            dims = op.rank.shape(inputs, attrs)
        except ShapeError:
            return None
        return None if isinstance(dims, Tail) else dims


def _valued(value, env: dict):
    """An attribute with its scalars computed in `env`, as literals."""
    if isinstance(value, Scalar):
        return Scalar.lit(scalars.compute(value, env))
    if isinstance(value, (list, tuple)):
        return type(value)(_valued(v, env) for v in value)
    return value


def _tp(plan, params: list, precision: str) -> dict:
    """The tensor-parallel plan: each split layer with the bytes its collective moves per
    token (a rowwise layer's all-reduce, a gathered output's all-gather: the tensor
    completed, each layer of a stack counted), and each weight kept whole with its reason.
    """
    size = {"f32": 4, "bf16": 2}
    reduced = size["f32" if precision == "f32" else plan.reduce]
    gathered = size[precision]
    split = []
    for entry in plan.entries:
        if not entry.style:
            continue
        pattern = re.compile(re.escape(entry.path).replace(r"\*", r"\d+") + r"\.weight")
        rows = [p["shape"][0] for p in params if pattern.fullmatch(p["name"])]
        each = {shard.ROWWISE: reduced, shard.GATHER: gathered}.get(entry.style, 0)
        split.append(
            {
                "module": entry.path,
                "style": entry.style,
                "bytes_per_token": sum(rows) * each,
                "layers": len(rows),
                "reason": entry.reason,
            }
        )
    whole = [{"name": e.path, "reason": e.reason} for e in plan.whole]
    return {"reduce": plan.reduce, "split": split, "whole": whole}


def _at_lines(typed, line: Optional[int] = None):
    """(source line, specialization, node) of each node `typed` runs; a library function's
    nodes at the line of the use that calls it, as if written out there."""
    for node in walk(typed.graph.nodes):
        callee = typed.callee.get(node)
        number = node.span.line if line is None else line
        if callee is not None and callee.model == LIBRARY:
            yield from _at_lines(callee, number)
        else:
            yield number, typed, node


def _cast_bytes(reached, elements: dict) -> dict:
    """The bytes of f32 masters a forward casts down (each parameter at least once):
    whole tensors, and the rows of tables read by `take`, which are gathered then cast
    (per id gathered), against what casting those tables whole would read."""
    whole, rows = set(), set()
    for typed in reached:
        for node in walk(typed.graph.nodes):
            for index, operand in enumerate(node.inputs):
                if not _cast_down(typed, node, index, operand):
                    continue
                key = typed.decided[operand].dtype
                if (key.model, key.name) not in elements:
                    continue  # stored in bf16: read as it is
                gathered = node.kind is Kind.OP and node.op.gathers and index == 0
                (rows if gathered else whole).add((key.model, key.name))
    tables = [elements[key] for key in rows - whole]
    return {
        "whole": sum(4 * n for n, _ in (elements[key] for key in whole)),
        "per_id": sum(4 * n // max(first, 1) for n, first in tables),  # [0 d]: none
        "tables": sum(4 * n for n, _ in tables),
    }


def _cast_down(typed, node: Node, index: int, operand) -> bool:
    """Whether a node reads an f32 master parameter cast down to bf16."""
    return (
        isinstance(operand, Node)
        and operand.kind is Kind.PARAM
        and is_param(typed.decided[operand].dtype)
        and typed.decision(node).compute == "bf16"
        and node.kind in (Kind.OP, Kind.CAST)
    )


def _add(items: list, item: str) -> None:
    if item not in items:
        items.append(item)


def _reason(typed, node: Node, precision: str):
    """Why this node computes in f32 under :bf16 (or in bf16 under :f32), as the policy
    decided it; None if it is unremarkable."""
    reason = typed.decision(node).reason
    if reason is None:  # inputs, parameters, calls, loops: their nodes have the reasons
        return None
    compute, out = typed.decided[node].compute, typed.decided[node].dtype
    unusual = "bf16" if precision == "f32" else "f32"
    if reason.why is Why.OUT_F32:
        return reason.why.value if precision == "bf16" else None
    if compute != unusual or (precision == "bf16" and out not in ("f32", "bool")):
        return None
    frame = reason.frame
    if reason.why is Why.MARK:
        if frame.mode == ISLAND:
            kind = "library mark" if frame.library else "sensitive mark"
        else:
            kind = "library region" if frame.library else "bf16 region"
        return f"{kind}: {frame.text}"
    if reason.why is Why.CALLED_IN:
        return (
            "sensitive mark: called inside (with-numerics (:sensitivity :high) ...)"
            if compute == "f32"
            else "bf16 region: called inside one"
        )
    if reason.why is Why.CAST:
        return f"explicit (cast ... :{compute})"
    if reason.why is Why.HIGH:
        return f":numerics :high parameter {reason.param}"
    if reason.why is Why.AFTER_OUT_F32:
        return "reads the f32 result of an :out :f32 matmul (an island until it meets bf16)"
    return "no parameter or bf16 value has reached this value yet"


def _contagion(lowered, precision: str, source_lines: list) -> list:
    """Under :bf16, where values first become bf16: an op that reads a parameter (its master
    cast down) while its other float inputs are f32 (6.2)."""
    if precision != "bf16":
        return []
    found: dict = {}
    for typed in lowered.specializations:
        for node in walk(typed.graph.nodes):
            reason = typed.decision(node).reason
            if reason is None or reason.why is not Why.CONTAGION:
                continue
            read = [typed.decided[i].dtype for i in node.inputs if isinstance(i, Node)]
            params = [d.name for d in read if is_param(d)]
            if params and "bf16" not in read:
                cause = f"{echo(node.form)} reads the parameter {params[0]}"
                found.setdefault((node.span.line, cause), None)
    return [
        {"line": line, "source": source_lines[line - 1].strip(), "cause": cause}
        for line, cause in sorted(found)
    ]


def _reach(program, lowered, precision: str, source_lines: list) -> list:
    """Each `with-numerics` form that calls a defun or a sub-model, with the defuns it reaches
    (`MODEL.DEFUN`, what they call included; a sub-model as `MEMBER (MODEL.forward)`): they
    compute as the form says. An island under
    :f32 changes nothing and is left out."""
    graphs = {(s.model, s.graph.name): s.graph for s in lowered.specializations}
    found: dict = {}
    for typed in lint.reached_specializations(program, lowered):
        for node in walk(typed.graph.nodes):
            frame = _own_frame(node)
            if node.kind not in CALLS or frame is None:
                continue
            if frame.mode == ISLAND and precision == "f32":
                continue
            reached = found.setdefault(frame, [])
            for callee in _callees(program, graphs, typed.model, node, set()):
                _add(reached, callee)
    return [
        {
            "line": frame.span.line,
            "source": source_lines[frame.span.line - 1].strip(),
            "form": frame.text,
            "computes": "f32" if frame.mode == ISLAND else "bf16",
            "calls": reached,
        }
        for frame, reached in sorted(
            found.items(), key=lambda item: (item[0].span.line, item[0].span.col)
        )
    ]


def _own_frame(node: Node):
    """The innermost `with-numerics` form written around the node, if any."""
    return next((f for f in reversed(node.frames) if not f.library), None)


def _callees(program, graphs: dict, model: str, node: Node, seen: set) -> list:
    """The defun a call runs (`e (expert.forward)` for a sub-model `e`), then those it calls
    outside forms of their own (which win)."""
    if node.kind is Kind.CALL:
        callee = (model, node.attrs["target"])
        found = [".".join(callee)]
    else:
        member = node.attrs["target"]
        callee = (
            program.submodel(program.model(model), member, node.attrs.get("item")),
            "forward",
        )
        found = [f"{member} ({'.'.join(callee)})"]
    if callee in seen or callee not in graphs:
        return found
    seen.add(callee)
    for inner in walk(graphs[callee].nodes):
        if inner.kind in CALLS and _own_frame(inner) is None:
            found += _callees(program, graphs, callee[0], inner, seen)
    return found


def _warnings(program, lowered, data, source_lines: list) -> list:
    return [
        {
            "line": found.span.line,
            "column": found.span.col,
            "source": source_lines[found.span.line - 1].strip(),
            "message": found.message,
        }
        for found in lint.find(program, lowered, data)
    ]


def _casts(typed, node: Node, lowered) -> list:
    found = []
    for index, operand in enumerate(node.inputs):
        wanted = lowered.read_dtype(typed, node, index)
        have = lowered.value_dtype(typed, operand)
        if wanted and have and wanted != have:
            label = operand.name or echo(operand.form)
            once = " (once per method)" if operand.kind is Kind.PARAM else ""
            found.append(f"{label} {have} -> {wanted}{once}")
    return found


def _params(program, lowered, elements: dict) -> list:
    """One row per tensor of `state_dict`, in its order: a module's parameters, its buffers
    (the frozen parameters), then its sub-modules'. A stack whose instances (times those of
    the stacks around it) number more than MAX_LISTED is visited once: its rows are named
    `blocks.{0..N-1}.w` and count N tensors. `elements` gets (model, param) -> (elements of
    all its f32 instances, its first axis)."""
    rows = _Rows(program, lowered, elements)
    rows.visit(program.top, "", {})
    return rows.rows


def _built(init, key: str, env: dict) -> list:
    """(instance initializer, its key) of a sub-model parameter, as `env`'s consts build
    it: a list's items under `key.0`, `key.1`, ...; the one a choice chooses."""
    if init.kind == "choice":
        return [(init.built(scalars.compute(init.args["when"], env))[0], key)]
    if init.kind in LISTS:
        return [(item, f"{key}.{k}") for k, item in enumerate(init.items)]
    return [(init, key)]


class _Rows:
    """The rows of `_params`, found model by model, each with its consts' values."""

    def __init__(self, program, lowered, elements: dict):
        self.program, self.lowered, self.elements = program, lowered, elements
        self.rows: list = []

    def visit(
        self,
        model,
        prefix: str,
        env: dict,
        copies: int = 1,
        listed: int = 1,
        normed=None,
    ) -> None:
        """`normed`, (name, dim) of the instance's weight-norm: that parameter's g and v
        come last, under torch's parametrization's keys."""
        names = attributes(model)[0]
        env = dict(env)
        for const in model.consts.values():
            env.setdefault(const.name, scalars.compute(const.value, env))
        params = [  # a :when parameter, on the instances that have it
            p
            for p in model.params.values()
            if p.when is None or scalars.compute(p.when, env)
        ]
        tensors = [p for p in params if not p.is_module]
        normed_name = normed and normed[0]
        for param in [p for p in tensors if p.trainable] + [
            p for p in tensors if not p.trainable
        ]:
            if param.name != normed_name:
                self.add(model, param, prefix + names[param.name], env, copies)
        for param in [p for p in params if p.is_module]:
            for init, key in _built(param.init, prefix + names[param.name], env):
                self._sub_model(init, key, env, copies, listed)
        if normed is not None:
            param = model.params[normed_name]
            key = f"{prefix}parametrizations.{names[normed_name]}.original"
            # g: one norm per slice along dim, v's other sizes 1 (torch's norm_except_dim)
            self.add(model, param, key + "0", env, copies, normed[1])
            self.add(model, param, key + "1", env, copies)

    def _sub_model(self, init, key: str, env: dict, copies: int, listed: int) -> None:
        """A sub-model's rows; a stack's instance by instance, while they are few enough."""
        sub = self.program.models[init.model]
        sub_env = {k: scalars.compute(v, env) for k, (_, v) in init.args.items()}
        count = scalars.compute(init.count, env) if init.kind == "stack" else None
        norm = init.weight_norm
        normed = norm and (norm.name.name, scalars.compute(norm.dim, env))
        if count is None:
            self.visit(sub, key + ".", sub_env, copies, listed, normed)
        elif listed * count <= MAX_LISTED:
            for i in range(count):
                layer = {**env, init.index: i} if init.index else env
                sub_env = {
                    k: scalars.compute(v, layer) for k, (_, v) in init.args.items()
                }
                self.visit(sub, f"{key}.{i}.", sub_env, copies, listed * count, normed)
        else:
            self.visit(
                sub,
                f"{key}.{{0..{count - 1}}}.",
                sub_env,
                copies * count,
                listed,
                normed,
            )

    def add(
        self, model, param, key: str, env: dict, copies: int, norms_along=None
    ) -> None:
        """A parameter's row; with `norms_along` (an axis), its weight-norm's g's."""
        sizes = initializers.sizes(param.init)
        shape = [scalars.compute(size, env) for size in sizes]
        if norms_along is not None:
            along = norms_along % len(shape)
            shape = [n if i == along else 1 for i, n in enumerate(shape)]
        dtype = self.lowered.storage[model.name, param.name]
        count = math.prod(shape)
        if dtype == "f32" and norms_along is None:  # the weight's elements are v's
            total, _ = self.elements.get((model.name, param.name), (0, None))
            # a 0-d parameter has no first axis, and is no table `take` reads rows of
            first = shape[0] if shape else 1
            self.elements[model.name, param.name] = (total + count * copies, first)
        self.rows.append(
            {
                "name": key,
                "shape": shape,
                "dtype": dtype,
                "bytes": count * BYTES[dtype] * copies,
                "trainable": param.trainable,
                "persistent": param.persistent,
                "count": copies,
            }
        )


def render(report: dict) -> str:
    """The report for people: source lines quoted, columns aligned."""
    head = f"{errors.terminal_safe(report['file'])}: run {report['run'] or '(none)'}, precision {report['precision']}"
    listed = (
        report["lines"] + report["contagion"] + report["reach"] + report["warnings"]
    )
    lines = _Quoted(max((len(str(item["line"])) for item in listed), default=1))
    out = [head, "", *_kept(report, lines)]
    if report["precision"] == "bf16":
        out += ["", *_contagion_lines(report, lines)]
    if report["reach"]:
        out += ["", "Calls inside with-numerics forms (they compute as the form says):"]
    for item in report["reach"]:
        out += lines.quote(item["line"], item["source"])
        out += lines.under(f"{item['computes']}: {', '.join(item['calls'])}")
    out += ["", *_warning_lines(report, lines)]
    out += ["", *_cast_lines(report["casts"])]
    out += ["", *_tp_lines(report["tp"])]
    if report["cache"] is not None:
        out += ["", _cache_line(report["cache"])]
    out += ["", *_param_table(report)]
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class _Quoted:
    """Source lines quoted under their numbers, and what is said of them below them."""

    width: int  # of the widest line number

    def quote(self, line: int, source: str) -> list:
        return [f"  {line:>{self.width}} | {source}"]

    def under(self, text: str) -> list:
        return [f"  {' ' * (self.width + 3)}{text}"]


def _kept(report: dict, lines: _Quoted) -> list:
    kept = "Where the policy keeps f32" if report["kept"] == "f32" else "bf16 regions"
    out = [f"{kept}:" if report["lines"] else f"{kept}: none"]
    for line in report["lines"]:
        out += lines.quote(line["line"], line["source"])
        for reason in line["reasons"]:
            out += lines.under(f"why:  {reason}")
        for cast in line["casts"]:
            out += lines.under(f"cast: {cast}")
    return out


def _contagion_lines(report: dict, lines: _Quoted) -> list:
    become = "Where values become bf16"
    out = [f"{become}:" if report["contagion"] else f"{become}: none"]
    for item in report["contagion"]:
        out += lines.quote(item["line"], item["source"])
        out += lines.under(item["cause"])
    return out


def _warning_lines(report: dict, lines: _Quoted) -> list:
    """Each warning under its line, a line quoted once for the warnings in a row on it."""
    out = ["Warnings:" if report["warnings"] else "Warnings: none"]
    shown = None
    for warning in report["warnings"]:
        if warning["line"] != shown:
            out += lines.quote(warning["line"], warning["source"])
            shown = warning["line"]
        out += lines.under(warning["message"])
    return out


def _cast_lines(casts: dict) -> list:
    out = ["Casts per forward (f32 masters to bf16):"]
    out.append(f"  whole parameters: {casts['whole']:,} bytes")
    if casts["tables"]:
        out.append(
            f"  table rows, gathered then cast: {casts['per_id']:,} bytes per id "
            f"(the tables whole would be {casts['tables']:,} bytes)"
        )
    return out


def _tp_lines(tp: dict) -> list:
    if not tp["split"]:
        out = ["Tensor parallelism: no linear layer splits"]
    else:
        out = [f"Tensor parallelism (TP_PLAN; rowwise reductions in {tp['reduce']}):"]
        width = max(len(s["module"]) for s in tp["split"])
        for s in tp["split"]:
            moved = (
                f"  {s['bytes_per_token']:,} bytes per token"
                + (f" ({s['layers']} layers)" if s["layers"] > 1 else "")
                if s["bytes_per_token"]
                else ""
            )
            out.append(f"  {s['module']:<{width}}  {s['style']}{moved}")
            if s["reason"]:
                out.append(f"    why: {s['reason']}")
    out.append("  Kept whole on every device:" if tp["whole"] else "")
    for w in tp["whole"]:
        out += [f"  {w['name']}", f"    why: {w['reason']}"]
    return [line for line in out if line]


def _cache_line(cache: dict) -> str:
    line = (
        f"KV cache (generate): {cache['bytes_per_token']:,} bytes per token, keys and "
        f"values of {cache['attentions']} attention calls"
    )
    if cache["unknown"]:
        line += f" ({cache['unknown']} of sizes not known when the file compiles, not counted)"
    return line


def _frozen(param: dict) -> str:
    """What the dtype column adds of a buffer: frozen, and whether state_dict holds it."""
    if param["trainable"]:
        return ""
    return " (frozen)" if param["persistent"] else " (frozen, not in state_dict)"


def _param_table(report: dict) -> list:
    """The parameters' rows, columns aligned, then the totals."""
    out = ["Parameters:"]
    table = [("name", "shape", "dtype", "bytes")]
    table += [
        (
            p["name"],
            "[" + ", ".join(map(str, p["shape"])) + "]",
            p["dtype"] + _frozen(p),
            f"{p['bytes']:,}",
        )
        for p in report["params"]
    ]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    for row in table:
        out.append(
            "  "
            + "  ".join(
                cell.ljust(w) if i < 3 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths))
            )
        )
    for name in ("trainable", "frozen", "all"):
        out.append(
            f"  {name + ':':<11}{report['totals'][name]:>{widths[3] + 2},} bytes"
        )
    return out


def to_json(report: dict) -> str:
    return json.dumps(report, indent=2) + "\n"
