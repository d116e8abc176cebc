#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, CMake option CT_FUZZ, clang, ASan + UBSan) into build-fuzz
# and runs each for SECONDS (default 60) on a temporary copy of its seed corpus fuzz/corpus/<name>
# (the committed corpus is never written). Prints executions and the result per target; exits
# non-zero when any target finds a crash, a sanitizer report, a leak or an out-of-memory input,
# and keeps the input under build-fuzz/findings/.
#   tools/fuzz.sh [SECONDS] [TARGET...]   targets: gguf record api tier_spec tokenizer json json_schema
#                                         (default all);
#                                         tokenizer:VOCAB runs that one on one vocabulary (tiny,
#                                         smollm2, qwen2, llama-bpe, llama-spm, ...)
#                                         CT_FUZZ_RUNS=N also stops each after N executions
#   tools/fuzz.sh --seeds                 rewrites the generated seeds (gguf, record) in fuzz/corpus
#   tools/fuzz.sh --check [SECONDS] [TARGET...]  checks the arguments and prints the runs, builds
#                                         and runs nothing (a CTest test runs it)
#   tools/fuzz.sh --build TARGET...       only builds targets of build-fuzz, e.g. ct_unit_tests for
#                                         the unit tests under ASan + UBSan (.ci/run's asan stage)
# The tokenizer target also runs on the SmolLM2 vocabulary when the model file is present
# (CT_FUZZ_TOKENIZER_GGUF, default ~/.cache/cachetune/models/SmolLM2-135M-Instruct.Q4_1.gguf) and on
# llama.cpp's qwen2, llama-bpe and llama-spm vocabularies when fetched (CT_FUZZ_TOKENIZER_VOCABS
# names others, or none when empty).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD="${CT_FUZZ_BUILD_DIR:-build-fuzz}"
ALL=(gguf record api tier_spec tokenizer json json_schema)

configure_and_build() {
  command -v clang++ >/dev/null || {
    echo "fuzz.sh: clang++ not found; install Debian's clang (its libFuzzer and sanitizer runtimes come with it)" >&2
    exit 2
  }
  if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
    local gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
      -DCMAKE_CXX_COMPILER=clang++ -DCT_FUZZ=ON -DCT_BUILD_TESTS=ON -DCT_BUILD_BENCH=OFF \
      -DCT_CUDA=OFF >/dev/null
  elif grep -q '^CT_BUILD_TESTS:BOOL=OFF' "$BUILD/CMakeCache.txt"; then
    cmake -S . -B "$BUILD" -DCT_BUILD_TESTS=ON >/dev/null  # a build-fuzz from before the tests were in it
  fi
  cmake --build "$BUILD" -j"$(nproc)" --target "$@"
}

