#!/usr/bin/env bash
# The README's figures for the two commands: a fresh clone of this checkout's HEAD and a fresh venv under /tmp,
# pip's and uv's caches off (every package downloaded; torch from the machine's disk where pip is set up so),
# the embedded model converted afresh; then the install step of `make demo`, `make demo` itself and (with
# --test) the install step of `make test` in another fresh venv, each timed. Run it on an idle machine.
#
#   bash scripts/fresh_clone_timings.sh [--test] [--installer auto|uv|pip]
set -euo pipefail
test_too=0
installer=auto
while [ $# -gt 0 ]; do
  case "$1" in
    --test) test_too=1 ;;
    --installer) installer="$2"; shift ;;
    *) echo "usage: $0 [--test] [--installer auto|uv|pip]" >&2; exit 2 ;;
  esac
  shift
done
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/vriksha-fresh.XXXXXX)
trap 'rm -rf "$work"' EXIT
export PIP_NO_CACHE_DIR=1 UV_NO_CACHE=1 VRIKSHA_CACHE="$work/cache"
git clone -q "$repo" "$work/clone"
cd "$work/clone"
secs() { local t0=$1; echo $(( $(date +%s) - t0 )); }

python3 -m venv "$work/venv"
t0=$(date +%s)
make --no-print-directory install PYTHON="$work/venv/bin/python" INSTALLER="$installer"
install_s=$(secs "$t0")
t0=$(date +%s)
PATH="$work/venv/bin:$PATH" make --no-print-directory demo PYTHON="$work/venv/bin/python" INSTALLER="$installer"
demo_rest_s=$(secs "$t0")  # the install check (all there already) and the demo's two commands
echo "fresh-clone: install step of make demo ${install_s} s; make demo in all $(( install_s + demo_rest_s )) s"

if [ "$test_too" = 1 ]; then
  python3 -m venv "$work/venv-test"
  t0=$(date +%s)
  make --no-print-directory install-test PYTHON="$work/venv-test/bin/python" INSTALLER="$installer"
  echo "fresh-clone: install step of make test $(secs "$t0") s"
fi
