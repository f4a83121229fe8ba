#!/usr/bin/env bash
# The system packages slotswarm needs, installed once: the one place for them.
#
# - pocl-opencl-icd: Debian's PoCL. The PoCL that pip brings with pyopencl ships an
#   LLVM that cannot compile for CPUs newer than itself (AMD Zen 5, say); the
#   distribution's can, and gpu/device.py passes over a device that cannot compile.
# - chromium, chromium-driver: the real browser the tests of `swarm watch`'s page
#   run in (headless, driven by selenium).
# - bubblewrap: the sandbox a coding session's test runs go in (no network, no
#   writes outside their scratch copy); without it they run with resource limits only.
#
# Idempotent and cheap when everything is there (one dpkg query, no network). Where
# apt-get is missing (not Debian) or we may not use it, it says so and carries on:
# pip's PoCL or a GPU driver may still be enough.
set -euo pipefail

PACKAGES=(pocl-opencl-icd chromium chromium-driver bubblewrap)

if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
    exit 0
fi
missing=()
for pkg in "${PACKAGES[@]}"; do
    if [[ "$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null)" != installed ]]; then
        missing+=("$pkg")
    fi
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

if [[ $(id -u) -eq 0 ]]; then
    sudo=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
else
    echo "setup-system: missing ${missing[*]}; install them with: sudo apt-get install ${missing[*]}" >&2
    exit 0
fi
echo "setup-system: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt=("${sudo[@]}" apt-get -qq -o DPkg::Lock::Timeout=600)  # wait out another install
"${apt[@]}" update
"${apt[@]}" install -y --no-install-recommends "${missing[@]}" >/dev/null
