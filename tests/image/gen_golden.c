/*
 * Regenerates the .nlimg golden files:
 *   tests/golden/ok/nlimg/      images every reader must accept (+ MANIFEST)
 *   tests/golden/reject/nlimg/  images that each break exactly one rule of the
 *                               spec's "readers MUST verify" list (+ MANIFEST)
 * Built with the tests, never run by them. Usage:
 *   build/tests/image/gen_nlimg_golden tests/golden
 * Each reject file starts from the tiny base image, changes one thing and, unless
 * the rule under test is a checksum, recomputes every checksum (tu_reseal) so
 * that only the intended rule is broken.
 *
 * MANIFEST lines: file <TAB> expected code <TAB> stage <TAB> text the
 * diagnostic must contain. stage "open" means nl_img_open() must fail with the
 * code; "verify" means open succeeds and nl_img_verify_all() fails with it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "img_util.h"

static char ok_dir[4096], reject_dir[4096];
static FILE *manifest;
static uint8_t *base, *work;
static size_t base_len, work_len;
static int failures;

/* Table indices of the base image (the writer's order). */
enum { DENSE, FFN0, FFN1, PL0, PL1, CS, N_SECTIONS };

static uint8_t *fresh(void)
{
	memcpy(work, base, base_len);
	work_len = base_len;
	return work;
}

static uint64_t sec_off(uint32_t i)
{
	return tu_ld64(tu_entry(base, i) + 8);
}

static uint64_t sec_len(uint32_t i)
{
	return tu_ld64(tu_entry(base, i) + 16);
}

static void emit(const char *name, const char *code, const char *stage, const char *expect)
{
	char path[8192];
	int ret;

	snprintf(path, sizeof(path), "%s/%s", reject_dir, name);
	ret = tu_write_file(path, work, work_len);
	if (ret) {
		fprintf(stderr, "gen: cannot write '%s': %s\n", path, strerror(-ret));
		failures++;
	}
	fprintf(manifest, "%s\t%s\t%s\t%s\n", name, code, stage, expect);
}

/* Writes a 32/64-bit field of entry i, then reseals everything. */
static void set_e32(uint32_t i, int field, uint32_t v)
{
	tu_st32(tu_entry(work, i) + field, v);
	tu_reseal(work, work_len);
}

static void set_e64(uint32_t i, int field, uint64_t v)
{
	tu_st64(tu_entry(work, i) + field, v);
	tu_reseal(work, work_len);
}

static void set_h32(int off, uint32_t v)
{
	tu_st32(work + off, v);
	tu_reseal(work, work_len);
}

static void set_h8(int off, uint8_t v)
{
	work[off] = v;
	tu_reseal(work, work_len);
}

static void write_ok(const char *name, const char *what, const uint8_t *buf, size_t len,
		     FILE *ok_manifest)
{
	char path[8192];

	snprintf(path, sizeof(path), "%s/%s", ok_dir, name);
	if (buf && tu_write_file(path, buf, len)) {
		fprintf(stderr, "gen: cannot write '%s'\n", path);
		failures++;
	}
	fprintf(ok_manifest, "%s\t%s\n", name, what);
}

static int make_ok_image(const char *name, const struct nl_img_config *c, uint32_t block_size,
			 uint64_t seed)
{
	struct tu_model m;
	char path[8192];
	int ret;

	snprintf(path, sizeof(path), "%s/%s", ok_dir, name);
	ret = tu_model_make(&m, c, seed);
	if (ret)
		return ret;
	ret = tu_write_image(path, c, block_size, &m);
	tu_model_free(&m, c);
	if (ret)
		fprintf(stderr, "gen: '%s': %s\n", path, nl_diag_msg());
	return ret;
}

