"""`sx2torch run FILE.lisp --input NAME=FILE.pt ...`: a defun's value, from the interpreter."""

from __future__ import annotations

import argparse

import torch

import sx2torch.interpret as interpret
import sx2torch.output as output
from sx2torch.errors import SourceError, UsageError
from sx2torch.interpret.evaluate import FAILED_AT, FAILURES


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=FILE.pt",
        help="an argument of the defun: a tensor saved with torch.save",
    )
    parser.add_argument(
        "--method", default="forward", help="the defun (default: forward)"
    )
    parser.add_argument(
        "--params",
        metavar="STATE.pt",
        help="a state_dict to load (default: drawn as the module draws them, after --seed)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="torch.manual_seed before drawing"
    )
    parser.add_argument("-o", "--output", help="save the result here with torch.save")


def run(args, text: str, name: str) -> int:
    torch.manual_seed(args.seed)
    model = interpret.load(text, name, args.run, state=_load(args.params))
    defun = model.program.top.defuns.get(args.method)
    if defun is None:
        raise UsageError(
            f"--method {args.method}: the top model has no defun of that name"
        )
    given = dict(_pair(spec) for spec in args.input)
    missing = [a.name for a in defun.args if a.name not in given]
    if missing:
        raise UsageError(f"no --input for {', '.join(missing)} (NAME=FILE.pt)")
    inputs = [_load(given[a.name]) for a in defun.args]
    try:
        result = model(args.method, *inputs)
    except FAILURES as error:
        span = getattr(error, FAILED_AT, None)
        if span is None or isinstance(error, RecursionError):
            raise
        reason = " ".join(str(error).split("\n")[0].split())
        raise SourceError(
            span,
            f"this form fails on the given inputs: {type(error).__name__}: {reason}",
        ) from None
    if args.output:
        torch.save(result, args.output)
    else:
        output.to_stdout(f"{result}\n")
    return 0


def _pair(spec: str) -> tuple:
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise UsageError(f"--input {spec}: expected NAME=FILE.pt")
    return name, path


def _load(path):
    if path is None:
        return None
    try:
        return torch.load(path, weights_only=True)
    except (OSError, RuntimeError) as error:
        raise UsageError(f"cannot load {path}: {error}") from None
