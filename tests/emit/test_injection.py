"""Hostile Lisp names and docstrings compile to a module that defines its classes and does nothing else.

The reader accepts only the ASCII symbol characters `A-Za-z0-9_*+/<>=!?&.%-`, and strings appear only
as docstrings, so what can try to break out is a name that means something to Python (a keyword, a
builtin, the module's own imports, nn.Module's attributes) and the text of a docstring.
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sx2torch.compiler import Options, compile_source

Q = '\\"'  # a double quote inside a Lisp string
HOSTILE = (
    '(defconst class 3 "a const named class")\n'
    "(defconst import 3)\n"
    "(defconst training 1)\n"
    "(defparam self (normal [class import] :std 0.1))\n"
    "(defparam torch (zeros [import]))\n"
    "(defparam w-1 (ones [import]))\n"
    "(defparam float (ones [import]))\n"
    "(defun lambda (__import__ os.system)\n"
    f"  \"{Q * 3}; import os; os.system('touch pwned'); {Q * 3} \\\\ NUL:\x00 LS:\u2028 CR:\r ''' {{}} %s\"\n"
    "  (let ((print (matmul __import__ self))\n"
    "        (exec (+ print torch))\n"
    "        (eval (* exec os.system)))\n"
    "    (+ eval w-1 float)))\n"
    "(defun to (x-y x_y)\n"
    "  (- x-y x_y))\n"
    "(defun super (F nn sx)\n"
    "  (+ F (* nn sx)))\n"
    "(defun forward (x)\n"
    f'  "Triple {Q * 3} quotes, a backslash \\\\ and a tab\t, ending in a quote {Q}"\n'
    "  (let ((y (lambda x x))\n"
    "        (__class__ (to y y)))\n"
    "    (super __class__ y (relu y))))\n"
)
SUB_MODELS = (
    "(defmodel f (&key (d 3))\n"
    f'  "{Q * 3}); __import__({Q}os{Q}).system({Q}touch pwned{Q}) #"\n'
    "  (defparam eval (ones [d]))\n"
    "  (defun forward (x) (* x eval)))\n"
    "(defmodel torch (&key (d 3)) (defparam nn (ones [d])) (defun forward (x) (+ x nn)))\n"
    "(defmodel __import__ (&key (d 3)) (defun forward (x) (relu x)))\n"
    "(defmodel sx (&key (d 3)) (defun forward (x) (neg x)))\n"
    "(defconst exec 3)\n"
    "(defparam F (f :d exec))\n"
    "(defparam nn (torch :d exec))\n"
    "(defparam open (stack 2 (__import__ :d exec)))\n"
    "(defparam cuda (sx :d exec))\n"
    "(defun forward (x) (cuda (chain open (nn (F x)))))\n"
)
DOCSTRINGS = [
    '"""',
    "'''",
    '\\"',
    "\\",
    "ends with a backslash \\",
    '"""; import os; os.system("touch pwned"); """',
    "\x00",
    "\u2028\u2029\x85\x0c\x1c",
    "\r\n\r",
    "  leading and trailing spaces  ",
    "\\N{BULLET} \\u2022 \\x41 {0} %(x)s",
    "line one\n    line two, indented\n",
    "é ü ☃ 𝔘",
]
PROGRAMS = {
    "hostile.lisp": HOSTILE,
    "F.lisp": SUB_MODELS,
    "__init__.lisp": "(defun forward (x) (* x 2))\n",
    **{
        f"doc{i}.lisp": '(defun forward (x)\n  "'
        + d.replace("\\", "\\\\").replace('"', '\\"')
        + '"\n  (* x 2))\n'
        for i, d in enumerate(DOCSTRINGS)
    },
}
IMPORTS = [
    "import torch",
    "from torch import nn",
    "from torch.nn import functional as F",
    "from sx2torch import runtime as sx",
]
RUNNER = """
import contextlib, importlib.util, io, json, sys
import torch
import sx2torch.runtime

BAD = ("os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "subprocess.", "socket.", "os.remove",
       "os.unlink", "os.rename", "os.mkdir", "os.chmod", "shutil.", "ctypes.", "builtins.input", "webbrowser.")
events = []

def hook(event, args):
    if event.startswith(BAD):
        events.append(event)
    elif event == "open" and args[1] is not None and any(c in str(args[1]) for c in "wax+"):
        events.append(f"open {args[0]} {args[1]}")
    elif event == "import" and not args[0].split(".")[0] in ("torch", "sx2torch") and args[0] not in sys.modules:
        events.append(f"import {args[0]}")

results = {}
for path in sys.argv[1:]:
    spec = importlib.util.spec_from_file_location("generated", path)
    module = importlib.util.module_from_spec(spec)
    printed = io.StringIO()
    events.clear()
    if not results:
        sys.addaudithook(hook)
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        spec.loader.exec_module(module)
        model = getattr(module, module.__all__[0])()
        y = model(torch.ones(2, 3))
    results[path] = {
        "printed": printed.getvalue(),
        "events": list(events),
        "names": sorted(k for k in vars(module) if not k.startswith("__")),
        "all": module.__all__,
        "shape": list(y.shape),
        "state": sorted(model.state_dict()),
    }
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("hostile")
    return {
        name: (folder, compile_source(source, name, Options()))
        for name, source in PROGRAMS.items()
    }


@pytest.mark.parametrize("name", PROGRAMS)
def test_only_the_expected_imports_and_free_names(compiled, name):
    tree = ast.parse(compiled[name][1])
    imports = [
        ast.unparse(node)
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
    ]
    assert imports == IMPORTS
    bound = {
        n.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    bound |= {
        a.arg
        for n in ast.walk(tree)
        if isinstance(n, ast.arguments)
        for a in n.args + n.kwonlyargs
    }
    bound |= {
        n.name for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef))
    }
    free = {
        n.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    } - bound
    assert free <= {"torch", "nn", "F", "sx", "super", "range"}


@pytest.mark.parametrize("name", [n for n in PROGRAMS if n.startswith("doc")])
def test_docstrings_keep_their_text(compiled, name):
    source_doc = DOCSTRINGS[int(name[3:-5])]
    tree = ast.parse(compiled[name][1])
    method = next(
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef) and n.name == "forward"
    )
    doc = ast.get_docstring(method, clean=False)
    assert doc is not None and doc.strip() == source_doc.strip()


def test_names_are_renamed_predictably(compiled):
    code = compiled["hostile.lisp"][1]
    for renamed in ["class_=3", "import_=3", "training_=1", "self.self =", "self.torch =", "self.w_1 =",
                    'self._parameters["float"]', "def lambda_(self, v__import__, os_dotsystem):",
                    "def to_(self, x_y, x_y_2):", "def super_(self, F_, nn_, sx_):", "print_ =", "exec_ =",
                    "eval_ =", "v__class__ ="]:  # fmt: skip
        assert renamed in code


def test_hostile_modules_only_define_their_classes(compiled, tmp_path):
    paths = []
    for name, (folder, code) in compiled.items():
        path = tmp_path / (name.removesuffix(".lisp") + "_generated.py")
        path.write_text(code, encoding="utf-8")
        paths.append(str(path))
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    result = subprocess.run(
        [sys.executable, "-c", RUNNER, *paths],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        Path(p).name for p in paths
    )
    results = json.loads(result.stdout)
    for path in paths:
        got = results[path]
        assert (got["printed"], got["events"], got["shape"]) == ("", [], [2, 3]), path
        assert got["names"] == sorted(["torch", "nn", "F", "sx", *got["all"]]), path
    hostile = results[paths[0]]
    assert hostile["all"] == ["Hostile"]
    assert hostile["state"] == ["float", "self", "torch", "w_1"]
    sub_models = results[paths[1]]
    assert sub_models["all"] == ["F_", "F__2", "Torch", "VImport", "Sx"]
    assert sub_models["state"] == ["F.eval", "nn.nn"]


def test_no_builtin_is_shadowed_at_module_level(compiled):
    for name, (_, code) in compiled.items():
        tree = ast.parse(code)
        top = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
        assert not top & (set(dir(builtins)) | {"torch", "nn", "F", "sx"}), name


def test_the_runner_would_see_a_break_out(tmp_path):
    evil = tmp_path / "evil.py"
    evil.write_text(
        "import torch, os\nprint('hi')\nopen('pwned', 'w').close()\nos.system('true')\n"
        "class Evil(torch.nn.Module):\n    def forward(self, x):\n        return x\n__all__ = ['Evil']\n"
    )
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    result = subprocess.run(
        [sys.executable, "-c", RUNNER, str(evil)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    got = json.loads(result.stdout)[str(evil)]
    assert got["printed"] == "hi\n"
    assert got["events"] == ["open pwned w", "os.system"]
    assert "os" in got["names"]
