#!/usr/bin/env bash
# Downloads into bench/gpu-wheels/ (git-ignored, about 25 MB) the pure-Python
# and CPython 3.12 wheels that bench/gpu_check.sh installs with --no-index
# where a GPU machine's image lacks them and has no network.
#
#   bash bench/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")"
rm -rf gpu-wheels && mkdir gpu-wheels
# --no-deps and the full list: the resolver must not fetch numpy or jax,
# which the machine has in the versions its CUDA build needs.
python3 -m pip download -q --no-deps --only-binary=:all: -d gpu-wheels \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any \
  pytest iniconfig pluggy packaging pygments hypothesis attrs sortedcontainers jmp flatbuffers \
  matplotlib contourpy cycler fonttools kiwisolver pillow pyparsing python-dateutil six tzdata
ls gpu-wheels
du -sh gpu-wheels