/* The base image with one extra section of a kind no reader knows (minor 1). */
static void make_unknown_section(FILE *ok_manifest)
{
	const uint64_t shift = 4096, unk_len = 100;
	uint64_t cs_off = sec_off(CS) + shift, cs_len = sec_len(CS) + 8;
	uint64_t unk_off = (cs_off + cs_len + 63) / 64 * 64, size = unk_off + unk_len;
	uint64_t n_blocks = sec_len(CS) / 8;
	uint8_t *buf = calloc(1, size);

	memcpy(buf, base, 256);
	memcpy(buf + 256 + 4096, base + 256 + 6 * 64, base_len - 256 - 6 * 64);
	for (uint32_t i = 0; i < N_SECTIONS; i++) {
		uint32_t slot = i == CS ? 6 : i;

		memcpy(tu_entry(buf, slot), tu_entry(base, i), 64);
		tu_st64(tu_entry(buf, slot) + 8, sec_off(i) + shift);
	}
	/* Data moved by shift (the whole region after the old table). */
	memset(buf + 256 + 7 * 64, 0, shift + 6 * 64 - 7 * 64);
	memcpy(buf + 6 * 64 + 256 + shift, base + 6 * 64 + 256, base_len - 256 - 6 * 64);
	tu_st32(tu_entry(buf, 5) + 0, 0x1000);              /* kind */
	tu_st32(tu_entry(buf, 5) + 4, NL_IMG_NO_LAYER);
	tu_st64(tu_entry(buf, 5) + 8, unk_off);
	tu_st64(tu_entry(buf, 5) + 16, unk_len);
	tu_st32(tu_entry(buf, 5) + 24, 0xabc);              /* flags of the unknown kind */
	tu_st32(tu_entry(buf, 5) + 28, 3);
	tu_st64(tu_entry(buf, 5) + 32, 33);
	tu_st64(tu_entry(buf, 5) + 40, n_blocks);
	memset(tu_entry(buf, 5) + 48, 0, 16);
	for (uint64_t i = 0; i < unk_len; i++)
		buf[unk_off + i] = (uint8_t)(i * 7 + 1);
	tu_st64(tu_entry(buf, 6) + 16, cs_len);
	tu_st64(tu_entry(buf, 6) + 32, n_blocks + 1);
	tu_st16(buf + 10, 1);                                /* minor 1 */
	tu_st32(buf + 32, 7);                                /* section_count */
	tu_st64(buf + 16, size);                             /* file_size */
	tu_reseal(buf, size);
	write_ok("minor1-unknown-section.nlimg",
		 "minor version 1 with a section of unknown kind 0x1000: skipped, still checksummed",
		 buf, size, ok_manifest);
	free(buf);
}

