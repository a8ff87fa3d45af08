#!/usr/bin/env bash
# Installs from Debian's repositories whatever kvtier's build and tests need and the
# machine lacks. Safe to run again: it installs nothing when everything is there.
set -euo pipefail
pkgs=(build-essential cmake pkg-config file
      libxxhash-dev libabsl-dev liburing-dev
      libgtest-dev libbenchmark-dev
      libcli11-dev nlohmann-json3-dev libmsgpack-cxx-dev
      libzmq3-dev cppzmq-dev libsodium-dev libhiredis-dev redis-server redis-tools
      python3-cffi python3-pytest python3-zmq python3-msgpack python3-prometheus-client
      python3-xxhash python3-pip python3-setuptools python3-wheel
      clang libclang-rt-14-dev valgrind libncurses-dev tmux
      cargo rustc librust-bindgen-dev librust-bindgen+runtime-dev golang-go)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
