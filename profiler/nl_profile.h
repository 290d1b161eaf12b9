/*
 * Profiler library: the CPU forward pass that exposes FFN activations, the
 * sparsity rules that turn them into active sets, dataset readers, the NumPy
 * importer and the synthetic trace generator.
 */
#ifndef NL_PROFILE_H
#define NL_PROFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nl_formats.h"
#include "nl_model.h"

/* ---- forward pass (Llama: RMSNorm, RoPE, GQA with KV cache, gated FFN) ---- */

enum nl_ffn_act {
	NL_FFN_SWIGLU = 0,  /* silu(x W_gate) * (x W_up) */
	NL_FFN_RELU = 1,    /* ReGLU: relu(x W_gate) * (x W_up) */
};

/*
 * Called once per layer for a block of consecutive tokens of the sequence:
 * gate_act[t * hidden_dim + i] is the gate activation act(x W_gate)_i of token
 * pos0 + t (what the sparsity rules look at), n_tok tokens.
 */
typedef int (*nl_ffn_hook)(void *ctx, uint32_t layer, uint32_t pos0, uint32_t n_tok,
			   const float *gate_act, uint32_t hidden_dim);

struct nl_forward;

/* n_threads 0 = all online CPUs. The model must outlive the forward state. */
int nl_forward_create(struct nl_forward **out, const struct nl_model *m,
		      enum nl_ffn_act act, uint32_t n_threads);
/*
 * Runs tokens[0..n) as one sequence from position 0 (the KV cache is reset),
 * n <= seq_len. When logits is not NULL it receives [n, vocab_size] floats.
 * hook may be NULL; a non-zero hook return stops the pass and is returned.
 */
int nl_forward_sequence(struct nl_forward *f, const uint32_t *tokens, size_t n,
			nl_ffn_hook hook, void *ctx, float *logits);
void nl_forward_free(struct nl_forward *f);

/* Mean next-token negative log-likelihood helper: sum of -log softmax(logits[t])[tokens[t+1]]. */
double nl_forward_nll_sum(const float *logits, const uint32_t *tokens, size_t n, uint32_t vocab);

/* ---- synthetic traces (for benchmarks at 7B shapes; never for quality claims) ---- */

struct nl_synth_params {
	struct nl_model_id model;  /* shape: n_layers, n_neurons, d_model; name "synthetic-..." */
	uint64_t n_tokens;
	double density;            /* mean fraction of neurons active per token */
	double zipf_s;             /* power-law exponent of per-neuron activation frequency */
	uint32_t group_size;       /* neurons per co-activation group */
	double coherence;          /* probability a group member fires when its group fires */
	uint64_t seed;
	/* Appended (prof): share of the activation rate that is independent per-neuron
	 * noise rather than group firings, 0..1. nl_synth_defaults() sets 0.5. */
	double noise;
	/* Seed of the token draws; 0 = seed. Two traces with the same seed and
	 * different token seeds share the structure (frequencies, groups) but not
	 * the tokens: a held-out set for the same synthetic "model". */
	uint64_t token_seed;
};
void nl_synth_defaults(struct nl_synth_params *p);
/* Generates one layer deterministically from (params, layer); caller frees with nl_csr_free(). */
int nl_synth_layer(const struct nl_synth_params *p, uint32_t layer, struct nl_csr *out);
/*
 * Fills a model identity from a shape name: "opt-6.7b" (32 x 16384, d_model 4096),
 * "llama-2-7b" (32 x 11008, d_model 4096) or "LAYERSxNEURONS[xDMODEL]"; the name
 * is "synthetic-<shape>". NL_E_INVAL with a diagnostic on anything else.
 */
int nl_synth_shape(struct nl_model_id *id, const char *spec);

/* ==== Appended by the profiler stage (prof): sparsity rules, datasets, import, run ==== */

/* ---- what "active" means (nl_sparsity.c) ---- */

/*
 * Each rule writes the active neuron ids of one token, in increasing order, to
 * ids (room for n) and returns their count. act is the gate activation
 * act(x W_gate) of the n neurons (Neuralink section 4.1: gate, up and down of
 * one index are one unit). NaN is never active.
 *   relu:      act_i > 0 (exact zeros of a ReLU gate are inactive)
 *   threshold: |act_i| > threshold (CATS); compared in double precision
 *   topk:      the k largest |act_i|; equal magnitudes go to the lower id.
 * scratch holds n uint64_t.
 */
