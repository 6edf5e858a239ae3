#!/usr/bin/env bash
# The project's C++, CUDA and header sources against .clang-format (Google style, 100 columns),
# with Debian's clang-format (installed when missing, as the other tools are by bootstrap.sh).
#
#   scripts/check-format.sh          fails naming each file and line that is not formatted (CI)
#   scripts/check-format.sh --fix    formats them in place
#
# tests/fixtures/ holds inputs, not sources, and is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "check-format: installing clang-format"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq clang-format
fi
mapfile -t files < <(git ls-files -co --exclude-standard '*.h' '*.hpp' '*.cpp' '*.cu' '*.cuh' '*.inc' |
                     grep -v '^tests/fixtures/')
case "${1:-}" in
  --fix) clang-format -i "${files[@]}" ;;
  "") clang-format --dry-run -Werror "${files[@]}"
      echo "check-format: ${#files[@]} files formatted ($(clang-format --version | head -1))" ;;
  *) echo "check-format: unknown argument '$1' (usage: scripts/check-format.sh [--fix])" >&2; exit 2 ;;
esac
