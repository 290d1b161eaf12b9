#!/bin/sh
# Calibration of the synthetic trace generator against real traces: profiles
# the real small models on real datasets, generates synthetic traces with the
# default parameters, and prints the placement-relevant statistics of all of
# them (bench/profiler/synth_calib.c). The table in docs/profiling.md comes
# from this script:   BUILD=build DATA=../shared/data sh scripts/synth_calibration.sh
set -eu
BUILD=${BUILD:-build}
DATA=${DATA:-../shared/data}
OUT=${OUT:-out/calibration}
P=$BUILD/profiler/nl-profile
C=$BUILD/bench/profiler/synth-calib
M=$DATA/models
T=$DATA/text
mkdir -p "$OUT"

profile() { # model tokenizer name dataset-args...
	model=$1; tok=$2; name=$3; shift 3
	"$P" run -m "$model" -t "$tok" "$@" --samples 256 --max-tokens 128 --seed 1 \
		--sparsity threshold --density 0.3 -q -f -o "$OUT/$name.h5" >/dev/null
}

for m in stories260K aidreams260K; do
	if [ $m = stories260K ]; then
		mp=$M/stories260K/stories260K.bin; tk=$M/stories260K/tok512.bin
	else
		mp=$M/aidreams260K/aidreams260K.bin; tk=$M/aidreams260K/tok512_aidreams.bin
	fi
	profile "$mp" "$tk" real-$m-gsm8k -d "$T/gsm8k/train.jsonl" --fields question,answer
	profile "$mp" "$tk" real-$m-wikitext2 -d "$T/wikitext2/wiki.test.raw" --format lines
	profile "$mp" "$tk" real-$m-alpaca -d "$T/alpaca/alpaca_data_1k.json" --fields instruction,input,output
done

# Synthetic with the default parameters: at the real shape and density, and at
# 7B widths (4 layers are enough: layers are independent draws of one model).
"$P" synth --shape 5x172 --tokens 30000 --density 0.3 -q -f -o "$OUT/synth-5x172-d0.30.h5" >/dev/null
"$P" synth --shape 4x16384 --tokens 20000 --density 0.03 -q -f -o "$OUT/synth-opt6.7b-width-d0.03.h5" >/dev/null
"$P" synth --shape 4x11008 --tokens 20000 --density 0.25 -q -f -o "$OUT/synth-llama2-7b-width-d0.25.h5" >/dev/null

"$C" "$OUT"/real-*.h5 "$OUT"/synth-*.h5
