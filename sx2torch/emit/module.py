"""The emit pass: typed specializations and their names -> one libcst Module (header,
imports, the library's functions, one class per model, and a `__main__` block that trains
where the chosen run has a loss). Each method is written by sx2torch/emit/method.py."""

from __future__ import annotations

import keyword
from typing import Optional

import libcst as cst

import sx2torch.build as b
from sx2torch.emit import conditionals, functions, main, targets
from sx2torch.emit.method import ClassContext, MethodEmitter, located
from sx2torch.syntax.names import mangle
from sx2torch.emit.naming import Naming, argument, store as store_of
from sx2torch.ir import ISLAND, REGION, Scalar, walk
from sx2torch.ops import initializers
from sx2torch.plan import Plans
from sx2torch.plan.methods import defuns
from sx2torch.plan.targets import Target
from sx2torch.policy import Lowered, Typed
from sx2torch.policy.rules import is_param
from sx2torch.emit import scalars
from sx2torch.syntax.echo import echo
from sx2torch.syntax.program import Model, Param, Program, Run, Tie
from sx2torch.shard import Plan
from sx2torch.syntax.scalars import ScalarOp

AMBIENT = {ISLAND: "in an f32 island", REGION: "in a bf16 region"}


def run(
    program: Program,
    lowered: Lowered,
    plans: Plans,
    naming: Naming,
    header: str,
    target: Target,
    source_lines=None,
    chosen: Optional[Run] = None,
    plan: Optional[Plan] = None,
) -> cst.Module:
    """The module: imports, the library's functions, one class per model, and the
    `__main__` block of the chosen `run` form where it trains."""
    classes = naming.classes
    contexts = {
        model.name: ClassContext(
            target, plans, naming, naming.attrs[model.name], source_lines
        )
        for model in program.all_models()
    }
    body = _preamble(program, classes)
    bare = ClassContext(target, plans, naming, {}, source_lines)
    body += functions.definitions(plans, naming, lambda t, name: _method(t, name, bare))
    by_defun = defuns(lowered)  # once: a scan per class grows with classes x methods
    written: dict = {}
    for model in program.all_models():
        top = _tp_plan(plan, naming) if model.is_top and plan and plan.styles else []
        written[model.name] = _class(
            program, model, lowered, by_defun, contexts[model.name], top
        )
        if model.copy_of is not None:
            original, instance = model.copy_of
            written[model.name] = _subclass(
                written[model.name], written[original], instance
            )
        body.append(written[model.name])
    if chosen is not None and chosen.loss is not None:
        body.append(_main(program, plans, naming, chosen))
    if "math" in plans.imports:
        body.insert(0, _import("math"))
    comments = [
        cst.EmptyLine(comment=cst.Comment("# " + line)) for line in header.splitlines()
    ]
    return conditionals.statements(cst.Module(body=body, header=comments))


def _preamble(program: Program, classes: dict) -> list:
    """The imports the module's code reads, and `__all__`: its classes, the top one first."""
    return [
        _import("torch"),
        cst.SimpleStatementLine(
            [cst.ImportFrom(cst.Name("torch"), [cst.ImportAlias(cst.Name("nn"))])]
        ),
        cst.SimpleStatementLine(
            [
                cst.ImportFrom(
                    b.dotted("torch.nn"),
                    [
                        cst.ImportAlias(
                            cst.Name("functional"), asname=cst.AsName(cst.Name("F"))
                        )
                    ],
                )
            ]
        ),
        cst.SimpleStatementLine(
            [
                cst.ImportFrom(
                    cst.Name("sx2torch"),
                    [
                        cst.ImportAlias(
                            cst.Name("runtime"), asname=cst.AsName(cst.Name("sx"))
                        )
                    ],
                )
            ]
        ),
        cst.SimpleStatementLine(
            [
                cst.Assign(
                    [cst.AssignTarget(cst.Name("__all__"))],
                    b.list_(
                        [
                            b.string(classes[m.name])
                            for m in [program.top, *program.models.values()]
                        ]
                    ),
                )
            ]
        ),
    ]


def _main(program: Program, plans: Plans, naming: Naming, chosen: Run) -> cst.If:
    """The `__main__` block that runs the chosen `run` form, with its loss's public method."""
    loss = next(
        name
        for typed, name in naming.methods.items()
        if typed.model == program.top.name
        and typed.graph.name == chosen.loss.name
        and typed not in plans.specialized
    )
    top = naming.classes[program.top.name]
    return main.block(program, chosen, top, loss, naming.attrs)


