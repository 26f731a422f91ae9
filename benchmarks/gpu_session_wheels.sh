#!/usr/bin/env bash
# Builds .whl/ here: the Python packages the device machine's image lacks, for its Python 3.12,
# and the project's own wheel. The device has no network; the `run` call carries .whl/
# (`carry: [".whl"]`) and benchmarks/gpu_session.sh installs it into /tmp/site.
#
#   bash benchmarks/gpu_session_wheels.sh      # from the repository root; ~30 s, ~5 MB
#
# What the image lacks, from the device README's KINDS.md package list (read 2026-11-17) against
# what the suite imports: deepspeed and its hjson; pydantic (the profiles' schema, DeepSpeed's
# config) with pydantic-core, annotated-types and typing-inspection; typing-extensions at the
# version pydantic-core needs (the image's version is not listed; carrying it is cheap). The image
# has torch, transformers, pytest, pytest-xdist, pyyaml, numpy, matplotlib, psutil, msgpack,
# ninja, py-cpuinfo, einops, tqdm, packaging, nvidia-ml-py.
#
# Versions: the ones this machine runs (pip show), so the device runs what the tests here ran.
# DeepSpeed publishes only its source on PyPI, so it is built here (DS_BUILD_OPS=0: no ops
# compiled, a pure-Python wheel; the SFT workload uses torch's AdamW and needs none). .whl/ is
# git-ignored (.gitignore /.whl/): never commit it.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
PY=${PYTHON:-python3}
DEST=.whl
BINARY_PACKAGES=(pydantic pydantic-core annotated-types typing-inspection typing-extensions hjson)
TARGET=(--python-version 3.12 --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

version_here() {
  local v
  v=$("$PY" -m pip show "$1" 2>/dev/null | awk '/^Version:/ {print $2}')
  if [[ -z "$v" ]]; then
    echo "gpu_session_wheels: $1 is not installed here, so its version is unknown: pip install it first" >&2
    exit 2
  fi
  echo "$v"
}

# one version of each: two wheels of one package stop the whole install on the device
rm -rf "$DEST"
mkdir -p "$DEST"
for name in "${BINARY_PACKAGES[@]}"; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: "${TARGET[@]}" -d "$DEST" "$name==$(version_here "$name")"
done

sdist=$(mktemp -d)
trap 'rm -rf "$sdist"' EXIT
ds_version=$(version_here deepspeed)
"$PY" -m pip download -q --no-deps --no-binary=:all: -d "$sdist" "deepspeed==$ds_version"
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" "$sdist"/deepspeed-*.tar.gz

"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" .
rm -rf build ./*.egg-info # what setuptools leaves beside the sources

ls -l "$DEST"
wheels=$(du -cb "$DEST"/*.whl | tail -n 1 | cut -f1)
tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | awk '/\ttotal$/ {sum += $1} END {print sum}')
echo "gpu_session_wheels: $(find "$DEST" -type f -name '*.whl' | wc -l) wheels, $((wheels / 1024)) KiB; with the tracked files ($((tracked / 1024)) KiB) $(((wheels + tracked) / 1024 / 1024)) MiB of the 64 MiB a call may send"