uint32_t nl_active_relu(const float *act, uint32_t n, uint32_t *ids);
uint32_t nl_active_threshold(const float *act, uint32_t n, double threshold, uint32_t *ids);
uint32_t nl_active_topk(const float *act, uint32_t n, uint32_t k, uint32_t *ids, uint64_t *scratch);
/* k of the topk rule for a density: round(density * n), at least 1 when density > 0. */
uint32_t nl_topk_count(double density, uint32_t n);

/*
 * Threshold calibration: a histogram of |act| per layer (bins of ~0.1%
 * relative width) gathered over the profiling tokens in a first pass; then
 * the per-layer t_l with a fraction `density` of the values above it
 * (interpolated inside the bin). One histogram per thread, merged.
 */
struct nl_thresh_hist;
int nl_thresh_hist_create(struct nl_thresh_hist **out, uint32_t n_layers);
void nl_thresh_hist_add(struct nl_thresh_hist *h, uint32_t layer, const float *act, size_t n);
int nl_thresh_hist_merge(struct nl_thresh_hist *dst, const struct nl_thresh_hist *src);
int nl_thresh_hist_threshold(const struct nl_thresh_hist *h, uint32_t layer, double density,
			     double *threshold);
void nl_thresh_hist_free(struct nl_thresh_hist *h);

/* ---- datasets (nl_dataset.c) ---- */

enum nl_ds_format {
	NL_DS_TEXT = 0,       /* paragraphs separated by blank lines, or by opts.separator */
	NL_DS_JSONL = 1,      /* one JSON object (or string) per line */
	NL_DS_JSON = 2,       /* one JSON array of objects (or strings) */
	NL_DS_HELLASWAG = 3,  /* 6 lines per task: context, gold index 0-3, 4 endings */
	NL_DS_IDS = 4,        /* pre-tokenised: whitespace-separated token ids, one sample per line */
	NL_DS_LINES = 5,      /* one sample per non-blank line (WikiText-2 raw has no blank lines) */
};
int nl_ds_format_parse(enum nl_ds_format *f, const char *name);
const char *nl_ds_format_name(enum nl_ds_format f);

struct nl_dataset_opts {
	enum nl_ds_format format;
	/* JSON: comma-separated fields joined with "\n" (empty values skipped);
	 * NULL = every non-empty string field of the object in order. */
	const char *fields;
	/* Text: split on this exact string (e.g. "<|endoftext|>") instead of blank lines. */
	const char *separator;
};

/* One sample: text (NUL-terminated, surrounding whitespace stripped) or, for NL_DS_IDS, ids. */
struct nl_sample {
	const char *text;
	size_t len;
	const uint32_t *ids;
	size_t n_ids;
	uint64_t line;         /* 1-based line of the file where the sample starts */
};

struct nl_dataset;
/*
 * Reads a whole dataset file; names ending in ".bz2" are decompressed through
 * `bzip2 -dc` (the bzip2 program must be installed). Empty samples are
 * dropped. Errors name the file, the line and what is wrong.
 */
int nl_dataset_open(struct nl_dataset **out, const char *path, const struct nl_dataset_opts *opts);
size_t nl_dataset_count(const struct nl_dataset *d);
const struct nl_sample *nl_dataset_sample(const struct nl_dataset *d, size_t i);
void nl_dataset_free(struct nl_dataset *d);

enum nl_split_role {
	NL_SPLIT_ALL = 0,
	NL_SPLIT_TRAIN = 1,   /* profiling side */
	NL_SPLIT_TEST = 2,    /* evaluation side */
};
int nl_split_role_parse(enum nl_split_role *r, const char *name);
const char *nl_split_role_name(enum nl_split_role r);

struct nl_select_opts {
	uint64_t n_samples;    /* 0 = all of the role */
	uint64_t seed;         /* which samples (seeded shuffle) */
	enum nl_split_role role;
	double test_fraction;  /* share of samples in the test role, 0 < f < 1 */
};
/*
 * True when sample `index` belongs to the test role. The split depends only on
 * the index and test_fraction, never on the selection seed, so runs with
 * different seeds or sample counts never put one sample on both sides.
 */
