#!/bin/sh
# Interoperability check of the Zstandard filter (HDF5 id 32015): a trace we
# write with zstd is read by the stock h5dump through our filter plugin
# (HDF5_PLUGIN_PATH) and its values match what we wrote; without the plugin
# h5dump cannot read it (so the data really is zstd-compressed); a deflate
# trace reads with plain h5dump.
#   h5dump.sh WRITER PLUGIN_DIR [ASAN_RUNTIME]
# Skips (TAP plan 1..0) when h5dump is not installed.
set -eu
writer=$1
plugin_dir=$2
asan_runtime=${3:-}

if ! command -v h5dump >/dev/null 2>&1; then
	echo "1..0 # SKIP h5dump not installed (Debian package hdf5-tools)"
	exit 0
fi
if [ -n "$asan_runtime" ] && [ ! -f "$asan_runtime" ]; then
	echo "1..0 # SKIP ASan build without a shared ASan runtime to preload into h5dump"
	exit 0
fi
if [ ! -e "$plugin_dir/libh5zstd.so" ]; then
	echo "libh5zstd.so not found in $plugin_dir" >&2
	exit 1
fi
work=$(mktemp -d /tmp/nl-h5dump-XXXXXX)
trap 'rm -rf "$work"' EXIT

# h5dump is not instrumented: under ASan the plugin needs the runtime preloaded.
run_h5dump() {
	if [ -n "$asan_runtime" ]; then
		LD_PRELOAD=$asan_runtime ASAN_OPTIONS=detect_leaks=0 h5dump "$@"
	else
		h5dump "$@"
	fi
}
# One value per line from h5dump's data output.
values() {
	{ cat "$1"; echo; } | tr -s ', \n' '\n\n\n' | sed '/^$/d'
}

n=0
check() {
	n=$((n + 1))
	if "$@"; then echo "ok $n - $desc"; else echo "not ok $n - $desc"; fail=1; fi
}
fail=0
echo "1..5"

"$writer" "$work/zstd.h5" zstd >"$work/expect.txt"
"$writer" "$work/deflate.h5" deflate >"$work/expect_deflate.txt"
count=$(wc -l <"$work/expect.txt")

desc="zstd file: h5dump lists filter 32015 'Zstandard'"
check sh -c "HDF5_PLUGIN_PATH='$plugin_dir' ${asan_runtime:+LD_PRELOAD='$asan_runtime' ASAN_OPTIONS=detect_leaks=0} h5dump -p -H -d /layer_000/indices '$work/zstd.h5' | grep -q 'FILTER_ID 32015'"

desc="zstd file: h5dump with the plugin reads all $count indices and they match"
HDF5_PLUGIN_PATH=$plugin_dir run_h5dump -d /layer_000/indices -y -o "$work/dump_zstd.txt" \
	"$work/zstd.h5" >/dev/null 2>"$work/err_zstd.txt" || true
values "$work/dump_zstd.txt" >"$work/got_zstd.txt" 2>/dev/null || true
check cmp -s "$work/expect.txt" "$work/got_zstd.txt"

desc="zstd file: h5dump without the plugin cannot read the data"
HDF5_PLUGIN_PATH=/nonexistent h5dump -d /layer_000/indices -y -o "$work/dump_noplug.txt" \
	"$work/zstd.h5" >/dev/null 2>&1 && noplug=0 || noplug=1
check sh -c "[ $noplug = 1 ] || ! cmp -s '$work/expect.txt' '$work/dump_noplug.txt'"

desc="deflate file: plain h5dump reads the indices and they match"
HDF5_PLUGIN_PATH=/nonexistent h5dump -d /layer_000/indices -y -o "$work/dump_deflate.txt" \
	"$work/deflate.h5" >/dev/null 2>&1 || true
values "$work/dump_deflate.txt" >"$work/got_deflate.txt" 2>/dev/null || true
check cmp -s "$work/expect_deflate.txt" "$work/got_deflate.txt"

desc="zstd file: root attribute format = neuralink-traces"
check sh -c "HDF5_PLUGIN_PATH='$plugin_dir' ${asan_runtime:+LD_PRELOAD='$asan_runtime' ASAN_OPTIONS=detect_leaks=0} h5dump -a /format '$work/zstd.h5' | grep -q '\"neuralink-traces\"'"

if [ $fail != 0 ]; then
	echo "--- h5dump stderr (zstd):" >&2
	cat "$work/err_zstd.txt" >&2
	head -c 600 "$work/dump_zstd.txt" >&2 || true
fi
exit $fail
