#!/bin/sh
# Installs the Debian packages the build and tests need (idempotent; needs root or sudo).
set -e
PKGS="cmake g++ make pkg-config catch2 nlohmann-json3-dev libbenchmark-dev abigail-tools unicode-data python3 clang libclang-rt-14-dev g++-aarch64-linux-gnu"
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
