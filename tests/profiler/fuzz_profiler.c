/*
 * libFuzzer target for the profiler's parsers of untrusted bytes: the dataset
 * readers (JSON, JSON lines, HellaSwag, ids, text) and the .npy importer.
 * The first byte picks the parser, the rest is the file. Replayed over
 * tests/profiler/corpus as an ordinary test (suite 'profiler').
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "nl_profile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const fields[] = { NULL, "a", "question,answer", "instruction,input,output" };
	char path[64];
	int fd, which;

	if (size < 1)
		return 0;
	which = data[0];
	data++;
	size--;
	fd = memfd_create("nl-fuzz", 0);
	if (fd < 0)
		return 0;
	if (size && write(fd, data, size) != (ssize_t)size) {
		close(fd);
		return 0;
	}
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	if ((which & 7) == 7) {
		struct nl_csr csr;
		struct nl_npy_info info;

		if (nl_npy_read_active(path, (which >> 3) * 0.25, &csr, &info) == 0)
			nl_csr_free(&csr);
		if (which & 0x80) {
			uint32_t *ids = NULL;
			uint64_t n = 0;

			if (nl_npy_read_sample_ids(path, &ids, &n) == 0)
				free(ids);
		}
	} else {
		struct nl_dataset_opts o = { .format = (enum nl_ds_format)((which & 7) % 6) };
		struct nl_dataset *d = NULL;

		o.fields = fields[(which >> 3) & 3];
		if (o.format == NL_DS_TEXT && (which & 0x20))
			o.separator = "<|endoftext|>";
		if (nl_dataset_open(&d, path, &o) == 0) {
			struct nl_select_opts so = { .n_samples = 3, .seed = which, .role = NL_SPLIT_TRAIN,
						     .test_fraction = 0.5 };
			uint32_t *idx = NULL;
			size_t n = 0;

			if (nl_dataset_select(d, &so, &idx, &n) == 0)
				free(idx);
			nl_dataset_free(d);
		}
	}
	close(fd);
	return 0;
}
