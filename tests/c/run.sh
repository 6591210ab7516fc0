#!/usr/bin/env bash
# Build and run the C engine test (tests/c/test_engine.c, with test_attention.c,
# test_convert.c, test_lp.c and test_bf16dot.c) without Python:
#   tests/c/run.sh native     this machine's ISAs (x86: scalar, avx2, avx512)
#   tests/c/run.sh neon       cross-compiled for aarch64, run under qemu-aarch64
#   tests/c/run.sh valgrind   native build (scalar + avx2: valgrind has no AVX-512) under memcheck,
#                             POSENC_CTEST_QUICK (harness.h: the small sizes, a third of the cases)
#   tests/c/run.sh sanitize   native build with -fsanitize=address,undefined
#   tests/c/run.sh all        native, neon (if the cross tools are installed), valgrind (if installed)
# Needs gcc; for neon: gcc-aarch64-linux-gnu libgomp1-arm64-cross qemu-user (Debian).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${POSENC_CTEST_DIR:-ctest-build}
mkdir -p "$OUT"
SRC="csrc/dispatch.c csrc/cpu.c csrc/engine/entry.c csrc/engine/terms.c csrc/engine/engine_f32.c csrc/engine/engine_f64.c csrc/engine/engine_lp.c csrc/engine/bf16dot.c csrc/engine/runs.c csrc/engine/spans.c csrc/engine/alloc.c csrc/engine/threads.c csrc/engine/philox.c tests/c/harness.c tests/c/test_engine.c tests/c/test_attention.c tests/c/test_convert.c tests/c/test_lp.c tests/c/test_bf16dot.c tests/c/test_terms.c"
# a small chunk of the low-precision forward, so that every way of chunking runs
CFLAGS="-DPOSENC_LP_CHUNK_BYTES=4096 -DPOSENC_LP_ATTENTION_CHUNK_BYTES=4096 -DPOSENC_LP_POISON -O2 -g -std=c11 -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Icsrc"

AVX512="-mavx512f -mavx512vl -mavx512dq -mavx2 -mfma"   # setup.py's ISAS and ISA_EXTENSIONS

build_x86() {  # $1 output, $2 extra flags, $3 "avx512" to include it (and AVX512-BF16 if gcc takes it)
  local out=$1 extra=$2 objs="" defs="-DPOSENC_HAVE_AVX2"
  gcc $CFLAGS $extra -c csrc/isa/scalar.c -o "$OUT/scalar.o"
  gcc $CFLAGS $extra -mavx2 -mfma -mf16c -c csrc/isa/avx2.c -o "$OUT/avx2.o"
  objs="$OUT/scalar.o $OUT/avx2.o"
  if [ "${3:-}" = avx512 ]; then
    gcc $CFLAGS $extra $AVX512 -c csrc/isa/avx512.c -o "$OUT/avx512.o"
    objs="$objs $OUT/avx512.o"; defs="$defs -DPOSENC_HAVE_AVX512"
    if gcc $CFLAGS $extra $AVX512 -mavx512bw -mavx512bf16 -c csrc/isa/avx512bf16.c -o "$OUT/avx512bf16.o"; then
      objs="$objs $OUT/avx512bf16.o"; defs="$defs -DPOSENC_HAVE_AVX512BF16"
    else
      echo "avx512bf16: gcc refuses -mavx512bf16, built without it"
    fi
  fi
  gcc $CFLAGS $extra $defs -fopenmp $SRC $objs -lm -o "$out"
}

native() {
  case "$(uname -m)" in
    x86_64) build_x86 "$OUT/test_engine" "" avx512 ;;
    aarch64) gcc $CFLAGS -DPOSENC_HAVE_NEON -fopenmp $SRC csrc/isa/scalar.c csrc/isa/neon.c -lm -o "$OUT/test_engine" ;;
    *) gcc $CFLAGS -fopenmp $SRC csrc/isa/scalar.c -lm -o "$OUT/test_engine" ;;
  esac
  echo "== native ($(uname -m))"; "$OUT/test_engine"
}

neon() {
  local cc=aarch64-linux-gnu-gcc
  command -v $cc >/dev/null || { echo "neon: $cc not found (apt-get install gcc-aarch64-linux-gnu libgomp1-arm64-cross qemu-user)"; return 1; }
  $cc $CFLAGS -DPOSENC_HAVE_NEON -fopenmp $SRC csrc/isa/scalar.c csrc/isa/neon.c -lm -o "$OUT/test_engine_aarch64"
  echo "== neon (aarch64 under qemu)"; qemu-aarch64 -L /usr/aarch64-linux-gnu "$OUT/test_engine_aarch64"
}

memcheck() {
  command -v valgrind >/dev/null || { echo "valgrind not found"; return 1; }
  build_x86 "$OUT/test_engine_vg" "" ""
  echo "== valgrind memcheck (scalar, avx2)"
  POSENC_CTEST_QUICK=1 OMP_NUM_THREADS=2 valgrind --error-exitcode=3 --leak-check=full --errors-for-leak-kinds=definite --show-possibly-lost=no \
    --quiet "$OUT/test_engine_vg"
}

sanitize() {
  build_x86 "$OUT/test_engine_asan" "-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" avx512
  echo "== ASan + UBSan"; ASAN_OPTIONS=detect_leaks=1 "$OUT/test_engine_asan"
}

case "${1:-native}" in
  native) native ;;
  neon) neon ;;
  valgrind) memcheck ;;
  sanitize) sanitize ;;
  all) native; neon; memcheck ;;
  *) echo "usage: $0 native|neon|valgrind|sanitize|all"; exit 2 ;;
esac
