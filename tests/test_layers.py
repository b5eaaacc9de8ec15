"""The project's imports run one way: run.py -> roles -> agents/ -> envs/ -> config, with no cycle.

Read with `ast` from the source files (nothing is imported), so an import inside a function counts too:
it is as much a dependency as one at the top of the file. docs/architecture.md lists the layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from impala_league import REPO

PACKAGE = "impala_league"  # every module but run.py sits in it
NOT_PACKAGE = {"tests", "bench", "scripts", ".venv", "venv", ".git", "runs", "wandb", "__pycache__"}

# Lowest first; a module may import modules of its own layer or of a lower one.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("plain data and pure math", ("config", "config_schema", "tracking", "batch", "distributed.vtrace", "text",
                                  "records")),
    ("the math of learning", ("losses",)),
    ("games", ("envs",)),
    ("networks", ("agents",)),
    ("roles", ("distributed", "deploy", "league", "evaluation", "analysis", "checked_config")),
    ("entry point", ("run", "cli")),
)
# Within the lowest layer each module imports nothing of ours, except config, which re-exports its schema,
# and tracking, which reads the config.
BASE_IMPORTS = {"config_schema": set(), "config": {"config_schema"}, "distributed.vtrace": set(),
                "tracking": {"config"}, "batch": set(), "text": set(), "records": set()}
# Training processes and cluster files carry no plotting or report code; the roles import no cluster files.
FORBIDDEN = (("distributed", "analysis", "training roles know no report code"),
             ("league", "analysis", "training roles know no report code"),
             ("deploy", "analysis", "cluster files know no report code"),
             ("distributed", "deploy", "the roles know nothing of the cluster files rendered from their role table"))


def _plain(name: str) -> str:
    """A module's name below the wrapping package (impala_league.agents.heads -> agents.heads)."""
    return name.removeprefix(PACKAGE + ".") if name != PACKAGE else ""


def _modules() -> dict[str, Path]:
    files = [p for p in REPO.rglob("*.py") if not set(p.relative_to(REPO).parts[:-1]) & NOT_PACKAGE
             and p.relative_to(REPO).parts[0] not in NOT_PACKAGE]
    names = {_plain(".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")): p for p in files}
    names.pop("", None)  # the package's own __init__: a docstring and REPO, no layer of its own
    return names


MODULES = _modules()


def _owner(name: str) -> str | None:
    """The project module that `name` (a module, or a module's attribute) belongs to, if any."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> set[str]:
    """The project modules `module` imports anywhere in its file (package __init__ files of its own
    parents left out: importing a.b runs a/__init__.py, which is no dependency of a.b's code)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in map(_plain, names):
            owner = _owner(name)
            parent_package = module.startswith(owner + ".") and MODULES[owner].name == "__init__.py" if owner else False
            if owner and owner != module and not parent_package:
                out.add(owner)
    return out


GRAPH = {m: _imports(m) for m in MODULES}


def _layer(module: str) -> int:
    """Index in LAYERS of `module`: the most specific prefix wins (distributed.vtrace over distributed)."""
    best, length = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                best, length = i, len(prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS in tests/test_layers.py"
    return best


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_is_read_whole():
    assert {"run", "config", "tracking", "checked_config", "distributed.learner.role", "distributed.vtrace",
            "agents.heads", "agents.checkpoint", "envs.registry", "envs.sc2_wrappers.actions", "analysis.report",
            "deploy.k8s"} <= set(MODULES)
    assert "tests.test_layers" not in MODULES and not any(m.startswith("bench") for m in MODULES)
    assert "agents.network" in GRAPH["agents.heads"] and "config" in GRAPH["agents.network"]


def test_no_import_cycles():
    cycles = _cycles(GRAPH)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle():
    graph = {"config": {"envs.registry"}, "envs.registry": {"agents.network"}, "agents.network": {"config"},
             "run": {"config"}}
    assert _cycles(graph) == [["agents.network", "config", "envs.registry"]]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_down_the_layers(module):
    layer = _layer(module)
    upward = [f"{module} ({LAYERS[layer][0]}) -> {target} ({LAYERS[_layer(target)][0]})"
              for target in sorted(GRAPH[module]) if _layer(target) > layer]
    assert not upward, "imports up the layers: " + "; ".join(upward)
    if module in BASE_IMPORTS:
        assert GRAPH[module] <= BASE_IMPORTS[module], f"{module} imports {sorted(GRAPH[module])}"
    for source, target, why in FORBIDDEN:
        if module == source or module.startswith(source + "."):
            bad = [t for t in GRAPH[module] if t == target or t.startswith(target + ".")]
            assert bad == [], f"{module} -> {bad}: {why}"


def test_the_known_wrong_ways_are_gone():
    """The imports that once tied the layers into a circle (config -> env registry -> SC2 codec ->
    networks -> config) or pulled report code into the learner."""
    assert GRAPH["config"] <= {"config_schema"} and GRAPH["config_schema"] == set()
    assert not any(t.startswith("agents") for t in GRAPH["envs.sc2_wrappers.actions"])
    assert not any(t.startswith("analysis") for t in GRAPH["distributed.learner.role"])
    assert not any(t.startswith("distributed") for t in GRAPH["agents.policy"])
    # agents/ may import V-trace, pure math, from distributed/, and nothing else of it
    assert GRAPH["agents.heads"] & {m for m in MODULES if m.startswith("distributed")} <= {"distributed.vtrace"}
    assert not any(t.startswith(("distributed", "league", "evaluation", "analysis")) and t != "distributed.vtrace"
                   for m in GRAPH if m.startswith("agents") for t in GRAPH[m])
    assert not any(t.startswith("agents") for t in GRAPH["losses.actor_critic"])
    # the learner's batch record is read by agents/ and losses/ from below them, not from distributed/
    assert "batch" in GRAPH["agents.core"] and "batch" in GRAPH["losses.actor_critic"] and GRAPH["batch"] == set()


def test_the_train_launcher_imports_no_torch():
    """`run.py train` itself only supervises: importing torch (2 s on two cores) before it starts its
    children would delay every run. What its start-up and supervision import, torch stays out."""
    import subprocess
    import sys

    code = ("import sys, run, impala_league.cli.train, impala_league.checked_config, "
            "impala_league.distributed.launch.launcher, impala_league.distributed.launch.live, "
            "impala_league.distributed.launch.ownership;"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout[:500]
