/*
 * Replay driver shared by every fuzz target (formats, image, model,
 * profiler): compiled into one executable per target together with that
 * target's LLVMFuzzerTestOneInput, it feeds each file of the given
 * directories to the entry point, so the committed corpus and the golden
 * files run as an ordinary test. A crash or a sanitizer report fails the test.
 * Usage: <target>_replay DIR... [--optional DIR...]
 * Every DIR must exist, except those after --optional (a corpus that fuzz.sh
 * has not created yet). Files named MANIFEST and dot files are skipped; no
 * input at all fails.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint8_t *read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	long size;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
		/* exactly size bytes, so a parser reading past the end trips ASan */
		buf = malloc(size ? (size_t)size : 1);
		if (buf && fread(buf, 1, (size_t)size, f) != (size_t)size) {
			free(buf);
			buf = NULL;
		}
		*len = (size_t)size;
	}
	fclose(f);
	return buf;
}

int main(int argc, char **argv)
{
	unsigned long n_inputs = 0;
	int optional = 0;

	if (argc < 2) {
		fprintf(stderr, "usage: %s DIR... [--optional DIR...]\n", argv[0]);
		return 2;
	}
	for (int i = 1; i < argc; i++) {
		DIR *dir;
		struct dirent *ent;

		if (!strcmp(argv[i], "--optional")) {
			optional = 1;
			continue;
		}
		dir = opendir(argv[i]);
		if (!dir && optional)
			continue;
		if (!dir) {
			fprintf(stderr, "%s: cannot open '%s'\n", argv[0], argv[i]);
			return 1;
		}
		while ((ent = readdir(dir))) {
			char path[4096];
			uint8_t *buf;
			size_t len = 0;

			if (ent->d_name[0] == '.' || !strcmp(ent->d_name, "MANIFEST"))
				continue;
			snprintf(path, sizeof(path), "%s/%s", argv[i], ent->d_name);
			buf = read_file(path, &len);
			if (!buf) {
				fprintf(stderr, "%s: cannot read '%s'\n", argv[0], path);
				closedir(dir);
				return 1;
			}
			LLVMFuzzerTestOneInput(buf, len);
			free(buf);
			n_inputs++;
		}
		closedir(dir);
	}
	printf("replayed %lu inputs\n", n_inputs);
	return n_inputs ? 0 : 1;
}
