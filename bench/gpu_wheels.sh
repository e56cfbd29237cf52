#!/usr/bin/env bash
# The pure-Python and CPython 3.12 wheels that bench/gpu_check.sh needs and
# the GPU machine's image may lack (it has jax, torch, optax, flax and the
# build tools, and no network): downloaded here into bench/gpu-wheels/
# (git-ignored), carried to the machine beside the working tree, installed
# there by gpu_check.sh with --no-index.  About 25 MB.
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
