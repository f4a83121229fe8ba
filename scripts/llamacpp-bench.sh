#!/usr/bin/env bash
# slotswarm side by side with llama.cpp on the same GGUF files, one command:
#
#     scripts/llamacpp-bench.sh [--rounds N] [--models M ...] [--out FILE.json]
#
# Builds, once, llama.cpp's llama-bench and llama-batched-bench (nothing else) for this
# CPU from the tree vendored in the llama-cpp-python sdist pinned below, fetched through
# pip into a cache folder; then runs scripts/llamacpp_bench.py, which alternates rounds of
# `swarm bench engine` and the two tools and prints one table (options: its --help).
# The build runs under nice and takes a while on a small machine; its logs are in the cache.
#
# Environment: LLAMACPP_CACHE (default ~/.cache/slotswarm/llamacpp), BUILD_JOBS (default 2),
# PYTHON (default python).
set -euo pipefail

VERSION=0.3.36
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${LLAMACPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/slotswarm/llamacpp}
PYTHON=${PYTHON:-python}
SDIST="$CACHE/sdist/llama_cpp_python-$VERSION.tar.gz"
SOURCE="$CACHE/llama_cpp_python-$VERSION/vendor/llama.cpp"
BUILD="$CACHE/build"

for arg in "$@"; do  # the options, before a build that takes a while
    if [[ $arg == -h || $arg == --help ]]; then
        PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" "$ROOT/scripts/llamacpp_bench.py" --help
    fi
done

mkdir -p "$CACHE/sdist"
if [[ ! -f $SDIST ]]; then
    echo "fetching llama-cpp-python $VERSION's sdist into $CACHE/sdist" >&2
    "$PYTHON" -m pip download "llama-cpp-python==$VERSION" --no-deps --no-binary :all: -d "$CACHE/sdist" >&2
fi
if [[ ! -d $SOURCE ]]; then
    tar -xzf "$SDIST" -C "$CACHE"
fi
# This version's AMX kernels (which -march=native turns on where the CPU has AMX) die of
# SIGILL at their first tilezero: its llama-bench runs no model there. Without them it
# takes AVX-512 VNNI, as on CPUs without AMX. (GGML_NATIVE would put its -march=native
# after these flags, and turn AMX back on.)
TARGET=(-DGGML_NATIVE=ON)
if grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then
    flags="-march=native -mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    TARGET=(-DGGML_NATIVE=OFF -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags")
fi
if [[ ! -x $BUILD/bin/llama-bench || ! -x $BUILD/bin/llama-batched-bench ]]; then
    echo "building llama-bench and llama-batched-bench (logs: $CACHE/configure.log, $CACHE/build.log)" >&2
    nice -n 10 cmake -S "$SOURCE" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release "${TARGET[@]}" \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON >"$CACHE/configure.log" 2>&1
    nice -n 10 cmake --build "$BUILD" --target llama-bench llama-batched-bench -j"${BUILD_JOBS:-2}" >"$CACHE/build.log" 2>&1
fi

cd "$ROOT"
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" scripts/llamacpp_bench.py --bin "$BUILD/bin" "$@"
