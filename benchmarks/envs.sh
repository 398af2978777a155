#!/usr/bin/env bash
# Create the benchmark virtualenvs under benchmarks/.envs/ (idempotent).
#
#   orig     keras-kinetic==0.0.4, the original project (import name `kinetic` too,
#            so it must live in its own venv and be measured in its own process)
#   ray      ray, for the fan-out comparison (never a dependency of this project)
#   kinetic  this project, installed editable from the repository root, so the
#            benchmarks always measure the working tree without a reinstall
#
# Usage: bash benchmarks/envs.sh            (PYTHON=python3.11 to choose the interpreter)
# An env is (re)built only when its check fails, so a second run is quick.
# REUSE_ORIG=/path/to/venv links `orig` to an existing venv holding keras-kinetic 0.0.4
# (same interpreter) instead of building one.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
ENVS="$HERE/.envs"
PYTHON="${PYTHON:-python3}"
ORIG_VERSION="0.0.4"
REUSE_ORIG="${REUSE_ORIG:-}"

mkdir -p "$ENVS"

# ok ENV PYTHON-CODE: true when ENV has a working interpreter passing the check.
ok() {
    [ -x "$1/bin/python" ] && "$1/bin/python" -c "$2" >/dev/null 2>&1
}

# make_env ENV: a fresh venv with an up-to-date pip.
make_env() {
    rm -rf "$1"
    "$PYTHON" -m venv "$1"
    "$1/bin/python" -m pip install --quiet --upgrade pip
}

orig_check="import importlib.metadata as m; assert m.version('keras-kinetic') == '$ORIG_VERSION'"

# --- orig -------------------------------------------------------------------
if ok "$ENVS/orig" "$orig_check"; then
    echo "orig: ready ($ENVS/orig)"
elif [ -n "$REUSE_ORIG" ] && [ ! -e "$ENVS/orig" ] && ok "$REUSE_ORIG" "$orig_check" \
    && [ "$("$REUSE_ORIG/bin/python" -c 'import sys; print(sys.version_info[:2])')" \
        = "$("$PYTHON" -c 'import sys; print(sys.version_info[:2])')" ]; then
    ln -s "$REUSE_ORIG" "$ENVS/orig"
    echo "orig: linked to existing $REUSE_ORIG"
else
    rm -f "$ENVS/orig" 2>/dev/null || true
    echo "orig: creating (keras-kinetic==$ORIG_VERSION)"
    make_env "$ENVS/orig"
    "$ENVS/orig/bin/python" -m pip install --quiet "keras-kinetic==$ORIG_VERSION"
fi

# --- ray --------------------------------------------------------------------
if ok "$ENVS/ray" "import ray"; then
    echo "ray: ready ($ENVS/ray)"
else
    echo "ray: creating"
    make_env "$ENVS/ray"
    "$ENVS/ray/bin/python" -m pip install --quiet ray
fi

# --- kinetic ----------------------------------------------------------------
# Editable: the code under test is the working tree itself (another engineer edits it
# concurrently); dependency changes in pyproject.toml are picked up by re-running this
# script (the check below compares the installed project's location).
kinetic_check="import kinetic, os; assert os.path.dirname(os.path.dirname(kinetic.__file__)) == '$REPO'"
if ok "$ENVS/kinetic" "$kinetic_check"; then
    echo "kinetic: ready ($ENVS/kinetic); refreshing dependencies"
    "$ENVS/kinetic/bin/python" -m pip install --quiet -e "$REPO[bench]"
else
    echo "kinetic: creating (editable install of $REPO)"
    make_env "$ENVS/kinetic"
    "$ENVS/kinetic/bin/python" -m pip install --quiet -e "$REPO[bench]"
fi

for env in orig ray kinetic; do
    printf '%-8s %s\n' "$env" "$("$ENVS/$env/bin/python" --version 2>&1)"
done
