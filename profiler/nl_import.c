/*
 * Import of activation masks/activations profiled elsewhere (PyTorch on a
 * GPU): NumPy .npy files, one [tokens, neurons] array per layer, into the
 * trace format. docs/profiling.md has the hook code that writes them.
 *
 * .npy format (numpy.lib.format): magic "\x93NUMPY", major and minor version
 * bytes, header length (uint16 LE for version 1, uint32 LE for 2 and 3), then
 * an ASCII (v3: UTF-8) Python dict literal padded with spaces and ending in
 * '\n', such that the data starts at a multiple of 64 (16 in old writers),
 * then the C-order array data.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nl_profile.h"

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAX_HEADER (1u << 20)

static int read_exact(int fd, void *buf, size_t n, uint64_t off)
{
	uint8_t *p = buf;

	while (n) {
		ssize_t got = pread(fd, p, n, (off_t)off);

		if (got < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (got == 0)
			return NL_E_TRUNCATED;
		p += got;
		n -= (size_t)got;
		off += (uint64_t)got;
	}
	return 0;
}

/* Finds 'key': in the header dict and returns the text after the colon. */
static const char *dict_value(const char *hdr, const char *key)
{
	char pat[32];
	const char *p;

	snprintf(pat, sizeof(pat), "'%s'", key);
	p = strstr(hdr, pat);
	if (!p) {
		snprintf(pat, sizeof(pat), "\"%s\"", key);
		p = strstr(hdr, pat);
	}
	if (!p)
		return NULL;
	p += strlen(pat);
	while (*p == ' ')
		p++;
	if (*p != ':')
		return NULL;
	p++;
	while (*p == ' ')
		p++;
	return p;
}

static int parse_header(const char *path, char *hdr, struct nl_npy_info *info)
{
	const char *v, *end;
	char descr[16];
	uint64_t dims[8];
	int nd = 0;
	size_t n;

	/* The dict must be a literal {...}. */
	v = hdr;
	while (*v == ' ')
		v++;
	if (*v != '{' || !strchr(v, '}'))
		return nl_diag(NL_E_FORMAT, "'%s': .npy header is not a dict literal: '%.60s'", path, hdr);

	v = dict_value(hdr, "descr");
	if (!v || (*v != '\'' && *v != '"'))
		return nl_diag(NL_E_MISSING, "'%s': .npy header has no 'descr' string; header: '%.80s'", path, hdr);
	end = strchr(v + 1, *v);
	n = end ? (size_t)(end - v - 1) : 0;
	if (!end || n >= sizeof(descr))
		return nl_diag(NL_E_FORMAT, "'%s': .npy 'descr' is malformed: '%.30s'", path, v);
	memcpy(descr, v + 1, n);
	descr[n] = 0;
	if (!strcmp(descr, "|b1") || !strcmp(descr, "b1") || !strcmp(descr, "?"))
		info->dtype = NL_NPY_BOOL;
	else if (!strcmp(descr, "|u1") || !strcmp(descr, "u1"))
		info->dtype = NL_NPY_U8;
	else if (!strcmp(descr, "<f2"))
		info->dtype = NL_NPY_F16;
	else if (!strcmp(descr, "<f4"))
		info->dtype = NL_NPY_F32;
	else if (!strcmp(descr, "<i4"))
		info->dtype = NL_NPY_I32;
	else if (!strcmp(descr, "<i8"))
		info->dtype = NL_NPY_I64;
	else
		return nl_diag(NL_E_TYPE, "'%s': .npy 'descr' is '%s', expected '|b1' (bool), '|u1' (uint8), '<f2' (float16) or '<f4' (float32) (sample ids: '<i4', '<i8'); convert with arr.astype(np.float32) or save a bool mask",
			       path, descr);

	v = dict_value(hdr, "fortran_order");
	if (!v)
		return nl_diag(NL_E_MISSING, "'%s': .npy header has no 'fortran_order'", path);
	if (!strncmp(v, "True", 4))
		return nl_diag(NL_E_UNSUPPORTED, "'%s': .npy 'fortran_order' is True, expected False (C order); save np.ascontiguousarray(arr)",
			       path);
	if (strncmp(v, "False", 5))
		return nl_diag(NL_E_FORMAT, "'%s': .npy 'fortran_order' is '%.10s', expected True or False", path, v);

	v = dict_value(hdr, "shape");
	if (!v || *v != '(')
		return nl_diag(NL_E_MISSING, "'%s': .npy header has no 'shape' tuple", path);
	v++;
	for (;;) {
		char *e;
		unsigned long long d;

		while (*v == ' ')
			v++;
		if (*v == ')')
			break;
		if (*v < '0' || *v > '9')
			return nl_diag(NL_E_FORMAT, "'%s': .npy 'shape' is malformed at '%.20s'", path, v);
		errno = 0;
		d = strtoull(v, &e, 10);
		if (errno || nd == 8)
			return nl_diag(NL_E_FORMAT, "'%s': .npy 'shape' is malformed at '%.20s'", path, v);
		dims[nd++] = d;
		v = e;
		while (*v == ' ' || *v == 'L')
			v++;
		if (*v == ',')
			v++;
		else if (*v != ')')
			return nl_diag(NL_E_FORMAT, "'%s': .npy 'shape' is malformed at '%.20s'", path, v);
	}
	if (nd == 1) {
		dims[1] = 1;
	} else if (nd != 2) {
		return nl_diag(NL_E_SHAPE, "'%s': .npy 'shape' has %d dimensions, expected 2 ([tokens, neurons] of one layer)",
			       path, nd);
	}
	info->ndim = (uint32_t)nd;
	if (dims[1] == 0 || dims[1] > UINT32_MAX)
		return nl_diag(NL_E_SHAPE, "'%s': .npy 'shape' has %llu neurons, expected 1..4294967295",
			       path, (unsigned long long)dims[1]);
	if (dims[0] > (UINT64_MAX / 8) / dims[1])
		return nl_diag(NL_E_SHAPE, "'%s': .npy 'shape' (%llu, %llu) is too large", path,
			       (unsigned long long)dims[0], (unsigned long long)dims[1]);
	info->rows = dims[0];
	info->cols = dims[1];
	return 0;
}