def _import(name: str) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine([cst.Import([cst.ImportAlias(cst.Name(name))])])


def _class(
    program,
    model: Model,
    lowered: Lowered,
    by_defun: dict,
    ctx: ClassContext,
    attributes: list,
) -> cst.ClassDef:
    body: list = []
    if model.doc is not None:
        body.append(_docstring(model.doc))
    body += attributes
    body.append(_init(program, model, lowered, ctx))
    emitted = set()
    for defun in model.defuns:
        specs = by_defun.get((model.name, defun), [])
        plain = lowered.natural[model.name, defun]
        methods = [
            (ctx.plans.plans[t].code, ctx.naming.methods[t])
            for t in ([plain] if plain is not None else []) + specs
            if t in ctx.naming.methods and not ctx.plans.function(t)
        ]
        public = next((m for m in methods if m[0] not in ctx.plans.specialized), None)
        for code, name in methods:
            if name not in emitted:
                emitted.add(name)
                body.append(_saving(_method(code, name, ctx, public), ctx, code))
    base = b.dotted("nn.Module")
    return cst.ClassDef(
        cst.Name(ctx.naming.classes[model.name]),
        cst.IndentedBlock(body),
        bases=[cst.Arg(base)],
        leading_lines=[cst.EmptyLine(), cst.EmptyLine()],
    )


def _subclass(copy: cst.ClassDef, original: cst.ClassDef, instance: str):
    """A :generate run's copy of a model for one instance, as a subclass of the model's
    class that writes only the methods the copy computes otherwise (the constructor and
    the others are the same)."""
    code = cst.Module([]).code_for_node
    theirs = {
        s.name.value: code(s)
        for s in original.body.body
        if isinstance(s, cst.FunctionDef)
    }
    own = [
        s
        for s in copy.body.body
        if isinstance(s, cst.FunctionDef) and theirs.get(s.name.value) != code(s)
    ]
    doc = f"{original.name.value} as {instance} runs it while generating."
    return copy.with_changes(
        body=cst.IndentedBlock([_docstring(doc), *own]),
        bases=[cst.Arg(cst.Name(original.name.value))],
    )


def _saving(
    method: cst.FunctionDef, ctx: ClassContext, typed: Typed
) -> cst.FunctionDef:
    """A held target's method that rounds values, decorated to save them for the backward
    in 2 bytes (sx2torch/runtime/rounding.py)."""
    if not ctx.plans.plans[typed].saves_bf16:
        return method
    return method.with_changes(decorators=[cst.Decorator(b.dotted("sx.saves_bf16"))])


def _tp_plan(plan: Plan, naming: Naming) -> list:
    """The tensor-parallel plan the shard pass derived, as `sx.tensor_parallel` applies it,
    and the size of the heads each split layer's output splits into."""
    why = {
        "f32": "all-reduce f32 partial sums, rounded once",
        "bf16": "all-reduce partial products rounded to bf16",
    }[plan.reduce]
    comments = [
        "The tensor-parallel plan, which sx2torch.runtime.parallel.tensor_parallel",
        f"applies; rowwise layers {why}.",
    ]
    lines = [cst.EmptyLine(comment=cst.Comment(f"# {line}")) for line in comments]
    return [
        _assign("TP_PLAN", plan.styles).with_changes(leading_lines=lines),
        _assign("TP_REDUCE", plan.reduce),
        *_tp_heads(plan, naming),
    ]


def _tp_heads(plan: Plan, naming: Naming) -> list:
    """`TP_HEADS`: each split layer whose output splits into heads -> the head's size, a
    number or the path of the attribute its module is built with (several: their product),
    so that tensor_parallel refuses devices that would hold part of a head."""
    heads = {}
    for entry in plan.entries:
        if not entry.heads:
            continue
        owner = entry.path.rpartition(".")[0]
        terms = [
            (
                s.value
                if s.op is ScalarOp.LIT
                else f"{owner}.{naming.attrs[entry.owner][s.args[0]]}".lstrip(".")
            )
            for s in entry.heads
        ]
        heads[entry.path] = terms[0] if len(terms) == 1 else terms
    if not heads:
        return []
    comments = [
        "# Each split layer's rows hold whole heads of this size, which tensor_parallel",
        "# checks against the devices.",
    ]
    return [
        _assign("TP_HEADS", heads).with_changes(
            leading_lines=[cst.EmptyLine(comment=cst.Comment(c)) for c in comments]
        )
    ]


