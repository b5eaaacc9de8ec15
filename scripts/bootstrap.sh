#!/usr/bin/env bash
# Create .venv at the repository root (if missing), install the pinned requirements and this checkout's
# package (impala_league, editable: `import impala_league` reads this checkout).
# Re-running is cheap: it reinstalls only when requirements.txt, requirements-sc2.txt or pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
stamp=.venv/.requirements.sha256
want=$(cat requirements.txt requirements-sc2.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "installing requirements into .venv (first time takes a minute or two)"
  # pip warns once per package about local index folders this machine's pip config may name; hide only those.
  quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
  quiet .venv/bin/python -m pip install --quiet --upgrade pip
  quiet .venv/bin/python -m pip install --quiet -r requirements.txt
  quiet .venv/bin/python -m pip install --quiet --no-deps -r requirements-sc2.txt
  # setuptools prints a notice on every editable build; pip's output is shown only when it fails.
  if ! out=$(.venv/bin/python -m pip install --quiet --no-deps --editable . 2>&1); then echo "$out" >&2; exit 1; fi
  echo "$want" > "$stamp"
fi