static size_t dtype_size(enum nl_npy_dtype t)
{
	switch (t) {
	case NL_NPY_F16: return 2;
	case NL_NPY_F32: return 4;
	case NL_NPY_I32: return 4;
	case NL_NPY_I64: return 8;
	default: return 1;
	}
}

static int header_fd(const char *path, int fd, struct nl_npy_info *info)
{
	uint8_t pre[12];
	uint32_t hlen;
	uint64_t data_off, need;
	char *hdr = NULL;
	struct stat st;
	int err;

	memset(info, 0, sizeof(*info));
	if (fstat(fd, &st))
		return nl_diag(-errno, "'%s': stat: %s", path, strerror(errno));
	err = read_exact(fd, pre, 10, 0);
	if (err)
		return nl_diag(err == NL_E_TRUNCATED ? NL_E_TRUNCATED : err,
			       "'%s': %lld bytes, too short for a .npy header (at least 10)", path, (long long)st.st_size);
	if (memcmp(pre, NPY_MAGIC, 6))
		return nl_diag(NL_E_MAGIC, "'%s': magic is %02x %02x %02x %02x %02x %02x, expected 93 4e 55 4d 50 59 (\"\\x93NUMPY\"); not a .npy file (.npz archives must be unzipped)",
			       path, pre[0], pre[1], pre[2], pre[3], pre[4], pre[5]);
	info->major = pre[6];
	if (pre[6] < 1 || pre[6] > 3)
		return nl_diag(NL_E_VERSION, "'%s': .npy format version %u.%u, expected 1.0, 2.0 or 3.0", path, pre[6], pre[7]);
	if (pre[6] == 1) {
		hlen = (uint32_t)pre[8] | (uint32_t)pre[9] << 8;
		data_off = 10;
	} else {
		err = read_exact(fd, pre + 10, 2, 10);
		if (err)
			return nl_diag(NL_E_TRUNCATED, "'%s': ends inside the .npy header length", path);
		hlen = (uint32_t)pre[8] | (uint32_t)pre[9] << 8 | (uint32_t)pre[10] << 16 | (uint32_t)pre[11] << 24;
		data_off = 12;
	}
	if (hlen > NPY_MAX_HEADER)
		return nl_diag(NL_E_FORMAT, "'%s': .npy header length %u, expected at most %u", path, hlen, NPY_MAX_HEADER);
	hdr = malloc(hlen + 1);
	if (!hdr)
		return -ENOMEM;
	err = read_exact(fd, hdr, hlen, data_off);
	if (err) {
		err = nl_diag(NL_E_TRUNCATED, "'%s': ends inside the .npy header (%u bytes declared)", path, hlen);
		goto out;
	}
	hdr[hlen] = 0;
	if (memchr(hdr, 0, hlen)) {
		err = nl_diag(NL_E_FORMAT, "'%s': .npy header contains NUL bytes", path);
		goto out;
	}
	data_off += hlen;
	err = parse_header(path, hdr, info);
	if (err)
		goto out;
	info->data_offset = data_off;
	need = data_off + info->rows * info->cols * dtype_size(info->dtype);
	if ((uint64_t)st.st_size < need)
		err = nl_diag(NL_E_TRUNCATED, "'%s': %lld bytes, expected %llu for shape (%llu, %llu); the file is truncated",
			      path, (long long)st.st_size, (unsigned long long)need,
			      (unsigned long long)info->rows, (unsigned long long)info->cols);
	else if ((uint64_t)st.st_size > need)
		err = nl_diag(NL_E_FORMAT, "'%s': %lld bytes, expected %llu for shape (%llu, %llu); trailing data",
			      path, (long long)st.st_size, (unsigned long long)need,
			      (unsigned long long)info->rows, (unsigned long long)info->cols);
out:
	free(hdr);
	return err;
}

