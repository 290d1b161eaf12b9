#!/bin/sh
# Builds one fuzz target (libFuzzer, clang, ASan + UBSan) and runs it for N
# seconds on a scratch copy of its committed corpus (and golden files).
#   tests/fuzz.sh TARGET [SECONDS] [BUILD_DIR]     default: 60 s, build-fuzz
# TARGET:
#   formats  the HDF5 readers (traces, co-activation, placement), seeded with
#            the golden HDF5 files; corpus tests/formats/corpus/
#   image    the .nlimg parser, seeded with the golden images; tests/image/corpus/
#   model    GGUF, llama2.c checkpoints and tokenizer.bin; tests/model/corpus/
#   profiler the dataset readers and the .npy importer; tests/profiler/corpus/
# MERGE=1 then minimises what was found into the target's corpus (commit it):
# formats and image replace their corpus by the minimised set, model and
# profiler add the new inputs to their seed corpus and keep the seeds.
# Crashing inputs are written to tests/TARGET/corpus/crash-*: once fixed, keep
# them there so the replay test (TARGET-fuzz-corpus) runs them on every `make test`.
# Crashes inside libhdf5 itself (not instrumented; e.g. its global-heap
# reader) are HDF5 bugs: report them upstream rather than keeping them.
set -eu
cd "$(dirname "$0")/.."
target=${1:-}
secs=${2:-60}
build=${3:-build-fuzz}
cc=${CC:-clang}
command -v "$cc" >/dev/null || cc=clang-14

case $target in
formats)
	exe=fuzz_h5 max_len=65536 seeds="tests/golden/ok/hdf5/*.h5 tests/golden/reject/hdf5/*.h5"
	merge=replace
	# HDF5 leaks on some damaged files inside the library: leaks are not findings here.
	ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
	export ASAN_OPTIONS ;;
image)
	exe=fuzz_image max_len=16384
	seeds="tests/golden/ok/nlimg/*.nlimg tests/golden/reject/nlimg/*.nlimg"
	merge=replace ;;
model)
	exe=fuzz_model max_len=65536 seeds= merge=add ;;
profiler)
	exe=fuzz_profiler max_len=65536 seeds= merge=add ;;
*)
	echo "usage: tests/fuzz.sh formats|image|model|profiler [SECONDS] [BUILD_DIR]" >&2
	exit 2 ;;
esac
corpus=tests/$target/corpus

if [ ! -f "$build/build.ninja" ]; then
	CC="$cc" meson setup "$build" -Dfuzz=true -Db_sanitize=address,undefined \
		-Db_lundef=false -Dbuildtype=debugoptimized
fi
ninja -C "$build" -j2 "tests/$target/$exe"

work=$(mktemp -d "/tmp/nl-$target-fuzz-XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/run" "$work/min" "$corpus"
cp "$corpus"/* "$work/run/" 2>/dev/null || true
for f in $seeds; do
	cp "$f" "$work/run/golden-$(basename "$f")"
done

"$build/tests/$target/$exe" -max_total_time="$secs" -max_len="$max_len" -timeout=10 \
	-rss_limit_mb=2048 -print_final_stats=1 \
	-artifact_prefix="$corpus/" "$work/run"

if [ "${MERGE:-0}" = 1 ]; then
	"$build/tests/$target/$exe" -merge=1 -max_len="$max_len" "$work/min" "$work/run"
	if [ "$merge" = replace ]; then
		find "$corpus" -type f ! -name 'crash-*' -delete
	fi
	cp "$work/min"/* "$corpus/" 2>/dev/null || true
	echo "corpus: $(ls "$corpus" | wc -l) files, $(du -sh --apparent-size "$corpus" | cut -f1)"
fi
