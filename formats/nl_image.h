/*
 * The flash image ".nlimg": one file holding a model laid out for inference
 * from flash (Neuralink section 5). Dense weights (embeddings, attention,
 * norms, classifier) live in one section the runtime loads into DRAM; every
 * layer's FFN neurons are stored as bundles (gate row, up row, down column,
 * contiguous) in placement order, so that co-activated neurons are adjacent
 * and a run of them is one pread. The format is specified in
 * docs/formats/nlimg.md; the constants below mirror that document.
 *
 * Readers validate the header, the section table and the layout when the file
 * is opened, and the XXH3-64 checksum of every data block on request
 * (nl_img_verify_section / nl_img_verify_all). Every failure returns a project
 * error code (nl_err.h) and leaves a diagnostic naming the file, the field or
 * section, the value found and the value expected.
 */
#ifndef NL_IMAGE_H
#define NL_IMAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nl_err.h"
#include "nl_formats.h"
#include "nl_model.h"

/* "\x89NLIMG\r\n": a high byte and CR LF so text-mode transfers are detected. */
#define NL_IMG_MAGIC "\x89NLIMG\r\n"
#define NL_IMG_MAGIC_SIZE 8
#define NL_IMG_VERSION_MAJOR 1
#define NL_IMG_VERSION_MINOR 0
#define NL_IMG_HEADER_SIZE 256      /* bytes, fixed for major version 1 */
#define NL_IMG_ENTRY_SIZE 64        /* bytes per section table entry */
#define NL_IMG_FFN_ALIGN 4096       /* FFN section offsets (O_DIRECT) */
#define NL_IMG_DENSE_ALIGN 64       /* dense section offset and its tensors */
#define NL_IMG_TABLE_ALIGN 8        /* placement and checksum sections */
#define NL_IMG_BLOCK_SIZE 65536     /* default checksum block size */
#define NL_IMG_BLOCK_MIN 512
#define NL_IMG_BLOCK_MAX (1u << 30)
#define NL_IMG_MAX_SECTIONS 65536
#define NL_IMG_NO_LAYER UINT32_MAX  /* layer field of sections not tied to a layer */

/* Section kinds. Readers skip kinds they do not know (minor versions add kinds). */
enum nl_img_kind {
	NL_IMG_SEC_DENSE = 1,      /* weights kept in DRAM, layout nl_img_dense_layout() */
	NL_IMG_SEC_FFN = 2,        /* one layer's neuron bundles in placement order */
	NL_IMG_SEC_PLACEMENT = 3,  /* one layer's u32 table position -> neuron id */
	NL_IMG_SEC_CHECKSUMS = 4,  /* u64 XXH3-64 of every data block of every other section */
};

/* Element type of the weight matrices (norm vectors are always F32). */
enum nl_img_dtype {
	NL_IMG_F32 = 0,
	NL_IMG_F16 = 1,            /* IEEE 754 binary16 */
	NL_IMG_BF16 = 2,           /* upper half of binary32 */
};

/* Activation applied to the gate projection (or to up when there is no gate). */
enum nl_img_act {
	NL_IMG_ACT_SILU = 0,       /* llama: silu(gate) * up */
	NL_IMG_ACT_RELU = 1,       /* ReLU-fied models: relu(gate) * up, or relu(up) */
	NL_IMG_ACT_GELU = 2,       /* tanh approximation */
};

/* Matrices present in a bundle, stored in this order: gate row, up row, down column. */
#define NL_IMG_BUNDLE_GATE 0x1u
#define NL_IMG_BUNDLE_UP 0x2u
#define NL_IMG_BUNDLE_DOWN 0x4u
#define NL_IMG_BUNDLE_ALL (NL_IMG_BUNDLE_GATE | NL_IMG_BUNDLE_UP | NL_IMG_BUNDLE_DOWN)

/* The model an image holds (header fields). */
struct nl_img_config {
	uint32_t dim;              /* d_model */
	uint32_t hidden_dim;       /* FFN neurons per layer = bundles per FFN section */
	uint32_t n_layers;
	uint32_t n_heads;
	uint32_t n_kv_heads;
	uint32_t vocab_size;
	uint32_t seq_len;
	float rms_eps;
	float rope_theta;
	bool shared_classifier;    /* no classifier tensor; the token embedding is used */
	enum nl_img_act act;
	enum nl_img_dtype dtype;
	uint32_t bundle_flags;     /* NL_IMG_BUNDLE_*; UP and DOWN are required */
	char name[NL_NAME_MAX];    /* model name, at most NL_NAME_MAX - 1 bytes */
};