int nl_npy_read_header(const char *path, struct nl_npy_info *info)
{
	int fd = open(path, O_RDONLY), err;

	if (fd < 0)
		return nl_diag(-errno, "'%s': cannot open: %s", path, strerror(errno));
	err = header_fd(path, fd, info);
	close(fd);
	return err;
}

/* IEEE half to float, subnormals and inf/NaN included. */
static float half_to_float(uint16_t h)
{
	uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
	float f;

	if (exp == 0) {
		if (!mant) {
			bits = sign;
		} else {
			/* Subnormal: value mant * 2^-24. */
			f = (float)mant * 0x1.0p-24f;
			return sign ? -f : f;
		}
	} else if (exp == 31) {
		bits = sign | 0x7f800000u | (mant << 13);
	} else {
		bits = sign | ((exp + 112) << 23) | (mant << 13);
	}
	memcpy(&f, &bits, sizeof(f));
	return f;
}

int nl_npy_read_active(const char *path, double threshold, struct nl_csr *out, struct nl_npy_info *info)
{
	struct nl_npy_info local;
	uint8_t *row = NULL;
	uint64_t used = 0, cap = 0;
	size_t row_bytes;
	int fd, err;

	memset(out, 0, sizeof(*out));
	if (!info)
		info = &local;
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return nl_diag(-errno, "'%s': cannot open: %s", path, strerror(errno));
	err = header_fd(path, fd, info);
	if (err)
		goto out;
	if (info->ndim != 2) {
		err = nl_diag(NL_E_SHAPE, "'%s': .npy 'shape' has %u dimension(s), expected 2 ([tokens, neurons] of one layer)",
			      path, info->ndim);
		goto out;
	}
	if (info->dtype > NL_NPY_F32) {
		err = nl_diag(NL_E_TYPE, "'%s': integer .npy arrays are sample ids; a layer must be bool, uint8, float16 or float32",
			      path);
		goto out;
	}
	if (info->dtype >= NL_NPY_F16 && !(threshold >= 0)) {
		err = nl_diag(NL_E_INVAL, "'%s': threshold %g, expected >= 0", path, threshold);
		goto out;
	}
	row_bytes = (size_t)info->cols * dtype_size(info->dtype);
	row = malloc(row_bytes ? row_bytes : 1);
	out->indptr = malloc((info->rows + 1) * sizeof(*out->indptr));
	cap = info->rows * 16 + 16;
	out->indices = malloc(cap * sizeof(*out->indices));
	if (!row || !out->indptr || !out->indices) {
		err = -ENOMEM;
		goto out;
	}
	out->n_tokens = info->rows;
	out->n_neurons = (uint32_t)info->cols;
	out->indptr[0] = 0;
	for (uint64_t t = 0; t < info->rows; t++) {
		err = read_exact(fd, row, row_bytes, info->data_offset + t * row_bytes);
		if (err) {
			err = nl_diag(err, "'%s': read of row %llu failed: %s", path,
				      (unsigned long long)t, nl_strerror(err));
			goto out;
		}
		if (used + info->cols > cap) {
			uint64_t ncap = cap * 2 > used + info->cols ? cap * 2 : used + info->cols;
			uint32_t *grown = realloc(out->indices, ncap * sizeof(*grown));

			if (!grown) {
				err = -ENOMEM;
				goto out;
			}
			out->indices = grown;
			cap = ncap;
		}
		for (uint32_t i = 0; i < info->cols; i++) {
			bool on;

			switch (info->dtype) {
			case NL_NPY_BOOL:
			case NL_NPY_U8:
				on = row[i] != 0;
				break;
			case NL_NPY_F16: {
				uint16_t h = (uint16_t)(row[2 * i] | row[2 * i + 1] << 8);

				on = (double)fabsf(half_to_float(h)) > threshold;
				break;
			}
			default: {
				uint32_t bits = (uint32_t)row[4 * i] | (uint32_t)row[4 * i + 1] << 8 |
						(uint32_t)row[4 * i + 2] << 16 | (uint32_t)row[4 * i + 3] << 24;
				float f;

				memcpy(&f, &bits, sizeof(f));
				on = (double)fabsf(f) > threshold;
				break;
			}
			}
			if (on)
				out->indices[used++] = i;
		}
		out->indptr[t + 1] = used;
	}
	err = 0;
out:
	if (err) {
		if (err == -ENOMEM)
			nl_diag(err, "'%s': out of memory for %llu x %llu", path, (unsigned long long)info->rows,
				(unsigned long long)info->cols);
		nl_csr_free(out);
	}
	free(row);
	close(fd);
	return err;
}

