"""Nothing in the project unpickles: every .py file is parsed and searched for the ways to do it.

Unpickling runs code chosen by whoever wrote the bytes, so the project never does it, neither across
the network nor from files (see docs/architecture.md). The check reads the syntax tree, so a word in
a string or a comment is no finding, while an aliased import (`import pickle as p`) still is.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from impala_league import REPO

SKIP_DIRS = {".venv", "venv", ".git", "__pycache__", "runs", "wandb", "node_modules", "site-packages", ".pytest_cache"}
# Modules whose import alone is a finding: each exists to turn bytes into arbitrary objects.
PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "cloudpickle", "dill", "shelve", "joblib", "pickletools"}
LOADERS = {"load", "loads", "Unpickler"}


def _dotted(node: ast.AST) -> str:
    """`a.b.c` for an attribute chain of names, else ''."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_constant(node: ast.expr | None, value: object) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def findings(source: str, filename: str = "<source>") -> list[str]:
    """Every way `source` could unpickle, as 'file:line: what'."""
    found = []

    def report(node: ast.AST, what: str) -> None:
        found.append(f"{filename}:{node.lineno}: {what}")

    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PICKLE_MODULES:
                    report(node, f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            root = (node.module or "").split(".")[0]
            if root in PICKLE_MODULES:
                report(node, f"from {node.module} import ...")
            elif root == "marshal" and any(a.name in LOADERS for a in node.names):
                report(node, "from marshal import load(s)")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            last = name.rsplit(".", 1)[-1]
            owner = name.rsplit(".", 1)[0] if "." in name else ""
            if owner.split(".")[-1] in PICKLE_MODULES | {"marshal"} and last in LOADERS:
                report(node, f"{name}(...)")
            elif name == "torch.load" and not _is_constant(_keyword(node, "weights_only"), True):
                report(node, "torch.load without weights_only=True")
            elif name in ("np.load", "numpy.load") and _keyword(node, "allow_pickle") is not None \
                    and not _is_constant(_keyword(node, "allow_pickle"), False):
                report(node, f"{name} with allow_pickle")
            elif last == "read_pickle":
                report(node, f"{name}(...)")
            elif last in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant) \
                    and str(node.args[0].value).split(".")[0] in PICKLE_MODULES:
                report(node, f"{name}({node.args[0].value!r})")
    return found


def project_files() -> list[Path]:
    files = []
    for root, dirs, names in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not (Path(root, d) / "pyvenv.cfg").exists()]
        files += [Path(root, n) for n in names if n.endswith(".py")]
    return sorted(files)


def test_no_project_file_can_unpickle():
    files = project_files()
    relative = {str(f.relative_to(REPO)) for f in files}
    # The scan really covers the project (and not the virtualenv).
    assert {"run.py", "impala_league/distributed/wire/codec.py", "impala_league/agents/checkpoint.py",
            "impala_league/agents/policy.py"} <= relative
    assert not any(part in SKIP_DIRS for f in relative for part in Path(f).parts)
    problems = [p for f in files for p in findings(f.read_text(), str(f.relative_to(REPO)))]
    assert problems == []


BAD = {
    "import pickle": "import pickle\n",
    "aliased import": "import pickle as p\n",
    "from pickle": "from pickle import loads\n",
    "cloudpickle": "import cloudpickle\n",
    "dill": "import dill\n",
    "shelve": "import shelve\n",
    "pickle.load call": "x = pickle.load(f)\n",
    "pickle.loads call": "x = pickle.loads(b)\n",
    "marshal.loads": "import marshal\ncode = marshal.loads(b)\n",
    "from marshal import loads": "from marshal import loads\n",
    "torch.load bare": "import torch\nstate = torch.load(path)\n",
    "torch.load weights_only=False": "state = torch.load(path, weights_only=False)\n",
    "torch.load weights_only from a variable": "state = torch.load(path, weights_only=flag)\n",
    "np.load allow_pickle": "import numpy as np\na = np.load(path, allow_pickle=True)\n",
    "numpy.load allow_pickle": "a = numpy.load(path, allow_pickle=True)\n",
    "pandas read_pickle": "df = pd.read_pickle(path)\n",
    "import_module": "m = importlib.import_module('pickle')\n",
    "__import__": "m = __import__('dill')\n",
}

GOOD = {
    "torch.load weights_only=True": "state = torch.load(path, weights_only=True)\n",
    "np.load default": "a = np.load(path)\n",
    "np.load allow_pickle=False": "a = np.load(path, allow_pickle=False)\n",
    "the word in a string": "reason = 'never import pickle; pickle.load(x) is unsafe'\n",
    "the word in a comment": "# torch.load(path) would unpickle\nx = 1\n",
    "a keyword named pickle": "msg.update(pickle=b'x')\n",
    "json.load": "import json\nx = json.load(f)\n",
    "marshal.dumps": "import marshal\nb = marshal.dumps(1)\n",
}


@pytest.mark.parametrize("source", BAD.values(), ids=BAD.keys())
def test_the_scan_finds_each_way_to_unpickle(source):
    assert findings(source) != []


@pytest.mark.parametrize("source", GOOD.values(), ids=GOOD.keys())
def test_the_scan_leaves_safe_code_alone(source):
    assert findings(source) == []
