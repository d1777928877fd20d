#!/usr/bin/env bash
# Installs the Debian packages longhaul needs to build, test and benchmark. Idempotent: when
# everything is present it only checks (dpkg-query) and exits in well under a second.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config clang clang-format libclang-rt-14-dev
  libopenblas-openmp-dev libopenblas0-openmp
  libcmocka-dev libsodium-dev libzstd-dev libcurl4-openssl-dev libmicrohttpd-dev
  libsqlite3-dev libjansson-dev
  python3 python3-torch python3-numpy unicode-data zstd
  curl sqlite3 nginx-light prometheus chromium nodejs
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
