/* The corpus replay driver: every file named, or found in a directory named, goes once through
 * the harness's LLVMFuzzerTestOneInput (tests/fuzz/fuzz.h). Exits 0 after all of them; a
 * broken contract aborts first. */
#include "config.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            uint8_t *more = realloc(buf, cap *= 2);
            if (!more)
                free(buf);
            buf = more;
        }
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "%s: out of memory\n", path);
        return -1;
    }
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
    int files = 0;
    for (int a = 1; a < argc; a++) {
        struct stat st;
        if (stat(argv[a], &st) != 0) {
            perror(argv[a]);
            return 2;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (run_file(argv[a]))
                return 2;
            files++;
            continue;
        }
        DIR *d = opendir(argv[a]);
        if (!d) {
            perror(argv[a]);
            return 2;
        }
        char **names = NULL;
        size_t n = 0;
        for (struct dirent *e; (e = readdir(d));) {
            if (e->d_name[0] == '.')
                continue;
            char **more = realloc(names, (n + 1) * sizeof *names);
            if (!more || !(more[n] = malloc(strlen(argv[a]) + strlen(e->d_name) + 2)))
                return 2;
            names = more;
            sprintf(names[n++], "%s/%s", argv[a], e->d_name);
        }
        closedir(d);
        qsort(names, n, sizeof *names, by_name); /* the same order on every machine */
        for (size_t i = 0; i < n; i++) {
            if (run_file(names[i]))
                return 2;
            free(names[i]);
            files++;
        }
        free(names);
    }
    printf("%s: %d inputs replayed\n", argc > 0 ? argv[0] : "replay", files);
    return files > 0 ? 0 : 2;
}
