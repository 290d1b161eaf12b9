#!/bin/sh
# `make demo`: the pipeline end to end. With the real data present (DATA,
# default ../shared/data) it profiles stories260K on GSM8K, counts
# co-activations, places neurons with every algorithm and judges the
# placements on held-out text (GSM8K test split and WikiText-2). Without it,
# the same steps run on synthetic traces, labelled as such.
set -eu

BUILD=${BUILD:-build}
DATA=${DATA:-../shared/data}
OUT=${OUT:-out}
bin=$BUILD
profile=$bin/profiler/nl-profile
coact=$bin/coact/nl-coact
place=$bin/placer/nl-place
algos=identity,frequency,greedy,greedy-sparse,refine

mkdir -p "$OUT/place"
step() { printf '\n== %s\n' "$*" >&2; }

model=$DATA/models/stories260K/stories260K.bin
if [ -r "$model" ]; then
	tok=$DATA/models/stories260K/tok512.bin
	gsm=$DATA/text/gsm8k/train.jsonl
	# nl-profile run with the options every profile below shares
	prof() {
		"$profile" run -m "$model" -t "$tok" --sparsity threshold --density 0.3 \
			--max-tokens 256 -f "$@"
	}

	step "profile stories260K on GSM8K (train role: 1,024 samples)"
	prof -d "$gsm" --fields question,answer --samples 1024 \
		--split-role train -o "$OUT/gsm8k-train.h5"
	step "profile held-out GSM8K samples (test role: never shared with train)"
	prof -d "$gsm" --fields question,answer --samples 256 \
		--split-role test -o "$OUT/gsm8k-test.h5"
	step "profile held-out WikiText-2 paragraphs (another dataset)"
	prof -d "$DATA/text/wikitext2/wiki.test.raw" --samples 256 \
		--split-role all -o "$OUT/wikitext2.h5"
	step "profile Alpaca with the GGUF copy of the model (embedded vocabulary)"
	"$profile" run -m "$DATA/models/stories260K/stories260K-f32.gguf" --sparsity threshold \
		--density 0.3 --max-tokens 256 -f -d "$DATA/text/alpaca/alpaca_data_1k.json" \
		--fields instruction,input,output --samples 256 -o "$OUT/alpaca.h5"
	train=$OUT/gsm8k-train.h5
	heldout="gsm8k-test wikitext2 alpaca"   # $OUT/NAME.h5
else
	echo "demo: no real data at '$DATA' (set DATA=...); running on SYNTHETIC traces" >&2
	step "SYNTHETIC traces: 8 layers x 2048 neurons, 3% active (not a quality claim)"
	"$profile" synth --shape 8x2048 --tokens 20000 --density 0.03 --seed 1 -f \
		-o "$OUT/synthetic-train.h5"
	"$profile" synth --shape 8x2048 --tokens 5000 --density 0.03 --seed 1 --token-seed 2 -f \
		-o "$OUT/synthetic-test.h5"
	train=$OUT/synthetic-train.h5
	heldout=synthetic-test
fi

step "co-activation statistics"
"$coact" count "$train" -o "$OUT/coact.h5" -f
step "placements: $algos"
"$place" -a "$algos" "$OUT/coact.h5" -o "$OUT/place/{algo}.h5" -f
step "heatmaps of layer 0: model order and refined placement"
"$coact" heatmap "$OUT/coact.h5" --layer 0 -o "$OUT/heatmap-layer0.png" -f
"$coact" heatmap "$OUT/coact.h5" --layer 0 -p "$OUT/place/refine.h5" \
	-o "$OUT/heatmap-layer0-refine.png" -f
for t in $heldout; do
	step "judge the placements on $OUT/$t.h5"
	set --
	for a in $(echo $algos | tr , ' '); do set -- "$@" --placement "$OUT/place/$a.h5"; done
	"$place" eval "$@" --traces "$OUT/$t.h5"
done
printf '\ndemo: outputs in %s/\n' "$OUT" >&2