def _assign(name: str, value) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine(
        [cst.Assign([cst.AssignTarget(cst.Name(name))], b.literal(value))]
    )


def _docstring(text: str) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine([cst.Expr(b.docstring(text))])


def _method(typed: Typed, name: str, ctx: ClassContext, public=None) -> cst.FunctionDef:
    emitter = MethodEmitter(typed, ctx)
    names = ctx.naming.locals[typed]
    args, keys = names.args, list(names.keys.values())
    defaults = [_key_default(default) for _, default in typed.graph.keys]
    prologue = [
        _assign_name(args[i], targets.cast(b.name(args[i]), cast))
        for i, cast in ctx.plans.plans[typed].entry.items()
    ]
    prologue += [
        _if_none(key, emitter.spelling.scalar(default))
        for key, (_, default) in zip(keys, typed.graph.keys)
        if default.op != "lit"
    ]
    params = cst.Parameters(
        params=[cst.Param(cst.Name("self"))] + [cst.Param(cst.Name(a)) for a in args],
        star_arg=cst.ParamStar() if keys else cst.MaybeSentinel.DEFAULT,
        kwonly_params=[
            cst.Param(cst.Name(k), default=d, equal=b.KEYWORD_EQUAL)
            for k, d in zip(keys, defaults)
        ],
    )
    body = (
        ([_docstring(typed.graph.doc)] if typed.graph.doc is not None else [])
        + prologue
        + emitter.body()
    )
    leading = []
    if typed in ctx.plans.specialized:
        why = _why_own(typed, public)
        leading += [cst.EmptyLine(comment=cst.Comment("# " + why))] if why else []
        leading.append(cst.EmptyLine(comment=cst.Comment("# " + _specialized(typed))))
    return cst.FunctionDef(
        cst.Name(name), params, cst.IndentedBlock(body), leading_lines=leading
    )


def _specialized(typed: Typed) -> str:
    parts = [
        f"{node.name}: {_describe(d)}"
        for node, d in zip(typed.graph.inputs, typed.signature)
    ]
    where = f", called {AMBIENT[typed.ambient]}" if typed.ambient else ""
    return f"{typed.graph.name} for {', '.join(parts) or 'no arguments'}{where}"


def _why_own(typed: Typed, public) -> Optional[str]:
    """Why a specialization is a method beside the public one, `public` (its Typed and
    name): the first value it computes in another dtype, else the first argument it takes
    as another kind than an f32 one cast down. A call in a with-numerics form says why in
    its own comment."""
    if public is None or typed.ambient:
        return None
    other, name = public
    for node in walk(typed.graph.nodes):
        mine, theirs = typed.decision(node).compute, other.decision(node).compute
        if node.form is not None and None not in (mine, theirs) and mine != theirs:
            what = f"{echo(node.form)} is {mine}"
            return f"a method of its own: {what} here, {theirs} in {name}"
    for node, mine, theirs in zip(typed.graph.inputs, typed.signature, other.signature):
        if mine != theirs and (theirs, mine) != ("f32", "bf16"):
            what = f"{node.name} is {_describe(mine)}"
            return f"a method of its own: {what} here, {_describe(theirs)} in {name}"
    return None


def _describe(dtype: str) -> str:
    return f"the parameter {dtype.name}" if is_param(dtype) else dtype


def _key_default(default: Scalar) -> cst.BaseExpression:
    return b.number(default.value) if default.op is ScalarOp.LIT else b.name("None")


def _if_none(name: str, value: cst.BaseExpression) -> cst.If:
    test = cst.Comparison(
        b.name(name), [cst.ComparisonTarget(cst.Is(), b.name("None"))]
    )
    return cst.If(test, cst.IndentedBlock([_assign_name(name, value)]))


def _assign_name(target, value) -> cst.SimpleStatementLine:
    target = b.name(target) if isinstance(target, str) else target
    return cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(target)], value)])


