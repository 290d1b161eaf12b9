/*
 * Knobs of the forward pass for tests and benchmarks only; not part of the
 * profiler API.
 */
#ifndef NL_FORWARD_INTERNAL_H
#define NL_FORWARD_INTERNAL_H

#include "nl_profile.h"

/*
 * Processes sequences `tokens` at a time (default: as many as fit in 32 MiB
 * of activations, at most seq_len). Results do not depend on it.
 */
int nl_forward_set_block(struct nl_forward *f, uint32_t tokens);

#endif
