/*
 * libFuzzer target for the HDF5 readers (traces, co-activation, placement):
 * the input bytes are written to a scratch file and opened and fully read
 * with each of the three readers. Any return code is fine; a crash, a hang
 * or a sanitizer report is a bug. Built with -Dfuzz=true (clang), run with
 * tests/fuzz.sh formats; replayed over the golden files by the test
 * 'formats-fuzz-corpus' (tests/fuzz_replay_main.c).
 *
 * Note: HDF5 itself (not instrumented) has known crashes on damaged files,
 * e.g. in its global-heap reader for variable-length strings, which is why
 * our writers store fixed-length strings.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nl_formats.h"

static char scratch[64];

static void read_traces(const char *path)
{
	struct nl_trace_reader *r;

	if (nl_trace_open(&r, path))
		return;
	for (uint32_t l = 0; l < nl_trace_get_meta(r)->model.n_layers; l++) {
		struct nl_csr csr;

		if (nl_trace_read_layer(r, l, &csr))
			break;
		nl_csr_free(&csr);
	}
	if (nl_trace_get_meta(r)->has_sample_ids) {
		uint32_t *ids;

		if (!nl_trace_read_sample_ids(r, &ids))
			free(ids);
	}
	nl_trace_close(r);
}

static void read_coact(const char *path)
{
	struct nl_coact_reader *r;
	const struct nl_coact_meta *m;

	if (nl_coact_open(&r, path))
		return;
	m = nl_coact_get_meta(r);
	for (uint32_t l = m->layer_first; l < m->layer_first + m->layer_count; l++) {
		struct nl_coact_layer layer;

		if (nl_coact_read_layer(r, l, m->has_pairs, &layer))
			break;
		nl_coact_layer_free(&layer);
	}
	nl_coact_close(r);
}

static void read_placement(const char *path)
{
	struct nl_placement_reader *r;
	const struct nl_placement_meta *m;

	if (nl_placement_open(&r, path))
		return;
	m = nl_placement_get_meta(r);
	for (uint32_t l = m->layer_first; l < m->layer_first + m->layer_count; l++) {
		struct nl_placement_layer layer;

		if (nl_placement_read_layer(r, l, &layer))
			break;
		nl_placement_layer_free(&layer);
	}
	nl_placement_close(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	FILE *f;

	if (!scratch[0]) {
		int fd;

		strcpy(scratch, "/tmp/nl-fuzz-h5-XXXXXX");
		fd = mkstemp(scratch);
		if (fd < 0)
			abort();
		close(fd);
	}
	f = fopen(scratch, "wb");
	if (!f)
		abort();
	if (size && fwrite(data, 1, size, f) != size)
		abort();
	fclose(f);
	read_traces(scratch);
	read_coact(scratch);
	read_placement(scratch);
	return 0;
}

/* Removes the scratch file when the process ends. */
__attribute__((destructor)) static void remove_scratch(void)
{
	if (scratch[0])
		unlink(scratch);
}