int main(int argc, char **argv)
{
	struct nl_img_config c;
	char path[8192], expect[256];
	FILE *ok_manifest;
	uint64_t off;

	if (argc != 2) {
		fprintf(stderr, "usage: %s GOLDEN_DIR   (e.g. tests/golden)\n", argv[0]);
		return 2;
	}
	snprintf(ok_dir, sizeof(ok_dir), "%s/ok/nlimg", argv[1]);
	snprintf(reject_dir, sizeof(reject_dir), "%s/reject/nlimg", argv[1]);
	snprintf(path, sizeof(path), "%s/MANIFEST", ok_dir);
	ok_manifest = fopen(path, "w");
	snprintf(path, sizeof(path), "%s/MANIFEST", reject_dir);
	manifest = fopen(path, "w");
	if (!ok_manifest || !manifest) {
		fprintf(stderr, "gen: cannot write the MANIFEST files under '%s': %s\n", argv[1],
			strerror(errno));
		return 1;
	}
	fprintf(ok_manifest, "# Generated by tests/image/gen_golden.c: images that must open and verify.\n"
		"# file\twhat it covers\n");
	fprintf(manifest, "# Generated by tests/image/gen_golden.c: each file breaks one rule.\n"
		"# file\texpected code\tstage (open|verify)\ttext the diagnostic must contain\n");

	/* ---- accepted images ---- */
	tu_tiny_config(&c);
	if (make_ok_image("base.nlimg", &c, 512, 1))
		return 1;
	write_ok("base.nlimg", "tiny F32 SiLU model, gated bundles, 2 layers, 512-byte blocks",
		 NULL, 0, ok_manifest);
	c.dtype = NL_IMG_F16;
	c.act = NL_IMG_ACT_RELU;
	c.bundle_flags = NL_IMG_BUNDLE_UP | NL_IMG_BUNDLE_DOWN;
	snprintf(c.name, sizeof(c.name), "tiny-relu-nogate");
	if (make_ok_image("relu-nogate-f16.nlimg", &c, 1024, 2))
		return 1;
	write_ok("relu-nogate-f16.nlimg", "F16 ReLU model without gate: bundles of up row + down column",
		 NULL, 0, ok_manifest);
	tu_tiny_config(&c);
	c.dtype = NL_IMG_BF16;
	c.shared_classifier = true;
	c.n_kv_heads = 2;
	snprintf(c.name, sizeof(c.name), "tiny-bf16-shared");
	if (make_ok_image("bf16-shared.nlimg", &c, 65536, 3))
		return 1;
	write_ok("bf16-shared.nlimg", "BF16, shared classifier, default 64 KiB blocks",
		 NULL, 0, ok_manifest);

	snprintf(path, sizeof(path), "%s/base.nlimg", ok_dir);
	base = tu_read_file(path, &base_len);
	if (!base || tu_ld32(base + 32) != N_SECTIONS) {
		fprintf(stderr, "gen: cannot read back '%s'\n", path);
		return 1;
	}
	work = calloc(1, base_len + 8192);
	make_unknown_section(ok_manifest);

	/* ---- truncation ---- */
	fresh(); work_len = 0;
	emit("trunc-empty.nlimg", "NL_E_TRUNCATED", "open", "shorter than the 8-byte magic");
	fresh(); work_len = 5;
	emit("trunc-in-magic.nlimg", "NL_E_TRUNCATED", "open", "shorter than the 8-byte magic");
	fresh(); work_len = 10;
	emit("trunc-in-version.nlimg", "NL_E_TRUNCATED", "open", "inside the version field");
	fresh(); work_len = 100;
	emit("trunc-in-header.nlimg", "NL_E_TRUNCATED", "open", "shorter than the 256-byte header");
	fresh(); work_len = 256 + 3 * 64 + 10;
	emit("trunc-in-table.nlimg", "NL_E_TRUNCATED", "open", "header field 'file_size' says");
	fresh(); work_len = (size_t)(sec_off(FFN0) + 700);
	emit("trunc-in-ffn.nlimg", "NL_E_TRUNCATED", "open", "header field 'file_size' says");
	fresh(); work_len = base_len - 1;
	emit("trunc-last-byte.nlimg", "NL_E_TRUNCATED", "open", "header field 'file_size' says");
	fresh(); work[base_len] = 0; work_len = base_len + 1;
	emit("trailing-bytes.nlimg", "NL_E_FORMAT", "open", "trailing bytes");

	/* ---- magic and version ---- */
	fresh(); work[1] = 'X';
	emit("bad-magic.nlimg", "NL_E_MAGIC", "open", "not an .nlimg image");
	fresh(); memcpy(work, "GGUF", 4); work_len = 4;
	emit("short-other-file.nlimg", "NL_E_MAGIC", "open", "not an .nlimg image");
	fresh(); tu_st16(work + 8, 2); tu_reseal(work, work_len);
	emit("version-major-2.nlimg", "NL_E_VERSION", "open", "'major' is 2");
	fresh(); tu_st16(work + 8, 0); tu_reseal(work, work_len);
	emit("version-major-0.nlimg", "NL_E_VERSION", "open", "'major' is 0");

	/* ---- checksums ---- */
	fresh(); work[48] ^= 0x01;
	emit("bad-header-checksum.nlimg", "NL_E_CHECKSUM", "open", "header checksum mismatch");
	fresh(); work[256 + FFN1 * 64 + 8] ^= 0x40;
	emit("bad-table-checksum.nlimg", "NL_E_CHECKSUM", "open", "section table checksum mismatch");
	fresh(); work[sec_off(CS) + 17] ^= 0x01;
	emit("bad-checksum-section.nlimg", "NL_E_CHECKSUM", "open", "section 5 (checksums, kind 4) checksum mismatch");
	fresh(); work[sec_off(PL1) + 5] ^= 0x01;
	snprintf(expect, sizeof(expect), "section 4 (placement, kind 3, layer 1) checksum mismatch in block 0 at offset 0x%llx",
		 (unsigned long long)sec_off(PL1));
	emit("bad-placement-data.nlimg", "NL_E_CHECKSUM", "open", expect);
	off = sec_off(DENSE) + 2 * 512 + 77;
	fresh(); work[off] ^= 0x80;
	snprintf(expect, sizeof(expect), "section 0 (dense, kind 1) checksum mismatch in block 2 at offset 0x%llx",
		 (unsigned long long)(sec_off(DENSE) + 2 * 512));
	emit("bad-dense-data.nlimg", "NL_E_CHECKSUM", "verify", expect);
	off = sec_off(FFN1) + 512 + 300;
	fresh(); work[off] ^= 0x01;
	snprintf(expect, sizeof(expect), "section 2 (ffn, kind 2, layer 1) checksum mismatch in block 1 at offset 0x%llx",
		 (unsigned long long)(sec_off(FFN1) + 512));
	emit("bad-ffn-data.nlimg", "NL_E_CHECKSUM", "verify", expect);
	off = sec_off(FFN0) + sec_len(FFN0) - 1;
	fresh(); work[off] ^= 0x01;
	snprintf(expect, sizeof(expect), "section 1 (ffn, kind 2, layer 0) checksum mismatch in block 2 at offset 0x%llx",
		 (unsigned long long)(sec_off(FFN0) + 1024));
	emit("bad-ffn-last-byte.nlimg", "NL_E_CHECKSUM", "verify", expect);

	/* ---- header fields ---- */
	fresh(); set_h32(12, 512);
	emit("header-size.nlimg", "NL_E_FORMAT", "open", "'header_size' is 512");
	fresh(); tu_st64(work + 24, 320); tu_reseal(work, work_len);
	emit("table-offset.nlimg", "NL_E_FORMAT", "open", "'table_offset' is 320");
	fresh(); set_h32(36, 48);
	emit("entry-size.nlimg", "NL_E_FORMAT", "open", "'entry_size' is 48");
	fresh(); set_h32(40, 1000);
	emit("block-size-not-pow2.nlimg", "NL_E_FORMAT", "open", "'block_size' is 1000");
	fresh(); set_h32(40, 256);
	emit("block-size-too-small.nlimg", "NL_E_FORMAT", "open", "'block_size' is 256");
	fresh(); set_h8(87, 1);
	emit("reserved-header-87.nlimg", "NL_E_RESERVED", "open", "reserved header bytes");
	fresh(); set_h8(230, 0x10);
	emit("reserved-header-230.nlimg", "NL_E_RESERVED", "open", "reserved header bytes");
	fresh(); set_h8(86, 7);
	emit("dtype-unknown.nlimg", "NL_E_TYPE", "open", "'dtype' is 7");
	fresh(); set_h8(85, 3);
	emit("act-unknown.nlimg", "NL_E_FORMAT", "open", "'act' is 3");
	fresh(); set_h8(84, 2);
	emit("shared-not-bool.nlimg", "NL_E_FORMAT", "open", "'shared_classifier' is 2");
	fresh(); memset(work + 88, 'a', 128); tu_reseal(work, work_len);
	emit("name-unterminated.nlimg", "NL_E_FORMAT", "open", "'name' is not NUL-terminated");
	fresh(); work[88 + 100] = 'z'; tu_reseal(work, work_len);
	emit("name-garbage-after-nul.nlimg", "NL_E_FORMAT", "open", "'name' is not NUL-terminated and zero-padded");
	fresh(); set_h32(48, 0);
	emit("dim-zero.nlimg", "NL_E_FORMAT", "open", "'dim' is 0");
	fresh(); set_h32(52, 0);
	emit("hidden-dim-zero.nlimg", "NL_E_FORMAT", "open", "'hidden_dim' is 0");
	fresh(); set_h32(56, 0);
	emit("n-layers-zero.nlimg", "NL_E_FORMAT", "open", "'n_layers' is 0");
	fresh(); set_h32(56, 5000);
	emit("n-layers-huge.nlimg", "NL_E_FORMAT", "open", "'n_layers' is 5000");
	fresh(); set_h32(60, 3);
	emit("heads-not-divisor.nlimg", "NL_E_FORMAT", "open", "not a multiple of n_heads 3");
	fresh(); set_h32(64, 3);
	emit("kv-heads-above-heads.nlimg", "NL_E_FORMAT", "open", "'n_kv_heads' is 3");
	fresh(); set_h32(68, 0);
	emit("vocab-zero.nlimg", "NL_E_FORMAT", "open", "'vocab_size' is 0");
	fresh(); set_h32(72, 0);
	emit("seq-len-zero.nlimg", "NL_E_FORMAT", "open", "'seq_len' is 0");
	fresh(); set_h32(76, 0x7fc00000);
	emit("rms-eps-nan.nlimg", "NL_E_FORMAT", "open", "'rms_eps' is nan");
	fresh(); set_h32(80, 0xc0000000);
	emit("rope-theta-negative.nlimg", "NL_E_FORMAT", "open", "'rope_theta' is -2");
	fresh(); set_h32(44, NL_IMG_BUNDLE_GATE | NL_IMG_BUNDLE_UP);
	emit("bundle-flags-no-down.nlimg", "NL_E_FORMAT", "open", "'bundle_flags' is 0x3");
	fresh(); set_h32(44, 0xf);
	emit("bundle-flags-unknown-bit.nlimg", "NL_E_FORMAT", "open", "'bundle_flags' is 0xf");
	fresh(); set_h32(32, 5);
	emit("section-count-too-small.nlimg", "NL_E_FORMAT", "open", "'section_count' is 5");
	fresh(); set_h32(32, 100000);
	emit("section-count-too-large.nlimg", "NL_E_FORMAT", "open", "'section_count' is 100000");
	fresh(); set_h32(32, 200);
	emit("table-beyond-eof.nlimg", "NL_E_FORMAT", "open", "section table of 200 entries ends at 13056, beyond the end of the file");
	/* Layout depends on the configuration: a bigger dim makes every size wrong. */
	fresh(); set_h32(48, 16);
	emit("config-inconsistent-dim.nlimg", "NL_E_SHAPE", "open", "section 0 (dense, kind 1) field 'length' is 2368, expected");

	/* ---- section table entries ---- */
	fresh(); work[256 + PL0 * 64 + 50] = 1; tu_reseal(work, work_len);
	emit("reserved-entry.nlimg", "NL_E_RESERVED", "open", "section 3 (placement, kind 3, layer 0) reserved bytes");
	fresh(); set_e32(FFN0, 0, 0);
	emit("kind-zero.nlimg", "NL_E_FORMAT", "open", "has kind 0");
	fresh(); set_e64(FFN1, 8, base_len + 4096 * 4);
	emit("section-beyond-eof.nlimg", "NL_E_FORMAT", "open", "section 2 (ffn, kind 2, layer 1) spans");
	fresh(); set_e64(FFN1, 16, 1ull << 40);
	emit("section-length-beyond-eof.nlimg", "NL_E_FORMAT", "open", "beyond the end of the file");
	fresh(); set_e64(FFN1, 8, UINT64_MAX - 4095);
	emit("section-offset-overflow.nlimg", "NL_E_FORMAT", "open", "beyond the end of the file");
	fresh(); set_e64(DENSE, 8, 256);
	emit("section-in-table.nlimg", "NL_E_FORMAT", "open", "inside the header or section table");
	fresh(); set_e64(PL1, 8, sec_off(PL0));
	emit("overlap-placement.nlimg", "NL_E_FORMAT", "open", "overlaps");
	fresh(); set_e64(DENSE, 8, sec_off(FFN0) - 2048);
	emit("overlap-dense-ffn.nlimg", "NL_E_FORMAT", "open", "section 1 (ffn, kind 2, layer 0) at 4096..5632 overlaps section 0 (dense, kind 1) at 2048..4416");
	fresh(); set_e64(FFN0, 8, sec_off(FFN0) + 64);
	emit("misaligned-ffn.nlimg", "NL_E_FORMAT", "open", "offset 4160 is not a multiple of 4096");
	fresh(); set_e64(DENSE, 8, sec_off(DENSE) + 8);
	emit("misaligned-dense.nlimg", "NL_E_FORMAT", "open", "is not a multiple of 64");
	fresh(); set_e64(PL0, 8, sec_off(PL0) + 4);
	emit("misaligned-placement.nlimg", "NL_E_FORMAT", "open", "is not a multiple of 8");
	fresh(); set_e64(CS, 8, sec_off(CS) - 4);
	emit("misaligned-checksums.nlimg", "NL_E_FORMAT", "open", "is not a multiple of 8");
	fresh(); set_e32(FFN1, 4, 2);
	emit("layer-out-of-range.nlimg", "NL_E_FORMAT", "open", "field 'layer' is 2, expected 0..1");
	fresh(); set_e32(DENSE, 4, 0);
	emit("dense-with-layer.nlimg", "NL_E_FORMAT", "open", "field 'layer' is 0, expected 0xffffffff");
	fresh(); set_e32(FFN1, 4, 0);
	emit("duplicate-ffn.nlimg", "NL_E_FORMAT", "open", "duplicates section 1");
	fresh(); set_e32(FFN1, 0, 0x2000);
	emit("missing-ffn.nlimg", "NL_E_MISSING", "open", "layer 1 has no ffn section");
	fresh(); set_e32(PL0, 0, 0x2000);
	emit("missing-placement.nlimg", "NL_E_MISSING", "open", "layer 0 has no placement section");
	fresh(); set_e32(DENSE, 0, 0x2000);
	emit("missing-dense.nlimg", "NL_E_MISSING", "open", "no dense section");
	fresh(); tu_st32(tu_entry(work, CS), 0x2000); set_e64(CS, 40, sec_len(CS) / 8);
	emit("missing-checksums.nlimg", "NL_E_MISSING", "open", "no checksum section");
	fresh(); set_e32(FFN0, 24, NL_IMG_BUNDLE_UP | NL_IMG_BUNDLE_DOWN);
	emit("ffn-flags-mismatch.nlimg", "NL_E_FORMAT", "open", "field 'flags' is 0x6, expected the header's bundle_flags 0x7");
	fresh(); set_e32(FFN0, 28, 64);
	emit("ffn-stride.nlimg", "NL_E_SHAPE", "open", "field 'stride' is 64, expected 96");
	fresh(); set_e64(FFN0, 32, 15);
	emit("ffn-count.nlimg", "NL_E_SHAPE", "open", "field 'count' is 15, expected 16");
	fresh(); set_e64(FFN0, 16, sec_len(FFN0) - 96);
	emit("ffn-length.nlimg", "NL_E_SHAPE", "open", "field 'length' is 1440, expected 1536");
	fresh(); set_e64(DENSE, 16, sec_len(DENSE) + 64);
	emit("dense-length.nlimg", "NL_E_SHAPE", "open", "field 'length' is 2432, expected 2368");
	fresh(); set_e32(DENSE, 24, 1);
	emit("dense-flags.nlimg", "NL_E_RESERVED", "open", "fields 'flags', 'stride', 'count' are 1, 0, 0, expected 0");
	fresh(); set_e32(PL1, 24, 1);
	emit("placement-flags.nlimg", "NL_E_RESERVED", "open", "field 'flags' is 0x1, expected 0");
	fresh(); set_e32(PL1, 28, 8);
	emit("placement-stride.nlimg", "NL_E_SHAPE", "open", "field 'stride' is 8, expected 4");
	fresh(); set_e64(PL1, 16, 60);
	emit("placement-length.nlimg", "NL_E_SHAPE", "open", "field 'length' is 60, expected 64");
	fresh(); set_e32(CS, 24, 4);
	emit("checksums-flags.nlimg", "NL_E_RESERVED", "open", "field 'flags' is 0x4, expected 0");
	fresh(); set_e32(CS, 28, 4);
	emit("checksums-stride.nlimg", "NL_E_SHAPE", "open", "field 'stride' is 4, expected 8");
	fresh(); set_e64(CS, 32, 12);
	emit("checksums-count.nlimg", "NL_E_SHAPE", "open", "field 'count' is 12, expected 13");
	fresh(); set_e64(CS, 16, 96);
	emit("checksums-length.nlimg", "NL_E_SHAPE", "open", "field 'length' is 96, expected 104");
	fresh(); set_e64(CS, 40, 1);
	emit("checksums-csum-first.nlimg", "NL_E_FORMAT", "open", "field 'csum_first' is 1, expected 0");
	fresh(); set_e64(FFN1, 40, 7);
	emit("csum-first-wrong.nlimg", "NL_E_FORMAT", "open", "field 'csum_first' is 7, expected 8");

	/* ---- placement tables ---- */
	fresh(); tu_st32(work + sec_off(PL0) + 4 * 3, tu_ld32(work + sec_off(PL0) + 4 * 9));
	tu_reseal(work, work_len);
	emit("placement-duplicate.nlimg", "NL_E_FORMAT", "open", "placement of layer 0 is not a permutation");
	fresh(); tu_st32(work + sec_off(PL1) + 4 * 15, 16); tu_reseal(work, work_len);
	emit("placement-out-of-range.nlimg", "NL_E_FORMAT", "open", "position 15 holds neuron 16, out of range");

	fclose(manifest);
	fclose(ok_manifest);
	free(base);
	free(work);
	return failures ? 1 : 0;
}
