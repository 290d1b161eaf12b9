/*
 * libFuzzer target for the .nlimg parser (header and section table) and the
 * in-memory reader built on it. Each input is tried as is (so the checksum
 * checks are fuzzed) and again after tu_reseal() has recomputed every
 * checksum (so the mutations reach the field and layout validation behind
 * them). Any accepted image must satisfy the invariants asserted below.
 *
 * Built as a fuzzer only with -Dfuzz=true and clang (tests/fuzz.sh image);
 * tests/fuzz_replay_main.c turns it into an ordinary test over tests/image/corpus/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "img_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond) do { if (!(cond)) __builtin_trap(); } while (0)

static void exercise_info(const struct nl_img_info *info, uint64_t file_size)
{
	uint64_t bb = nl_img_bundle_bytes(&info->config);

	for (uint32_t i = 0; i < info->n_sections; i++) {
		const struct nl_img_section *s = &info->sections[i];

		CHECK(s->offset <= file_size && s->length <= file_size - s->offset);
		CHECK(s->offset >= NL_IMG_HEADER_SIZE + (uint64_t)info->n_sections * NL_IMG_ENTRY_SIZE);
		if (s->kind == NL_IMG_SEC_FFN) {
			CHECK(s->offset % NL_IMG_FFN_ALIGN == 0);
			CHECK(s->length == bb * info->config.hidden_dim);
		}
	}
	for (uint32_t l = 0; l < info->config.n_layers; l++) {
		CHECK(info->ffn[l] < info->n_sections);
		CHECK(info->placement[l] < info->n_sections);
	}
}

static void exercise_open(const uint8_t *buf, size_t size)
{
	struct nl_img *img;
	const struct nl_img_config *c;
	uint8_t scratch[4096];
	uint64_t off, len, bad;

	if (nl_img_open_mem(&img, buf, size, "fuzz"))
		return;
	c = nl_img_get_config(img);
	exercise_info(nl_img_get_info(img), size);
	nl_img_verify_all(img, &bad);
	for (uint32_t l = 0; l < c->n_layers; l++) {
		const uint32_t *perm = nl_img_placement(img, l), *pos = nl_img_position(img, l);

		CHECK(perm && pos);
		for (uint32_t p = 0; p < c->hidden_dim; p++)
			CHECK(perm[p] < c->hidden_dim && pos[perm[p]] == p);
		CHECK(nl_img_bundle_range(img, l, 0, c->hidden_dim, &off, &len) == 0);
		CHECK(off <= size && len <= size - off);
		if (nl_img_bundle_bytes(c) <= sizeof(scratch))
			CHECK(nl_img_read_bundles(img, l, c->hidden_dim - 1, 1, scratch) == 0);
	}
	nl_img_close(img);
}

static void exercise(const uint8_t *buf, size_t size)
{
	struct nl_img_info info;

	if (nl_img_parse(buf, size, size, "fuzz", &info) == 0) {
		exercise_info(&info, size);
		nl_img_info_free(&info);
	}
	/* As the prefix of a larger file: the layout rules without the data. */
	if (size >= 24) {
		uint64_t declared = tu_ld64(buf + 16);

		if (declared > size && declared < (1ull << 40) &&
		    nl_img_parse(buf, size, declared, "fuzz", &info) == 0) {
			exercise_info(&info, declared);
			nl_img_info_free(&info);
		}
	}
	exercise_open(buf, size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *copy = malloc(size ? size : 1);

	if (!copy)
		return 0;
	/* A private copy: the reader must never depend on writable input. */
	memcpy(copy, data, size);
	exercise(copy, size);
	tu_reseal(copy, size);
	exercise(copy, size);
	free(copy);
	return 0;
}