if [[ "${1:-}" == "--build" ]]; then
  shift
  [[ $# -gt 0 ]] || { echo "fuzz.sh: --build needs target names" >&2; exit 2; }
  configure_and_build "$@"
  exit 0
fi

if [[ "${1:-}" == "--seeds" ]]; then
  configure_and_build ct_fuzz_seeds
  "$BUILD/fuzz/ct_fuzz_seeds" fuzz/corpus
  exit 0
fi

CHECK_ONLY=0
if [[ "${1:-}" == "--check" ]]; then
  CHECK_ONLY=1
  shift
fi

SECONDS_EACH=60
if [[ $# -gt 0 && "$1" =~ ^[0-9]+$ ]]; then
  SECONDS_EACH="$1"
  shift
fi
TARGETS=("$@")
[[ ${#TARGETS[@]} -eq 0 ]] && TARGETS=("${ALL[@]}")
for t in "${TARGETS[@]}"; do
  [[ " ${ALL[*]} " == *" ${t%%:*} "* ]] || { echo "fuzz.sh: unknown target '$t', expected one of: ${ALL[*]} (tokenizer:VOCAB for one vocabulary)" >&2; exit 2; }
done
if [[ $CHECK_ONLY -eq 1 ]]; then
  echo "fuzz.sh: would run ${TARGETS[*]} for ${SECONDS_EACH} s each"
  exit 0
fi
BINS=()
for t in "${TARGETS[@]}"; do BINS+=("${t%%:*}_fuzz"); done
configure_and_build "${BINS[@]}"

SMOL="${CT_FUZZ_TOKENIZER_GGUF:-$HOME/.cache/cachetune/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
# llama.cpp's vocabulary-only files (tools/fetch_vocab_tests.sh): the other tokenizer kinds, the
# qwen2 and Llama 3 pre-tokenizers and SentencePiece.
VOCAB_DIR="${CACHETUNE_VOCAB_DIR:-$HOME/.cache/cachetune/vocab}"
VOCABS="${CT_FUZZ_TOKENIZER_VOCABS-qwen2 llama-bpe llama-spm}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/ct-fuzz.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$BUILD/findings"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"

failed=0
printf '%-20s %8s %12s %10s  %s\n' target seconds executions exec/s result
run_one() {  # name, corpus name, then environment assignments for the target
  local name="$1" corpus="$2"
  shift 2
  local dir="$WORK/$name"
  mkdir -p "$dir/corpus" "$dir/artifacts"
  cp -r "fuzz/corpus/$corpus/." "$dir/corpus/"
  local rc=0 t0=$SECONDS
  env "$@" "$BUILD/fuzz/${corpus}_fuzz" "$dir/corpus" -max_total_time="$SECONDS_EACH" \
    -rss_limit_mb=2048 -detect_leaks=1 -print_final_stats=1 -artifact_prefix="$dir/artifacts/" \
    ${CT_FUZZ_RUNS:+-runs="$CT_FUZZ_RUNS"} \
    >"$dir/log" 2>&1 || rc=$?
  local execs rate result
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$dir/log" | tail -1 | grep -o '[0-9]*$' || true)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$dir/log" | tail -1 | grep -o '[0-9]*$' || true)
  if [[ $rc -eq 0 ]]; then
    result="ok, no findings"
  else
    failed=1
    result="FINDING (exit $rc)"
    for a in "$dir"/artifacts/*; do
      [[ -e "$a" ]] || continue
      cp "$a" "$BUILD/findings/${name}-$(basename "$a")"
      result="$result: $BUILD/findings/${name}-$(basename "$a")"
    done
    cp "$dir/log" "$BUILD/findings/${name}.log"
    echo "---- $name: last lines of the log ($BUILD/findings/${name}.log) ----" >&2
    tail -40 "$dir/log" >&2
  fi
  printf '%-20s %8s %12s %10s  %s\n' "$name" "$((SECONDS - t0))" "${execs:-?}" "${rate:-?}" "$result"
}

# The tokenizer target on one vocabulary: tiny (the tests' own), smollm2, or a llama.cpp vocabulary.
run_tokenizer() {  # vocabulary name
  local v="$1" f
  case "$v" in
    tiny) run_one tokenizer tokenizer CT_FUZZ_TOKENIZER_GGUF= ; return ;;
    smollm2) f="$SMOL" ;;
    *) f="$VOCAB_DIR/ggml-vocab-$v.gguf" ;;
  esac
  if [[ -f "$f" ]]; then
    run_one "tokenizer:$v" tokenizer CT_FUZZ_TOKENIZER_GGUF="$f"
  else
    echo "tokenizer:$v: skipped, $f is absent (tools/fetch_model.sh and tools/fetch_vocab_tests.sh fetch them)"
  fi
}

for t in "${TARGETS[@]}"; do
  if [[ "$t" == tokenizer ]]; then
    for v in tiny smollm2 $VOCABS; do run_tokenizer "$v"; done
  elif [[ "$t" == tokenizer:* ]]; then
    run_tokenizer "${t#tokenizer:}"
  else
    run_one "$t" "$t"
  fi
done
exit $failed
