#!/bin/sh
# Paper Table 6 analogue: mean achieved density (active neurons / all) per
# model and dataset, profiled with `nl-profile run` (256 train samples, 128
# tokens each). With --sparsity relu on these SwiGLU models it measures the
# share of positive gate pre-activations; threshold/topk hit their target by
# construction. Used for the table in docs/profiling.md:
#   BUILD=build DATA=../shared/data sh scripts/density_table.sh [relu|threshold|topk]
set -eu
BUILD=${BUILD:-build}
DATA=${DATA:-../shared/data}
OUT=${OUT:-out/density}
RULE=${1:-relu}
P=$BUILD/profiler/nl-profile
M=$DATA/models
T=$DATA/text
mkdir -p "$OUT"

mean() { # prints the mean_density of the JSON summary as a percentage
	sed -n 's/.*"mean_density":\([0-9.e-]*\).*/\1/p' | awk '{ printf "%6.2f%%", 100 * $1 }'
}

printf '%-14s %-8s %-8s %-8s\n' model Alpaca OpenWebText WikiText
for m in stories260K aidreams260K; do
	if [ $m = stories260K ]; then
		mp=$M/stories260K/stories260K.bin; tk=$M/stories260K/tok512.bin
	else
		mp=$M/aidreams260K/aidreams260K.bin; tk=$M/aidreams260K/tok512_aidreams.bin
	fi
	extra=""
	[ "$RULE" = relu ] || extra="--density 0.3"
	a=$("$P" run -m "$mp" -t "$tk" -d "$T/alpaca/alpaca_data_1k.json" --fields instruction,input,output \
		--samples 256 --max-tokens 128 --sparsity "$RULE" $extra -q -f --json -o "$OUT/$m-alpaca.h5" | mean)
	o=$("$P" run -m "$mp" -t "$tk" -d "$T/openwebtext/openwebtext_sample.txt" \
		--samples 256 --max-tokens 128 --sparsity "$RULE" $extra -q -f --json -o "$OUT/$m-owt.h5" | mean)
	w=$("$P" run -m "$mp" -t "$tk" -d "$T/wikitext2/wiki.test.raw" --format lines \
		--samples 256 --max-tokens 128 --sparsity "$RULE" $extra -q -f --json -o "$OUT/$m-wiki.h5" | mean)
	printf '%-14s %-8s %-8s %-8s\n' "$m" "$a" "$o" "$w"
done
