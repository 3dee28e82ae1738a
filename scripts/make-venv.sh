#!/usr/bin/env bash
# make-venv.sh PYTHON VENV: create the virtualenv, or re-create one that has no working pip
# (a `python -m venv` that failed half-way). Debian's Python has no venv module until the
# pythonX.Y-venv package is installed: install it where missing, as make test does its own.
set -euo pipefail
python=$1
venv=$2
if "$venv/bin/python" -m pip --version > /dev/null 2>&1; then
  exit 0
fi
rm -rf "$venv"
if "$python" -m venv "$venv"; then
  exit 0
fi
rm -rf "$venv"
if ! command -v apt-get > /dev/null; then
  echo "$python -m venv failed: install Python's venv module and run make again." >&2
  exit 1
fi
package="python$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')-venv"
sudo=()
if [ "$(id -u)" -ne 0 ]; then sudo=(sudo); fi
echo "Installing Debian package $package (python -m venv needs it)"
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -qq --no-install-recommends "$package"
"$python" -m venv "$venv"
