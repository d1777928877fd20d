#!/usr/bin/env bash
# Installs the Debian packages longhaul needs to build, test and benchmark, and the npm packages
# of the GGUF tests. Idempotent: when everything is present it only checks (dpkg-query, the
# packages' versions) and exits in well under a second.
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

if [ ${#missing[@]} -ne 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Test-only references from npm, at the exact versions of tests/ref/gguf/package-lock.json, into
# tests/ref/gguf/node_modules (gitignored): llama.cpp as node-llama-cpp's prebuilt CPU build for
# linux-x64 and @huggingface/gguf, for tests/integration/export.sh. `npm ci` installs from the
# lock file; --omit=optional leaves out the CUDA, Vulkan and other platforms' binaries (the CPU
# one is a direct dependency), npm does not run node-llama-cpp's postinstall, and
# NODE_LLAMA_CPP_SKIP_DOWNLOAD keeps it from fetching or building llama.cpp if it ever did; the
# tests load it with build: "never". Present at the pinned version: nothing is done.
GGUF_DIR=$(cd "$(dirname "$0")/.." && pwd)/tests/ref/gguf
have_npm_pkg() { # have_npm_pkg NAME VERSION
  grep -qs "\"version\": \"$2\"" "$GGUF_DIR/node_modules/$1/package.json"
}
if ! have_npm_pkg node-llama-cpp 3.21.1 || ! have_npm_pkg @node-llama-cpp/linux-x64 3.21.1 ||
  ! have_npm_pkg @huggingface/gguf 0.4.6; then
  command -v npm >/dev/null || { echo "install-deps: npm is needed for the GGUF tests (apt-get install npm)" >&2; exit 1; }
  echo "install-deps: installing node-llama-cpp 3.21.1 (CPU) and @huggingface/gguf 0.4.6 into $GGUF_DIR"
  (cd "$GGUF_DIR" && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm ci --omit=optional --no-audit --no-fund --ignore-scripts --silent)
fi
