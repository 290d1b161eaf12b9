/*
 * Throughput of the HDF5 formats (not a test; not built by default):
 *   ninja -C build tests/formats/bench_h5
 *   build/tests/formats/bench_h5 [DIR] [TOKENS] [LAYERS] [ACTIVE] [NEURONS] [CODEC]
 * defaults: /tmp 10000 32 500 16384, all codecs (CODEC: only "none" and that one,
 * and no co-activation part).
 *
 * 1. Streaming trace writer (nl_trace_append, one token at a time) and the
 *    reader, for each compression; ratios against "none" in the same run.
 * 2. One co-activation layer with the dense triangle of NEURONS neurons
 *    (n = 16384: 134M u32, 512 MiB), written and read back.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "nl_formats.h"

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t file_size(const char *path)
{
	struct stat st;

	return stat(path, &st) ? 0 : (uint64_t)st.st_size;
}

static void fail(const char *what)
{
	fprintf(stderr, "bench_h5: %s: %s\n", what, nl_diag_msg());
	exit(1);
}

int main(int argc, char **argv)
{
	const char *dir = argc > 1 ? argv[1] : "/tmp";
	uint64_t tokens = argc > 2 ? strtoull(argv[2], NULL, 10) : 10000;
	uint32_t layers = argc > 3 ? (uint32_t)atoi(argv[3]) : 32;
	uint32_t active = argc > 4 ? (uint32_t)atoi(argv[4]) : 500;
	uint32_t neurons = argc > 5 ? (uint32_t)atoi(argv[5]) : 16384;
	static const char *const codecs[] = { "none", "zstd", "zstd:1", "deflate:1" };
	double write_base = 0, read_base = 0;
	uint32_t **ids = calloc(layers, sizeof(*ids)), *n_active = calloc(layers, sizeof(uint32_t));
	char path[512];
	uint64_t state = 1;

	for (uint32_t l = 0; l < layers; l++)
		ids[l] = malloc(active * sizeof(uint32_t));
	snprintf(path, sizeof(path), "%s/bench_h5_traces.h5", dir);
	printf("traces: %llu tokens x %u layers x %u active of %u neurons (%.0f MiB of indices)\n",
	       (unsigned long long)tokens, layers, active, neurons,
	       (double)tokens * layers * active * 4 / (1 << 20));
	printf("%-10s %10s %8s %10s %8s %10s %8s\n", "codec", "write s", "ratio", "read s", "ratio",
	       "MiB", "bytes/id");
	for (size_t c = 0; c < sizeof(codecs) / sizeof(codecs[0]); c++) {
		struct nl_trace_meta meta;

		if (argc > 6 && c > 0 && strcmp(codecs[c], argv[6]))
			continue;
		struct nl_trace_writer *w;
		struct nl_trace_reader *r;
		struct nl_h5_opts opts;
		double t0, t_write, t_read;

		memset(&meta, 0, sizeof(meta));
		strcpy(meta.model.name, "bench");
		meta.model.n_layers = layers;
		meta.model.d_model = 64;
		meta.model.n_neurons = neurons;
		strcpy(meta.dataset, "synthetic");
		if (nl_h5_opts_parse(&opts, codecs[c]))
			fail("opts");
		t0 = now();
		if (nl_trace_create(&w, path, &meta, &opts))
			fail("create");
		for (uint64_t t = 0; t < tokens; t++) {
			for (uint32_t l = 0; l < layers; l++) {
				/* sorted ids: a random start then random gaps averaging n/active */
				uint32_t id = (uint32_t)(state % 16);

				n_active[l] = 0;
				for (uint32_t i = 0; i < active && id < neurons; i++) {
					state = state * 6364136223846793005ull + 1442695040888963407ull;
					ids[l][n_active[l]++] = id;
					id += 1 + (uint32_t)((state >> 33) % (2 * neurons / active - 1));
				}
			}
			if (nl_trace_append(w, (const uint32_t *const *)ids, n_active, (uint32_t)t))
				fail("append");
		}
		if (nl_trace_finish(w, NULL))
			fail("finish");
		t_write = now() - t0;
		t0 = now();
		if (nl_trace_open(&r, path))
			fail("open");
		for (uint32_t l = 0; l < layers; l++) {
			struct nl_csr csr;

			if (nl_trace_read_layer(r, l, &csr))
				fail("read");
			nl_csr_free(&csr);
		}
		nl_trace_close(r);
		t_read = now() - t0;
		if (c == 0) {
			write_base = t_write;
			read_base = t_read;
		}
		printf("%-10s %10.2f %8.2f %10.2f %8.2f %10.1f %8.2f\n", codecs[c], t_write,
		       t_write / write_base, t_read, t_read / read_base,
		       file_size(path) / 1048576.0,
		       (double)file_size(path) / ((double)tokens * layers * active));
	}
	remove(path);

	/* one co-activation layer with the full triangle */
	if (argc <= 6) {
		struct nl_coact_meta meta = { .layer_first = 0, .layer_count = 1, .n_tokens = 1000000,
					      .has_pairs = true, .k = 0 };
		struct nl_coact_layer stats = { .n_neurons = neurons, .n_tokens = 1000000 }, back;
		struct nl_coact_writer *w;
		struct nl_coact_reader *r;
		uint64_t tri = nl_tri_size(neurons);
		double t0, t_write, t_read;

		printf("\ncoact: one layer, %u neurons, pairs = %llu u32 (%.0f MiB)\n", neurons,
		       (unsigned long long)tri, tri * 4.0 / (1 << 20));
		printf("%-10s %10s %10s %10s\n", "codec", "write s", "read s", "MiB");
		strcpy(meta.model.name, "bench");
		meta.model.n_layers = 1;
		meta.model.d_model = 64;
		meta.model.n_neurons = neurons;
		stats.count = malloc(neurons * sizeof(uint64_t));
		stats.pairs = malloc(tri * sizeof(uint32_t));
		for (uint32_t i = 0; i < neurons; i++)
			stats.count[i] = 500000;
		for (uint64_t p = 0; p < tri; p++) {
			state = state * 6364136223846793005ull + 1442695040888963407ull;
			stats.pairs[p] = (uint32_t)((state >> 40) % 5000);
		}
		for (size_t c = 0; c < 2; c++) {
			struct nl_h5_opts opts;

			snprintf(path, sizeof(path), "%s/bench_h5_coact.h5", dir);
			nl_h5_opts_parse(&opts, c ? "zstd" : "none");
			t0 = now();
			if (nl_coact_create(&w, path, &meta, &opts) || nl_coact_write_layer(w, 0, &stats) ||
			    nl_coact_finish(w))
				fail("coact write");
			t_write = now() - t0;
			t0 = now();
			if (nl_coact_open(&r, path) || nl_coact_read_layer(r, 0, true, &back))
				fail("coact read");
			t_read = now() - t0;
			if (memcmp(back.pairs, stats.pairs, tri * 4))
				fail("coact mismatch");
			nl_coact_layer_free(&back);
			nl_coact_close(r);
			printf("%-10s %10.2f %10.2f %10.1f\n", c ? "zstd" : "none", t_write, t_read,
			       file_size(path) / 1048576.0);
			remove(path);
		}
		free(stats.count);
		free(stats.pairs);
	}
	for (uint32_t l = 0; l < layers; l++)
		free(ids[l]);
	free(ids);
	free(n_active);
	return 0;
}
