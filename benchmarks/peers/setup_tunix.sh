#!/usr/bin/env bash
# Creates .venv-tunix at the repository root: a Python 3.11 virtual environment with
# google-tunix 0.1.7 (CPU only) for benchmarks/peers/tunix_peer.py.
#
# Tunix cannot live in the project's .venv: it requires safetensors<0.8 and the project
# requires safetensors>=0.8. jax, jaxlib, flax, optax and orbax-checkpoint are pinned to the
# versions found in .venv (when .venv exists), so both implementations run the same XLA.
#
# Idempotent: an existing .venv-tunix that already imports tunix at the pinned versions is
# left as it is. Prints the installed versions at the end.
#
# Usage: bash benchmarks/peers/setup_tunix.sh   (env: PYTHON=python3.11, VENV=<root>/.venv-tunix)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python3.11}"
VENV="${VENV:-$ROOT/.venv-tunix}"
MAIN_PIP="$ROOT/.venv/bin/pip"
TUNIX_VERSION="0.1.7"

# Versions to share with the project's environment.
pins=()
if [[ -x "$MAIN_PIP" ]]; then
  for pkg in jax jaxlib flax optax orbax-checkpoint; do
    version="$("$MAIN_PIP" show "$pkg" 2>/dev/null | awk '/^Version:/ {print $2}')"
    if [[ -n "$version" ]]; then
      pins+=("$pkg==$version")
    fi
  done
else
  echo "note: $MAIN_PIP not found; jax/jaxlib/flax are not pinned" >&2
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  "$PYTHON" -m venv "$VENV"
fi

check_installed() {
  "$VENV/bin/python" - "$TUNIX_VERSION" "${pins[@]}" <<'EOF'
import importlib.metadata as md
import sys
wanted = {"google-tunix": sys.argv[1]}
for pin in sys.argv[2:]:
  name, version = pin.split("==")
  wanted[name] = version
for name, version in wanted.items():
  try:
    if md.version(name) != version:
      sys.exit(1)
  except md.PackageNotFoundError:
    sys.exit(1)
import tunix  # noqa: F401
EOF
}

if check_installed 2>/dev/null; then
  echo "$VENV already has google-tunix==$TUNIX_VERSION ${pins[*]}"
else
  "$VENV/bin/pip" install --quiet --upgrade pip
  # jax without extras installs the CPU jaxlib only.
  "$VENV/bin/pip" install "google-tunix==$TUNIX_VERSION" "${pins[@]}"
  check_installed
fi

echo "installed in $VENV:"
"$VENV/bin/pip" list 2>/dev/null | grep -iE '^(google-tunix|jax|jaxlib|flax|optax|orbax-checkpoint|qwix|safetensors|numpy|transformers) '
"$VENV/bin/python" -c "import jax; print('jax backend:', jax.default_backend(), jax.devices())"