int nl_npy_read_sample_ids(const char *path, uint32_t **ids, uint64_t *n)
{
	struct nl_npy_info info;
	uint8_t *raw = NULL;
	uint32_t *out = NULL;
	size_t esize;
	int fd, err;

	*ids = NULL;
	*n = 0;
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return nl_diag(-errno, "'%s': cannot open: %s", path, strerror(errno));
	err = header_fd(path, fd, &info);
	if (err)
		goto out;
	if (info.ndim != 1 || (info.dtype != NL_NPY_I32 && info.dtype != NL_NPY_I64)) {
		err = nl_diag(NL_E_SHAPE, "'%s': sample ids must be a 1-D '<i4' or '<i8' array (one id per token), found %u-D",
			      path, info.ndim);
		goto out;
	}
	esize = dtype_size(info.dtype);
	raw = malloc(info.rows * esize + 1);
	out = malloc(info.rows * sizeof(*out) + 1);
	if (!raw || !out) {
		err = nl_diag(-ENOMEM, "'%s': out of memory for %llu sample ids", path, (unsigned long long)info.rows);
		goto out;
	}
	err = read_exact(fd, raw, info.rows * esize, info.data_offset);
	if (err) {
		err = nl_diag(err, "'%s': reading the sample ids failed: %s", path, nl_strerror(err));
		goto out;
	}
	for (uint64_t t = 0; t < info.rows; t++) {
		int64_t v = 0;

		if (esize == 4) {
			int32_t v32;

			memcpy(&v32, raw + 4 * t, 4);
			v = v32;
		} else {
			memcpy(&v, raw + 8 * t, 8);
		}
		if (v < 0 || v > (int64_t)UINT32_MAX) {
			err = nl_diag(NL_E_FORMAT, "'%s': sample id %lld at token %llu, expected 0..4294967295",
				      path, (long long)v, (unsigned long long)t);
			goto out;
		}
		out[t] = (uint32_t)v;
	}
	*ids = out;
	*n = info.rows;
	out = NULL;
out:
	free(raw);
	free(out);
	close(fd);
	return err;
}