def _init(
    program,
    model: Model,
    lowered: Lowered,
    ctx: ClassContext,
) -> cst.FunctionDef:
    # in the constructor a const is its argument: `bias`, where the model reads it as
    # `has-bias` (stored, where a method reads it, as `self.has_bias`)
    attrs = ctx.attrs
    names = {**attrs, **{c.name: argument(c, attrs) for c in model.consts.values()}}
    consts = list(model.consts.values())
    kwonly = [
        cst.Param(
            cst.Name(names[c.name]),
            default=None if c.required else _key_default(c.value),
            equal=cst.MaybeSentinel.DEFAULT if c.required else b.KEYWORD_EQUAL,
        )
        for c in consts
    ]
    body: list = [
        cst.SimpleStatementLine([cst.Expr(b.call(b.attr(b.call("super"), "__init__")))])
    ]
    read = ctx.plans.read_consts.get(model.name, set())
    for const in consts:
        if const.value.op is not ScalarOp.LIT:
            body.append(_if_none(names[const.name], _init_scalar(const.value, names)))
        if const.flag or const.name in read:  # a flag is set on a built module
            body.append(
                _assign_name(
                    b.attr(b.name("self"), attrs[const.name]), b.name(names[const.name])
                )
            )
    for param in model.params.values():
        # located: an error building it (a size past the limit) points at its defparam
        first, *rest = _param(program, model, param, lowered, ctx, names)
        body.append(_documented(located(first, param.span, ctx.source_lines), param))
        body += rest
    body += [_tie(program, model, tie, ctx) for tie in model.ties]
    params = cst.Parameters(
        star_arg=cst.ParamStar() if kwonly else cst.MaybeSentinel.DEFAULT,
        kwonly_params=kwonly,
    )
    params = params.with_changes(params=[cst.Param(cst.Name("self"))])
    return cst.FunctionDef(cst.Name("__init__"), params, cst.IndentedBlock(body))


def _documented(statement, param: Param):
    """A parameter's docstring as comment lines above the statement that makes it."""
    if param.doc is None:
        return statement
    lines = [line.strip() for line in param.doc.strip().splitlines()] or [""]
    comments = [
        cst.EmptyLine(comment=cst.Comment(f"# {line}".rstrip())) for line in lines
    ]
    return statement.with_changes(leading_lines=comments)


def _init_scalar(scalar: Scalar, names: dict) -> cst.BaseExpression:
    if scalar.op is ScalarOp.LIT:
        return b.number(scalar.value)
    if scalar.op is ScalarOp.CONST:
        return b.name(names[scalar.args[0]])
    if scalar.op is ScalarOp.LAYER:
        return b.name(mangle(scalar.args[0]))
    return scalars.python(
        scalar.op, scalar.args, lambda operand: _init_scalar(operand, names)
    )


def _param(program, model: Model, param: Param, lowered: Lowered, ctx, names: dict):
    init = param.init

    def scalar(s):
        return _init_scalar(s, names)

    if param.is_module:

        def instance(init):
            sub, sub_names = program.models[init.model], ctx.naming.attrs[init.model]
            kwargs = {
                argument(sub.consts[k], sub_names): scalar(v)
                for k, (_, v) in init.args.items()
            }
            built = b.call(b.name(ctx.naming.classes[init.model]), **kwargs)
            norm = init.weight_norm
            if norm is None:
                return built
            # torch's own parametrization: its keys, its g computed from the drawn v, and
            # its forward, torch._weight_norm(v, g, dim), wherever the weight is read
            return b.call(
                "nn.utils.parametrizations.weight_norm",
                built,
                name=b.string(sub_names[norm.name.name]),
                dim=scalar(norm.dim),
            )

        def register(value):
            return _register(model, param, value, ctx)

        if init.kind == "model":
            return _when(param, scalar, register(instance(init)))
        if init.kind == "sequential":
            items = b.call("nn.Sequential", *map(instance, init.items))
            return _when(param, scalar, register(items))
        if init.kind == "module-list":
            items = b.call("nn.ModuleList", b.list_(list(map(instance, init.items))))
            return _when(param, scalar, register(items))
        if init.kind == "choice":  # as transformers chooses a layer's mlp
            then, otherwise = (register(instance(i)) for i in init.items)
            chosen = cst.If(
                scalar(init.args["when"]),
                cst.IndentedBlock([then]),
                orelse=cst.Else(cst.IndentedBlock([otherwise])),
            )
            return _when(param, scalar, chosen)
        loop = cst.CompFor(
            target=cst.Name(mangle(init.index) if init.index else "_"),
            iter=_layers(init.count, scalar),
        )
        instances = b.call("nn.ModuleList", cst.ListComp(instance(init), loop))
        return _when(param, scalar, register(instances))
    value = initializers.emit(init, scalar)
    if lowered.storage[model.name, param.name] == "bf16":
        value = b.method(value, "to", b.dotted("torch.bfloat16"))
    if param.trainable:
        value = b.call("nn.Parameter", value)
    made = [_register(model, param, value, ctx), *_left_out(model, param, ctx)]
    return _when(param, scalar, *made, *_padding_row(model, param, ctx, scalar))


