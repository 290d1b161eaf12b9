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
};
void nl_synth_defaults(struct nl_synth_params *p);
/* Generates one layer deterministically from (params, layer); caller frees with nl_csr_free(). */
int nl_synth_layer(const struct nl_synth_params *p, uint32_t layer, struct nl_csr *out);

#endif
