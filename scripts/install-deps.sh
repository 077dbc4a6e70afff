#!/bin/sh
# Installs the Debian packages the build and tests need (idempotent; needs root or sudo).
set -e
PKGS="cmake g++ make pkg-config catch2 nlohmann-json3-dev libbenchmark-dev abigail-tools unicode-data python3 clang libclang-rt-14-dev g++-aarch64-linux-gnu"
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
# The chat-template tests compare with @huggingface/jinja from the npm registry: node and npm
# (any source: a node that bundles npm must not be replaced by Debian's separate packages).
command -v npm >/dev/null 2>&1 || missing="$missing nodejs npm"
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