/*
 * Fills an image configuration from a checkpoint's (llama: SiLU, gated
 * bundles) with matrices stored as dtype.
 */
void nl_img_config_from_model(struct nl_img_config *config, const struct nl_model_config *model,
			      enum nl_img_dtype dtype);
/* Checks every field (ranges, divisibility); NL_E_INVAL with a diagnostic. */
int nl_img_config_check(const struct nl_img_config *config);
/* Bytes per element of dtype: 4 or 2; 0 for an unknown type. */
uint32_t nl_img_dtype_size(enum nl_img_dtype dtype);
/* Bytes per bundle: (matrices in bundle_flags) * dim * element size. */
uint64_t nl_img_bundle_bytes(const struct nl_img_config *config);

/*
 * Byte offsets of the tensors inside the dense section. Tensors are stored in
 * this order, each starting at a multiple of NL_IMG_DENSE_ALIGN (zero padding):
 * token_embedding [vocab, dim]; per layer attn_norm [dim] (F32), wq [dim, dim],
 * wk [kv_dim, dim], wv [kv_dim, dim], wo [dim, dim], ffn_norm [dim] (F32);
 * final_norm [dim] (F32); classifier [vocab, dim] unless shared.
 * Matrices are row-major [out, in] in the image's dtype.
 */
struct nl_img_dense_layout {
	uint64_t token_embedding;
	uint64_t layers;           /* start of layer 0 */
	uint64_t layer_stride;     /* layer l starts at layers + l * layer_stride */
	uint64_t attn_norm, wq, wk, wv, wo, ffn_norm; /* relative to the layer's start */
	uint64_t final_norm;
	uint64_t classifier;       /* == token_embedding when shared */
	uint64_t size;             /* the dense section's length */
};
int nl_img_dense_layout(const struct nl_img_config *config, struct nl_img_dense_layout *out);

/* F32 <-> dtype, little-endian, round to nearest even; n elements. */
void nl_img_encode(enum nl_img_dtype dtype, void *dst, const float *src, size_t n);
void nl_img_decode(enum nl_img_dtype dtype, float *dst, const void *src, size_t n);

/*
 * Builders for the packer, from F32 weights in llama2.c layout (nl_model.h).
 * nl_img_pack_dense fills dst[layout.size] (padding zeroed).
 * nl_img_pack_bundle writes neuron `neuron`'s bundle (bundle_bytes) from
 * w_gate/w_up [hidden, dim] rows and w_down [dim, hidden] column; w_gate is
 * ignored when the bundle has no gate.
 */
int nl_img_pack_dense(const struct nl_img_config *config, const struct nl_model_weights *weights,
		      void *dst, uint64_t size);
void nl_img_pack_bundle(const struct nl_img_config *config, const float *w_gate,
			const float *w_up, const float *w_down, uint32_t neuron, void *dst);

/* ---- writer ---- */

struct nl_img_writer;

/*
 * Creates "<path>.tmp" for an image of config; block_size 0 means
 * NL_IMG_BLOCK_SIZE, otherwise a power of two in [NL_IMG_BLOCK_MIN,
 * NL_IMG_BLOCK_MAX]. The dense blob and every layer are then added once each,
 * in any order (sections are laid out in the order they are added).
 */
int nl_img_create(struct nl_img_writer **out, const char *path,
		  const struct nl_img_config *config, uint32_t block_size);
/* The dense section: size must be nl_img_dense_layout().size. */
int nl_img_add_dense(struct nl_img_writer *w, const void *blob, uint64_t size);
/*
 * The dense section in parts, for models whose dense weights are not held in
 * one buffer: consecutive calls append to it, and it is complete when
 * nl_img_dense_layout().size bytes were written (more is NL_E_INVAL). No
 * other section may be added while it is incomplete.
 */
int nl_img_write_dense(struct nl_img_writer *w, const void *part, uint64_t size);
/*
 * One layer's FFN section: bundles holds hidden_dim bundles in placement order
 * (bundle p is neuron perm[p]), size = hidden_dim * bundle_bytes. perm is a
 * permutation of 0..hidden_dim-1 and is stored as the layer's placement table.
 */
int nl_img_add_ffn_layer(struct nl_img_writer *w, uint32_t layer, const uint32_t *perm,
			 const void *bundles, uint64_t size);
/*
 * Writes the placement tables, the checksums, the section table and the
 * header, fsyncs and renames onto the final path. Fails (and removes the
 * temporary file) when a section is missing. Frees w in all cases.
 */
int nl_img_finish(struct nl_img_writer *w);
/* Removes the temporary file and frees w. Accepts NULL. */
void nl_img_abort(struct nl_img_writer *w);

/* ---- parser of the header and section table ---- */

