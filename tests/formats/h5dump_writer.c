/*
 * Writes a one-layer trace with known contents for tests/formats/h5dump.sh:
 *   h5dump_writer OUT.h5 COMPRESSION
 * and prints the values of layer_000/indices to stdout, one per line, so
 * the script can compare them with what h5dump reads from the file.
 * 6000 tokens with up to 150 active neurons: more than one 256K-element chunk.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nl_formats.h"

int main(int argc, char **argv)
{
	struct nl_trace_meta meta;
	struct nl_trace_writer *w;
	struct nl_h5_opts opts;
	uint32_t ids[1000], n_active;
	const uint32_t *rows[1] = { ids };
	FILE *expect;
	int err;

	if (argc != 3) {
		fprintf(stderr, "usage: h5dump_writer OUT.h5 zstd|deflate|none\n");
		return 2;
	}
	memset(&meta, 0, sizeof(meta));
	strcpy(meta.model.name, "h5dump-check");
	meta.model.n_layers = 1;
	meta.model.d_model = 4;
	meta.model.n_neurons = 1000;
	strcpy(meta.dataset, "pattern");
	meta.sparsity = NL_SPARSITY_RELU;
	expect = stdout;
	err = nl_h5_opts_parse(&opts, argv[2]);
	if (!err)
		err = nl_trace_create(&w, argv[1], &meta, &opts);
	for (uint32_t t = 0; !err && t < 6000; t++) {
		n_active = (t * 7919u) % 151;
		for (uint32_t i = 0; i < n_active; i++) {
			ids[i] = (t + i * 6) % 1000;
			if (i && ids[i] <= ids[i - 1])
				ids[i] = ids[i - 1] + 1;
		}
		while (n_active && ids[n_active - 1] >= 1000)
			n_active--;
		for (uint32_t i = 0; i < n_active; i++)
			fprintf(expect, "%u\n", ids[i]);
		err = nl_trace_append(w, rows, &n_active, 0);
	}
	if (!err)
		err = nl_trace_finish(w, NULL);
	if (err) {
		fprintf(stderr, "h5dump_writer: %s\n", nl_diag_msg());
		return 1;
	}
	return 0;
}
