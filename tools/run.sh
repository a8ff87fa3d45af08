#!/usr/bin/env bash
# Quick start 1: install what is missing, build, and run the main job on the embedded default:
# kvtier-replay over the shipped Mooncake trace with G1 (a host-memory stand-in for GPU
# memory), G2 in host memory and G3 in a temporary directory. No GPU needed. Extra arguments
# go to kvtier-replay, e.g. tools/run.sh --json or tools/run.sh --plot hit-rate.svg.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
tools/build.sh build > build.log 2>&1 || { tail -50 build.log; exit 1; }
exec ./build/bin/kvtier-replay --trace examples/traces/conversation_trace.jsonl "$@"