int nl_npy_import(const char *const *paths, uint32_t n_paths, double threshold,
		  const char *sample_ids_path, const struct nl_trace_meta *meta,
		  const struct nl_h5_opts *h5, const char *out_path, double *density)
{
	struct nl_trace_writer *w = NULL;
	struct nl_trace_meta m = *meta;
	struct nl_npy_info first, info;
	struct nl_csr csr = { 0 };
	uint32_t *sample_ids = NULL;
	uint64_t n_ids = 0;
	int err;

	if (!n_paths || n_paths > NL_MAX_LAYERS)
		return nl_diag(NL_E_INVAL, "import: %u layer files, expected 1..%d", n_paths, NL_MAX_LAYERS);
	/* Check every header before writing anything: a bad last layer fails fast. */
	for (uint32_t l = 0; l < n_paths; l++) {
		err = nl_npy_read_header(paths[l], l ? &info : &first);
		if (err)
			return err;
		if (l && (info.rows != first.rows || info.cols != first.cols))
			return nl_diag(NL_E_MISMATCH, "'%s': shape (%llu, %llu), expected (%llu, %llu) like '%s' (layer 0); every layer must cover the same tokens",
				       paths[l], (unsigned long long)info.rows, (unsigned long long)info.cols,
				       (unsigned long long)first.rows, (unsigned long long)first.cols, paths[0]);
	}
	if (m.model.n_neurons && m.model.n_neurons != first.cols)
		return nl_diag(NL_E_MISMATCH, "'%s': %llu neurons per token, expected %u (the model's FFN size)",
			       paths[0], (unsigned long long)first.cols, m.model.n_neurons);
	if (m.model.n_layers && m.model.n_layers != n_paths)
		return nl_diag(NL_E_MISMATCH, "import: %u layer files, expected %u (the model's layers)",
			       n_paths, m.model.n_layers);
	if (!m.model.d_model)
		return nl_diag(NL_E_INVAL, "import: the model's d_model is unknown; give the model (-m) or --d-model");
	if (first.ndim != 2)
		return nl_diag(NL_E_SHAPE, "'%s': .npy 'shape' has 1 dimension, expected 2 ([tokens, neurons] of one layer)",
			       paths[0]);
	if (sample_ids_path) {
		err = nl_npy_read_sample_ids(sample_ids_path, &sample_ids, &n_ids);
		if (err)
			return err;
		if (n_ids != first.rows) {
			free(sample_ids);
			return nl_diag(NL_E_MISMATCH, "'%s': %llu sample ids, expected %llu (one per token, like '%s')",
				       sample_ids_path, (unsigned long long)n_ids, (unsigned long long)first.rows,
				       paths[0]);
		}
	}
	m.model.n_neurons = (uint32_t)first.cols;
	m.model.n_layers = n_paths;
	m.sparsity = NL_SPARSITY_IMPORTED;
	m.has_sample_ids = sample_ids != NULL;
	m.density = NULL;
	m.threshold = NULL;
	err = nl_trace_create(&w, out_path, &m, h5);
	if (err) {
		free(sample_ids);
		return err;
	}
	for (uint32_t l = 0; l < n_paths; l++) {
		err = nl_npy_read_active(paths[l], threshold, &csr, NULL);
		if (err)
			goto fail;
		if (density)
			density[l] = csr.n_tokens ? (double)csr.indptr[csr.n_tokens] /
							    ((double)csr.n_tokens * csr.n_neurons)
						  : 0;
		err = nl_trace_write_layer(w, l, &csr);
		nl_csr_free(&csr);
		if (err)
			goto fail;
	}
	if (sample_ids) {
		err = nl_trace_set_sample_ids(w, sample_ids, n_ids);
		if (err)
			goto fail;
	}
	free(sample_ids);
	return nl_trace_finish(w, NULL);
fail:
	free(sample_ids);
	nl_trace_abort(w);
	return err;
}
