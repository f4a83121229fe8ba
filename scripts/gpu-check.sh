#!/usr/bin/env bash
# The GPU kernel family on a GPU, in one short run (a lent machine's lease is minutes):
#
#     scripts/gpu-check.sh [--out DIR] [--against TREE] MODEL.gguf[.gz] ...
#
# 1. the OpenCL devices found, with their versions and extensions;
# 2. `swarm bench engine` on the first model, then its --profile (per-kernel GB/s);
# 3. the kernel tests on the GPU family against the NumPy reference (the tests that need
#    a downloaded model are left out: such a machine usually has no network);
# 4. `swarm bench engine` on each other model, twice, alternating the default layout
#    with SLOTSWARM_COMPACT=1 (the compact K-quant layouts; slower on an H200 so far);
#    with --against, on every model, this checkout alternating with TREE, another
#    checkout of slotswarm (`git archive REV | tar -x -C TREE`, carried along): a
#    change's A/B in the one lease.
#
# The models are usually hollow twins made beforehand (`swarm models --hollow NAME FILE`,
# gzip them to carry: a step's time does not depend on the weights). Every step is
# bounded and goes on after a failure, so one run says as much as it can; DIR (default
# ./gpu-check) gets log.txt, pytest.txt and bench.jsonl (a JSON report a line).
# The device is the first GPU, or SWARM_DEVICE / PYOPENCL_CTX. An NVIDIA driver
# mounted into a container often comes without its ICD file: the script then finds
# libnvidia-opencl.so.1 and points OCL_ICD_VENDORS at a folder naming it (pyopencl's
# wheel bundles a loader that ignores OCL_ICD_FILENAMES).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
OUT=gpu-check
AGAINST=
while [[ ${1:-} == --out || ${1:-} == --against ]]; do
    if [[ $1 == --out ]]; then
        OUT=${2:?--out needs a folder}
    else
        tree=${2:?--against needs a folder}
        AGAINST=$(cd "$tree" 2>/dev/null && pwd)
        [[ -f $AGAINST/swarm/cli.py ]] || { echo "--against: not a slotswarm checkout: $tree" >&2; exit 2; }
    fi
    shift 2
done
usage() { sed -n '2,/^set /p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }
if [[ $# -eq 0 ]]; then
    usage >&2
    exit 2
elif [[ $1 == -h || $1 == --help ]]; then
    usage
    exit 0
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec > >(tee "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
START=$(date +%s)
say() { echo "== [$(($(date +%s) - START)) s] $*"; }

UNPACKED=$(mktemp -d)
trap 'rm -rf "$UNPACKED"' EXIT
if [[ -z ${OCL_ICD_VENDORS:-} ]] && ! grep -qs nvidia /etc/OpenCL/vendors/*.icd; then
    nvidia=$(ls /usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1 /usr/lib64/libnvidia-opencl.so.1 \
        /usr/lib/libnvidia-opencl.so.1 /usr/local/nvidia/lib64/libnvidia-opencl.so.1 2>/dev/null | head -1)
    if [[ -n $nvidia ]]; then
        mkdir "$UNPACKED/vendors"
        cp /etc/OpenCL/vendors/*.icd "$UNPACKED/vendors/" 2>/dev/null
        echo "$nvidia" >"$UNPACKED/vendors/nvidia.icd"
        export OCL_ICD_VENDORS=$UNPACKED/vendors
        echo "NVIDIA's OpenCL driver without an ICD file: $nvidia"
    fi
fi
models=()
for model in "$@"; do
    if [[ $model == *.gz ]]; then
        plain=$UNPACKED/$(basename "${model%.gz}")
        gunzip -c "$model" >"$plain" || { echo "cannot unpack $model"; exit 1; }
        model=$plain
    fi
    [[ -f $model ]] || { echo "no such model file: $model"; exit 1; }
    models+=("$(realpath "$model")")
done
cd "$ROOT"

say devices
"$PYTHON" - <<'EOF'
import pyopencl as cl

for p in cl.get_platforms():
    for d in p.get_devices():
        print(f"{p.name} ({p.version}): {d.name}, {d.version}, {d.opencl_c_version}, driver {d.driver_version}, "
              f"{d.max_compute_units} units, work-groups up to {d.max_work_group_size}, {d.global_mem_size >> 20} MiB")
        print("   ", d.extensions)
EOF

bench() {  # LABEL SECONDS TREE [NAME=VALUE ...] -- ARGS: one `swarm bench engine` report, TREE's code
    local label=$1 limit=$2 tree=$3 envs=() json
    shift 3
    while [[ $1 != -- ]]; do envs+=("$1"); shift; done
    shift
    say "bench $label"
    json=$(cd "$tree" && env PYTHONPATH="$tree${PYTHONPATH#"$ROOT"}" ${envs[@]+"${envs[@]}"} timeout "$limit" "$PYTHON" \
        -c 'import sys; from swarm.cli import main; sys.exit(main())' bench engine --json "$@") \
        || { echo "    failed (exit $?)"; return; }
    echo "{\"label\": \"$label\", \"report\": $json}" >>"$OUT/bench.jsonl"
    "$PYTHON" -c 'import json, sys; from swarm.bench.engine import format_report; print(format_report(json.loads(sys.argv[1])))' "$json"
}

first=${models[0]}
bench "$(basename "$first")" 90 "$ROOT" -- --model "$first" --steps 32
bench "$(basename "$first") --profile" 90 "$ROOT" -- --model "$first" --profile

say "kernel tests (GPU family)"
timeout 200 "$PYTHON" -m pytest -q -p no:cacheprovider -n "$(($(nproc) < 12 ? $(nproc) : 12))" --dist loadfile \
    -m "not model and not fetched_model and not cluster" -k "not cpu" \
    tests/test_device.py tests/test_device_quants.py tests/test_device_sampling.py tests/test_engine.py \
    tests/test_engine_archs.py tests/test_engine_input.py tests/test_engine_invariance.py tests/test_halves.py \
    tests/test_speculation.py tests/test_draft_model.py >"$OUT/pytest.txt" 2>&1
echo "    pytest exit $?"
tail -30 "$OUT/pytest.txt"

if [[ -n $AGAINST ]]; then
    for model in "${models[@]}"; do
        for round in 1 2; do
            bench "$(basename "$model") round $round" 90 "$ROOT" -- --model "$model"
            bench "$(basename "$model") against $AGAINST, round $round" 90 "$AGAINST" -- --model "$model"
        done
    done
else
    for model in "${models[@]:1}"; do
        for round in 1 2; do
            bench "$(basename "$model") round $round" 90 "$ROOT" -- --model "$model"
            bench "$(basename "$model") compact, round $round" 90 "$ROOT" SLOTSWARM_COMPACT=1 -- --model "$model"
        done
    done
    bench "$(basename "$first") again" 90 "$ROOT" -- --model "$first" --steps 32
fi
say done
