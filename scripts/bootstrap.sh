#!/usr/bin/env bash
# Installs the Debian packages colocated-rl builds against, skipping those already installed.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libtorch-dev libopenblas0-pthread libgloo-dev
  libsentencepiece-dev libcpp-httplib-dev nlohmann-json3-dev
  libpcre2-dev libutf8proc-dev
  libcli11-dev libspdlog-dev libfmt-dev
  libgtest-dev libbenchmark-dev
  python3-torch  # tests only: tests/engine/hf_reference.py, the independent reference forward
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# Tests only: Hugging Face's tokenizers (its Node binding) is the tokenizer reference. Machines
# that carry another Node.js build (which bundles npm) keep it.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