struct nl_img_section {
	uint32_t index;            /* position in the section table */
	uint32_t kind;             /* enum nl_img_kind, or a kind this reader does not know */
	uint32_t layer;            /* NL_IMG_NO_LAYER when not tied to a layer */
	uint64_t offset;           /* from the start of the file */
	uint64_t length;           /* bytes */
	uint32_t flags;            /* kind-specific (FFN: NL_IMG_BUNDLE_*) */
	uint32_t stride;           /* bytes per item (FFN: bundle bytes), 0 when unused */
	uint64_t count;            /* items (FFN: bundles), 0 when unused */
	uint64_t csum_first;       /* index of the section's first block checksum */
};

struct nl_img_info {
	uint16_t major, minor;
	uint64_t file_size;
	uint32_t block_size;
	struct nl_img_config config;
	uint64_t checksums_hash;   /* header field: XXH3-64 of the checksum section */
	uint32_t n_sections;
	struct nl_img_section *sections; /* [n_sections], owned */
	uint64_t n_blocks;         /* data blocks covered by the checksum section */
	uint32_t dense, checksums; /* table indices of those sections */
	uint32_t *ffn;             /* [n_layers] table index of each layer's FFN section */
	uint32_t *placement;       /* [n_layers] table index of each layer's placement */
};

/*
 * Parses and validates the header and the section table held in buf[len]
 * (the first len bytes of a file of file_size bytes): magic, version,
 * checksums, reserved fields, configuration, and the layout rules of the
 * spec's "readers MUST verify" list that need no data bytes. name is used in
 * diagnostics. Pure: no I/O. On success fills *out (free with
 * nl_img_info_free); on failure *out is zeroed.
 */
int nl_img_parse(const void *buf, size_t len, uint64_t file_size, const char *name,
		 struct nl_img_info *out);
void nl_img_info_free(struct nl_img_info *info);

/* ---- reader ---- */

struct nl_img;

/*
 * Opens an image: nl_img_parse() on its header and table, then loads and
 * checks the checksum section (against the header) and the placement tables
 * (block checksums, each a permutation). FFN and dense data are not read.
 */
int nl_img_open(struct nl_img **out, const char *path);
/* The same on a file held in memory; buf must outlive the handle. */
int nl_img_open_mem(struct nl_img **out, const void *buf, size_t len, const char *name);
void nl_img_close(struct nl_img *img);   /* accepts NULL */

const struct nl_img_info *nl_img_get_info(const struct nl_img *img);
const struct nl_img_config *nl_img_get_config(const struct nl_img *img);
/* The file descriptor (O_RDONLY) for the caller's own preads; -1 for memory images. */
int nl_img_fd(const struct nl_img *img);

/* First section of kind (and layer, NL_IMG_NO_LAYER for none); NL_E_MISSING when absent. */
int nl_img_find_section(const struct nl_img *img, uint32_t kind, uint32_t layer,
			struct nl_img_section *out);
/* Layer's placement table [hidden_dim] position -> neuron id; NULL when out of range. */
const uint32_t *nl_img_placement(const struct nl_img *img, uint32_t layer);
/* Its inverse [hidden_dim] neuron id -> position; NULL when out of range. */
const uint32_t *nl_img_position(const struct nl_img *img, uint32_t layer);
/*
 * File range of bundles [first, first + count) of layer: one pread of
 * *length bytes at *offset. NL_E_INVAL when out of range.
 */
int nl_img_bundle_range(const struct nl_img *img, uint32_t layer, uint32_t first, uint32_t count,
			uint64_t *offset, uint64_t *length);

/* Reads len bytes at offset (within the file) into buf; short reads are errors. */
int nl_img_read(struct nl_img *img, uint64_t offset, void *buf, uint64_t len);
/* Reads bundles [first, first + count) of layer into buf (count * bundle_bytes). */
int nl_img_read_bundles(struct nl_img *img, uint32_t layer, uint32_t first, uint32_t count,
			void *buf);

/*
 * Checks the XXH3-64 checksum of every block of section index (for the
 * checksum section: its hash in the header). On NL_E_CHECKSUM the diagnostic
 * names the file, the section, the block and its file offset, which is also
 * stored in *bad_offset (may be NULL).
 */
int nl_img_verify_section(struct nl_img *img, uint32_t index, uint64_t *bad_offset);
/* nl_img_verify_section on every section, in table order; stops at the first failure. */
int nl_img_verify_all(struct nl_img *img, uint64_t *bad_offset);

/* "dense", "ffn", "placement", "checksums" or "unknown". */
const char *nl_img_kind_name(uint32_t kind);

#endif
