/*
 * A deliberately plain forward pass in the style of llama2.c's run.c: one
 * token at a time, naive matrix-vector products, RoPE recomputed with powf.
 * It is the throughput baseline of bench/profiler and an independent check of
 * profiler/nl_forward.c in tests/model. Not part of any library.
 */
#ifndef NL_REF_RUNC_H
#define NL_REF_RUNC_H

#include <stdbool.h>
#include <stdint.h>

#include "nl_model.h"

struct nl_ref;

/* relu: ReGLU instead of SwiGLU. Returns NULL when out of memory. */
struct nl_ref *nl_ref_create(const struct nl_model *m, bool relu);
/*
 * Runs `token` at position pos (call with pos = 0, 1, 2, ... in order). Writes
 * the logits [vocab_size] and, when gate_act is not NULL, the gate activations
 * act(x W_gate) of every layer [n_layers * hidden_dim].
 */
void nl_ref_step(struct nl_ref *r, uint32_t token, uint32_t pos, float *logits, float *gate_act);
void nl_ref_free(struct nl_ref *r);

#endif
