#!/usr/bin/env bash
# slotswarm side by side with llama.cpp on the same GGUF files, one command:
#
#     scripts/llamacpp-bench.sh [--isa native|avx2|avx2-vnni] [--rounds N] [--models M ...] [--out FILE.json]
#
# Builds, once, llama.cpp's llama-bench and llama-batched-bench (nothing else) for this
# CPU from the tree vendored in the llama-cpp-python sdist pinned below, fetched through
# pip into a cache folder; then runs scripts/llamacpp_bench.py, which alternates rounds of
# `swarm bench engine` and the two tools and prints one table (options: its --help).
# The build runs under nice and takes a while on a small machine; its logs are in the cache.
# --isa avx2 builds and runs both sides for AVX2 without AVX-512 (llama.cpp for Haswell,
# PoCL's avx2 kernel library), the code AMD's Zen 1-3 and Intel's cores before Alder Lake
# run, on a CPU that has more; avx2-vnni adds AVX-VNNI, as Intel's client cores since Alder
# Lake have it.
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

ISA=native
previous=
for arg in "$@"; do  # the options, before a build that takes a while
    if [[ $arg == -h || $arg == --help ]]; then
        PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" "$ROOT/scripts/llamacpp_bench.py" --help
    fi
    [[ $previous == --isa ]] && ISA=$arg
    [[ $arg == --isa=* ]] && ISA=${arg#--isa=}
    previous=$arg
done
if [[ $ISA != native && $ISA != avx2 && $ISA != avx2-vnni ]]; then
    echo "llamacpp-bench.sh: --isa must be native, avx2 or avx2-vnni, got '$ISA'" >&2
    exit 2
fi
if [[ $ISA == avx2-vnni ]] && ! grep -qw avx_vnni /proc/cpuinfo 2>/dev/null; then
    echo "llamacpp-bench.sh: --isa avx2-vnni needs a CPU with AVX-VNNI (/proc/cpuinfo's avx_vnni)" >&2
    exit 2
fi

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
if [[ $ISA == avx2* ]]; then
    BUILD="$CACHE/build-$ISA"
    vnni=$([[ $ISA == avx2-vnni ]] && echo ON || echo OFF)
    flags="-march=haswell$([[ $vnni == ON ]] && echo " -mavxvnni")"
    TARGET=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
            -DGGML_AVX_VNNI=$vnni -DGGML_AVX512=OFF -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags")
elif grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then
    flags="-march=native -mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    TARGET=(-DGGML_NATIVE=OFF -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags")
fi
if [[ ! -x $BUILD/bin/llama-bench || ! -x $BUILD/bin/llama-batched-bench ]]; then
    logs="$BUILD-logs"
    mkdir -p "$logs"
    echo "building llama-bench and llama-batched-bench (logs: $logs)" >&2
    nice -n 10 cmake -S "$SOURCE" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release "${TARGET[@]}" \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON >"$logs/configure.log" 2>&1
    nice -n 10 cmake --build "$BUILD" --target llama-bench llama-batched-bench -j"${BUILD_JOBS:-2}" >"$logs/build.log" 2>&1
fi

cd "$ROOT"
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" scripts/llamacpp_bench.py --bin "$BUILD/bin" "$@"