def _left_out(model: Model, param: Param, ctx: ClassContext) -> list:
    """A buffer that state_dict leaves out, keyed as nn.Module's own attribute: put in its
    store (`_register`), since register_buffer refuses that key, and named in the module's
    set of buffers left out, as register_buffer's `persistent=False` names it."""
    if param.persistent or not _in_store(model, param, ctx):
        return []
    left_out = b.attr(b.name("self"), "_non_persistent_buffers_set")
    add = b.method(left_out, "add", b.string(ctx.attrs[param.name]))
    return [cst.SimpleStatementLine([cst.Expr(add)])]


def _padding_row(model: Model, param: Param, ctx: ClassContext, scalar) -> list:
    """A drawn table's :padding-idx row zeroed, as nn.Embedding's reset_parameters does:
    `with torch.no_grad(): self.weight[padding_idx].fill_(0)`, under `if padding_idx is
    not None:` where the caller sets it."""
    row = param.init.args.get("padding-idx")
    if row is None or (row.op is ScalarOp.LIT and row.value is None):
        return []
    key, store = ctx.attrs[param.name], store_of(param)
    own = _in_store(model, param, ctx)
    table = b.member(
        b.name("self"), key, store if own or keyword.iskeyword(key) else None
    )
    fill = b.method(b.subscript(table, scalar(row)), "fill_", b.number(0))
    zeroed = cst.With(
        [cst.WithItem(b.call("torch.no_grad"))],
        cst.IndentedBlock([cst.SimpleStatementLine([cst.Expr(fill)])]),
    )
    if row.op is ScalarOp.LIT:
        return [zeroed]
    given = cst.Comparison(
        scalar(row), [cst.ComparisonTarget(cst.IsNot(), b.name("None"))]
    )
    return [cst.If(given, cst.IndentedBlock([zeroed]))]


def _layers(count: Scalar, scalar) -> cst.BaseExpression:
    """A count from constructor arguments is checked against the limit when the module is
    built; a literal one was checked when it compiled."""
    if count.op is ScalarOp.LIT:
        return b.call("range", scalar(count))
    return b.call("sx.layers", scalar(count))


REGISTER = {"parameters": "register_parameter", "modules": "add_module"}


def _in_store(model: Model, param: Param, ctx: ClassContext) -> bool:
    """Whether the parameter's key is nn.Module's own attribute, so that the module puts
    it straight into its store (`self._buffers["type"]`)."""
    return ctx.naming.stores[model.name].get(param.name) is not None


def _register(model: Model, param: Param, value, ctx: ClassContext):
    """`self.w = ...` (a buffer: `self.register_buffer("w", ...)`, with `persistent=False`
    where state_dict leaves it out); a key that is a Python
    keyword is registered by name (`self.add_module("class", ...)`), one that is nn.Module's
    own attribute straight into its store (`self._parameters["type"] = ...`)."""
    key, store = ctx.attrs[param.name], store_of(param)
    attribute = not _in_store(model, param, ctx)
    if (store == "buffers" and attribute) or keyword.iskeyword(key):
        register = REGISTER.get(store, "register_buffer")
        persistent = {} if param.persistent else {"persistent": b.name("False")}
        call = b.call(
            b.attr(b.name("self"), register), b.string(key), value, **persistent
        )
        return cst.SimpleStatementLine([cst.Expr(call)])
    return _assign_name(
        b.member(b.name("self"), key, None if attribute else store), value
    )


def _tie(program: Program, model: Model, tie: Tie, ctx: ClassContext):
    """`self.lm_head.weight = self.transformer.wte.weight`: one nn.Parameter under both
    keys, as transformers' tie_weights leaves them."""
    naming = ctx.naming

    def path(name: str):
        node = b.name("self")
        for owner, member in program.member(model, name):
            store = naming.stores.get(owner.name, {}).get(member)
            node = b.member(node, naming.attrs[owner.name][member], store)
        return node

    target, value = path(tie.name.name), path(tie.target.name)
    if isinstance(target, cst.Call):  # getattr(obj, "class"): a keyword is set by name
        return cst.SimpleStatementLine(
            [cst.Expr(b.call("setattr", *[a.value for a in target.args], value))]
        )
    return _assign_name(target, value)


def _when(param: Param, scalar, *statements) -> list:
    """A `:when` parameter exists only on the instances whose consts meet its condition."""
    if param.when is None:
        return list(statements)
    return [cst.If(scalar(param.when), cst.IndentedBlock(list(statements)))]
