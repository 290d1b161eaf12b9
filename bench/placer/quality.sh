#!/bin/sh
# Placement quality on real traces (stories260K): profile GSM8K training
# samples, count co-activation, place with every algorithm, then judge each
# placement on the profiling traces and on held-out traces (GSM8K test split,
# WikiText-2). Prints a markdown table of reads per token and mean run length
# per algorithm and trace set (bench/run.sh puts it in docs/BENCHMARKS.md).
#
#   BUILD=build DATA=../shared/data sh bench/placer/quality.sh
#
# Environment: BUILD (meson build dir), DATA (shared data), OUT (work dir,
# default out/placer-quality), SAMPLES (profiling samples, default 1024),
# EVAL_SAMPLES (held-out samples per set, default 512), SPARSITY (default
# topk: a per-token rule, so profiling and held-out traces use the same rule;
# threshold would calibrate its own t_l on each set), DENSITY (default 0.3),
# TOPK (candidate neighbours, default 32), JOBS (default 2).
set -eu

BUILD=${BUILD:-build}
DATA=${DATA:-../shared/data}
OUT=${OUT:-out/placer-quality}
SAMPLES=${SAMPLES:-1024}
EVAL_SAMPLES=${EVAL_SAMPLES:-512}
SPARSITY=${SPARSITY:-topk}
DENSITY=${DENSITY:-0.3}
TOPK=${TOPK:-32}
JOBS=${JOBS:-2}

PROFILE=$BUILD/profiler/nl-profile
COACT=$BUILD/coact/nl-coact
PLACE=$BUILD/placer/nl-place
MODEL=$DATA/models/stories260K/stories260K.bin
TOK=$DATA/models/stories260K/tok512.bin
ALGOS="identity frequency greedy greedy-sparse refine"

for p in "$PROFILE" "$COACT" "$PLACE"; do
	[ -x "$p" ] || { echo "quality.sh: $p is missing; build first (ninja -C $BUILD)" >&2; exit 1; }
done
mkdir -p "$OUT"

# nl-profile run with the options every profile below shares
prof() {
	"$PROFILE" run -m "$MODEL" -t "$TOK" --sparsity "$SPARSITY" --density "$DENSITY" \
		-j "$JOBS" -f -q "$@"
}
echo "== profiling GSM8K train ($SAMPLES samples) and held-out sets" >&2
# Profiling side: train split of GSM8K's training file.
prof -d "$DATA/text/gsm8k/train.jsonl" --fields question,answer \
	--samples "$SAMPLES" --split-role train -o "$OUT/profile-gsm8k-train.h5" >&2
# Held-out: GSM8K's own test file (never seen in profiling) and WikiText-2.
prof -d "$DATA/text/gsm8k/test.jsonl" --fields question,answer \
	--samples "$EVAL_SAMPLES" --split-role all -o "$OUT/heldout-gsm8k-test.h5" >&2
prof -d "$DATA/text/wikitext2/wiki.test.raw" --format lines \
	--samples "$EVAL_SAMPLES" --split-role all -o "$OUT/heldout-wikitext2.h5" >&2

echo "== co-activation statistics" >&2
"$COACT" count "$OUT/profile-gsm8k-train.h5" -o "$OUT/coact.h5" -k "$TOPK" -j "$JOBS" -f -q

echo "== placements" >&2
start=$(date +%s.%N)
"$PLACE" -a "$(echo $ALGOS | tr ' ' ',')" -k "$TOPK" -j "$JOBS" -f -q --json \
	"$OUT/coact.h5" -o "$OUT/place-{algo}.h5" >"$OUT/place.json"
end=$(date +%s.%N)
awk -v s="$start" -v e="$end" 'BEGIN { printf "placement of all algorithms: %.2f s\n", e - s }' >&2

set --
for a in $ALGOS; do
	set -- "$@" -p "$OUT/place-$a.h5"
done
for set in profile-gsm8k-train heldout-gsm8k-test heldout-wikitext2; do
	"$PLACE" eval -q --json "$@" -t "$OUT/$set.h5" >"$OUT/eval-$set.json"
	"$PLACE" eval -q "$@" -t "$OUT/$set.h5" >"$OUT/eval-$set.txt"
done

# One row per algorithm: reads/token and mean run on each set, plus the
# reads/token with gaps of up to 2 neurons collapsed (and what that costs).
printf '\n| algorithm | reads/token profile (GSM8K train) | reads/token GSM8K test | reads/token WikiText-2 | mean run profile | mean run GSM8K test | mean run WikiText-2 | max run WikiText-2 | WikiText-2 reads/token, gap<=2 collapsed (+extra neurons) |\n'
printf '|---|---:|---:|---:|---:|---:|---:|---:|---:|\n'
i=0
for a in $ALGOS; do
	row="| $a"
	for set in profile-gsm8k-train heldout-gsm8k-test heldout-wikitext2; do
		row="$row | $(jq -r ".placements[$i].total.reads_per_token | . * 100 | round / 100" "$OUT/eval-$set.json")"
	done
	for set in profile-gsm8k-train heldout-gsm8k-test heldout-wikitext2; do
		row="$row | $(jq -r ".placements[$i].total.mean_run | . * 1000 | round / 1000" "$OUT/eval-$set.json")"
	done
	row="$row | $(jq -r ".placements[$i].total.max_run" "$OUT/eval-heldout-wikitext2.json")"
	row="$row | $(jq -r ".placements[$i].total.collapse[2] | \"\(.reads_per_token * 100 | round / 100) (+\(.extra_neurons_per_token * 10 | round / 10))\"" "$OUT/eval-heldout-wikitext2.json")"
	echo "$row |"
	i=$((i + 1))
done
printf '\nper-token figures are sums over the %s layers; tokens: profile %s, GSM8K test %s, WikiText-2 %s\n' \
	"$(jq -r '.layer_count' "$OUT/eval-heldout-wikitext2.json")" \
	"$(jq -r '.tokens' "$OUT/eval-profile-gsm8k-train.json")" \
	"$(jq -r '.tokens' "$OUT/eval-heldout-gsm8k-test.json")" \
	"$(jq -r '.tokens' "$OUT/eval-heldout-wikitext2.json")"
