#!/usr/bin/env bash
# Create .venv at the repository root (if missing), install the pinned requirements and this checkout's
# package (impala_league, editable: `import impala_league` reads this checkout). With --dev, also what the
# tests and checks need (requirements-dev.txt): the README's test command passes it.
# Re-running is cheap: it reinstalls only when a requirements file or pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
dev=""
case "${1:-}" in
  "") ;;
  --dev) dev=requirements-dev.txt ;;
  -h|--help) echo "usage: bash scripts/bootstrap.sh [--dev]   (--dev: also the test tools, requirements-dev.txt)"; exit 0 ;;
  *) echo "bootstrap.sh: unknown option '$1'; usage: bash scripts/bootstrap.sh [--dev]" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
stamp=.venv/.requirements${dev:+-dev}.sha256
want=$(cat requirements.txt $dev requirements-sc2.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "installing requirements.txt${dev:+ and $dev} into .venv (first time takes a minute or two)"
  # pip warns once per package about local index folders this machine's pip config may name; hide only those.
  quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
  quiet .venv/bin/python -m pip install --quiet --upgrade pip
  quiet .venv/bin/python -m pip install --quiet -r requirements.txt ${dev:+-r $dev}
  quiet .venv/bin/python -m pip install --quiet --no-deps -r requirements-sc2.txt
  # setuptools prints a notice on every editable build; pip's output is shown only when it fails.
  if ! out=$(.venv/bin/python -m pip install --quiet --no-deps --editable . 2>&1); then echo "$out" >&2; exit 1; fi
  echo "$want" > "$stamp"
fi
