#!/usr/bin/env bash
# Quick start 1: install what is missing, build, and run the main job on the embedded
# default (G1 host stand-in, no GPU needed).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
tools/build.sh build > build.log 2>&1 || { tail -50 build.log; exit 1; }
./build/examples/prefix_hit