bool nl_dataset_is_test(uint64_t index, double test_fraction);
/*
 * Deterministic selection: the samples of the role, shuffled with seed, the
 * first n_samples of them, returned in increasing index order (*idx allocated,
 * caller frees). Fewer are returned when the role has fewer.
 */
int nl_dataset_select(const struct nl_dataset *d, const struct nl_select_opts *o,
		      uint32_t **idx, size_t *n);

/* ---- profiling run (nl_prof_run.c) ---- */

struct nl_prof_opts {
	enum nl_sparsity sparsity;   /* RELU, THRESHOLD or TOPK */
	double density;              /* THRESHOLD/TOPK target */
	enum nl_ffn_act act;
	uint32_t max_tokens;         /* per sample including BOS; 0 = the model's seq_len */
	uint32_t n_threads;          /* workers, each with its own single-threaded forward pass */
	const char *dataset_name;    /* stored in the trace */
	struct nl_h5_opts h5;
	/* Called from the calling thread only, in pass order (1 = calibration, 2 = trace). */
	void (*progress)(void *ctx, int pass, uint64_t done_tokens, uint64_t total_tokens);
	void *progress_ctx;
};

struct nl_prof_result {
	uint32_t n_layers, n_neurons;
	uint64_t n_samples;
	uint64_t n_tokens;
	uint64_t n_truncated;        /* samples cut to max_tokens */
	double *density;             /* [n_layers] achieved */
	double *threshold;           /* [n_layers] for THRESHOLD, else NULL */
};
void nl_prof_result_free(struct nl_prof_result *r);

/*
 * Profiles the selected samples sel[0..n_sel) of d: text samples are encoded
 * as BOS + encode(text) with v (ids samples are used as they are and checked
 * against the vocabulary size), cut to max_tokens, run through the forward
 * pass and their active sets written to the trace at out_path (sample ids =
 * dataset indices), tokens in sample order whatever the thread count.
 */
int nl_prof_run(const struct nl_model *m, const struct nl_vocab *v, const struct nl_dataset *d,
		const uint32_t *sel, size_t n_sel, const struct nl_prof_opts *o,
		const char *out_path, struct nl_prof_result *res);

/* ---- import from other frameworks (nl_import.c) ---- */

enum nl_npy_dtype {
	NL_NPY_BOOL = 0,   /* '|b1' */
	NL_NPY_U8 = 1,     /* '|u1' */
	NL_NPY_F16 = 2,    /* '<f2' */
	NL_NPY_F32 = 3,    /* '<f4' */
	NL_NPY_I32 = 4,    /* '<i4': sample ids only */
	NL_NPY_I64 = 5,    /* '<i8': sample ids only */
};

struct nl_npy_info {
	enum nl_npy_dtype dtype;
	uint32_t major;        /* format version 1, 2 or 3 */
	uint64_t rows;         /* tokens */
	uint64_t cols;         /* neurons */
	uint64_t data_offset;  /* bytes before the array data */
	uint32_t ndim;         /* 1 or 2; a 1-D array has cols = 1 */
};

/* Parses and checks a .npy header: magic, version, descr, fortran_order, 1-D/2-D shape, file size. */
int nl_npy_read_header(const char *path, struct nl_npy_info *info);
/* Reads a 1-D int32/int64 .npy of per-token sample ids (values 0..2^32-1); *ids allocated. */
int nl_npy_read_sample_ids(const char *path, uint32_t **ids, uint64_t *n);
/*
 * Reads a [tokens, neurons] .npy into active sets: bool/uint8 masks are active
 * where non-zero; float16/float32 activations where |x| > threshold.
 */
int nl_npy_read_active(const char *path, double threshold, struct nl_csr *out,
		       struct nl_npy_info *info);
/*
 * Writes a trace from one .npy per layer (paths[l] is layer l). meta gives the
 * model identity (n_neurons and n_layers 0 = taken from the files, else they
 * must match; d_model must be set) and dataset; all files must agree on the shape.
 * sample_ids_path (may be NULL) is a 1-D .npy with one sample id per token. density[] receives the achieved
 * density per layer when not NULL.
 */
int nl_npy_import(const char *const *paths, uint32_t n_paths, double threshold,
		  const char *sample_ids_path, const struct nl_trace_meta *meta,
		  const struct nl_h5_opts *h5, const char *out_path, double *density);

#endif
