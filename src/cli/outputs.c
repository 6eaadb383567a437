/*
 * The output files of one command, all or nothing.
 *
 * Before any work: every output path is resolved (an existing file through its symbolic links;
 * a new one as its directory's real path plus its name), and refused if it names an input file
 * (same device and inode) or the same file as another output (same inode, or the same resolved
 * path before creation), if it exists and is not a regular file (a FIFO, a device, a directory:
 * renaming over it would replace it), if it exists and is not writable (as fopen would refuse
 * it), or if it is a symbolic link to nothing. Each gets a temporary file beside its
 * destination (".flashattn-XXXXXX" in that directory, so that the rename stays within one file
 * system), and the outputs' total size is checked against the free space there.
 *
 * After the work: every array is written, flushed and fsync'd in its temporary file, and only
 * when all of them are complete are they renamed onto their destinations (then the directories
 * are fsync'd). On any failure, and on SIGINT, SIGTERM, SIGHUP or SIGQUIT (unless the caller
 * ignores it), the temporary files are removed and no destination changes; a signal that
 * arrives while the files are being renamed waits until all of them are. SIGXFSZ is ignored,
 * so that a write past the file-size limit fails (EFBIG) and is cleaned up like a full disk.
 * What a rename cannot keep: an existing output's hard links, owner, ACLs and extended
 * attributes (its permission bits are kept). A rename within a directory fails only on a
 * failing disk; then earlier outputs are in place and later ones are not (the message says so).
 */
#include "config.h"

#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700 /* realpath, mkstemp, fchmod, fsync, sigaction, lstat */
#endif

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "cli.h"

/*
 * The temporary files alive now, for the signal handler, which may run on any thread (the
 * OpenMP workers included). Written only by the command's thread; `critical` is set while it
 * changes the set or renames, and a signal arriving then is left pending for it to act on
 * when it is done (lock-free atomics are async-signal-safe).
 */
static char *live_tmp[CLI_MAX_OUTPUTS];
static atomic_int live_count, critical, pending;

static void die_of(int sig)
{
    const int n = atomic_load(&live_count);
    for (int i = 0; i < n; i++)
        if (live_tmp[i])
            unlink(live_tmp[i]); /* async-signal-safe */
    signal(sig, SIG_DFL);
    raise(sig);
}

static void on_signal(int sig)
{
    if (atomic_load(&critical))
        atomic_store(&pending, sig);
    else
        die_of(sig);
}

static void enter_critical(void) { atomic_store(&critical, 1); }

static void leave_critical(void)
{
    atomic_store(&critical, 0);
    const int sig = atomic_exchange(&pending, 0);
    if (sig)
        die_of(sig);
}

static void watch_signals(void)
{
    static const int sigs[4] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 4; i++)
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN) /* nohup, & */
            sigaction(sigs[i], &sa, NULL);
    if (sigaction(SIGXFSZ, NULL, &old) == 0 && old.sa_handler == SIG_DFL)
        signal(SIGXFSZ, SIG_IGN);
}

/* "dir" and "name" of a path ("." for a bare name); NULL name if the path ends in '/'. */
static int split_path(const char *path, char *dir, size_t dirlen, const char **name)
{
    const char *slash = strrchr(path, '/');
    *name = slash ? slash + 1 : path;
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (!slash)
        snprintf(dir, dirlen, ".");
    else if (n == 0)
        snprintf(dir, dirlen, "/");
    else if (n < dirlen)
        memcpy(dir, path, n), dir[n] = '\0';
    else
        return -1;
    return **name ? 0 : -1;
}

static void cleanup(cli_outputs *s)
{
    enter_critical();
    for (int i = 0; i < s->n; i++) {
        if (s->o[i].f)
            fclose(s->o[i].f);
        if (s->o[i].tmp[0])
            unlink(s->o[i].tmp);
        s->o[i].f = NULL;
        s->o[i].tmp[0] = '\0';
        live_tmp[i] = NULL;
    }
    atomic_store(&live_count, 0);
    leave_critical();
}

void cli_outputs_init(cli_outputs *s) { memset(s, 0, sizeof *s); }

void cli_outputs_add(cli_outputs *s, const char *path, const cli_tensor *x)
{
    if (!path)
        return;
    if (s->n == CLI_MAX_OUTPUTS) { /* a command with more outputs than the set holds */
        fprintf(stderr, "flashattn: internal error: more than %d outputs\n", CLI_MAX_OUTPUTS);
        abort();
    }
    s->o[s->n].path = path;
    s->o[s->n].x = x;
    s->n++;
}

/* Resolves output i into its dest (and st, exists). EXIT_USAGE or EXIT_ERROR with a message. */
static int resolve(cli_output *o)
{
    char dir[PATH_MAX], real[PATH_MAX];
    const char *name;
    struct stat link;
    if (stat(o->path, &o->st) == 0) {
        o->exists = 1;
        if (!S_ISREG(o->st.st_mode)) {
            fprintf(stderr, "flashattn: %s: is %s: an output must be a regular file or a new "
                    "path (it is written to a temporary file and renamed over the path)\n",
                    o->path, npy_file_type(o->st.st_mode));
            return EXIT_USAGE;
        }
        if (access(o->path, W_OK) != 0) { /* what fopen would have refused */
            fprintf(stderr, "flashattn: %s: cannot write: %s\n", o->path, strerror(errno));
            return EXIT_ERROR;
        }
        if (!realpath(o->path, o->dest)) {
            fprintf(stderr, "flashattn: %s: cannot resolve: %s\n", o->path, strerror(errno));
            return EXIT_ERROR;
        }
        return 0;
    }
    if (errno != ENOENT) {
        fprintf(stderr, "flashattn: %s: cannot write: %s\n", o->path, strerror(errno));
        return EXIT_ERROR;
    }
    if (lstat(o->path, &link) == 0) { /* a dangling link: where it points is not ours to guess */
        fprintf(stderr, "flashattn: %s: a symbolic link to a missing file: give its target\n",
                o->path);
        return EXIT_USAGE;
    }
    if (split_path(o->path, dir, sizeof dir, &name)) {
        fprintf(stderr, "flashattn: %s: not a file name (it ends in '/' or is too long)\n",
                o->path);
        return EXIT_USAGE;
    }
    if (!realpath(dir, real)) {
        fprintf(stderr, "flashattn: %s: cannot write into %s: %s\n", o->path, dir,
                strerror(errno));
        return EXIT_ERROR;
    }
    if ((size_t)snprintf(o->dest, sizeof o->dest, "%s/%s", strcmp(real, "/") ? real : "",
                         name) >= sizeof o->dest) {
        fprintf(stderr, "flashattn: %s: cannot write: %s\n", o->path, strerror(ENAMETOOLONG));
        return EXIT_ERROR;
    }
    return 0;
}

static int same_file(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* The bytes free to this process in the file system of dest's directory (root may use the
 * reserved blocks); -1 where the file system does not say (no blocks reported). */
static int free_bytes(const char *dest, uint64_t *bytes)
{
    char dir[PATH_MAX];
    const char *name;
    struct statvfs v;
    if (split_path(dest, dir, sizeof dir, &name) || statvfs(dir, &v) != 0 || v.f_blocks == 0)
        return -1;
    *bytes = (uint64_t)(geteuid() == 0 ? v.f_bfree : v.f_bavail) * (uint64_t)v.f_frsize;
    return 0;
}

/* fsync of the directory that holds path: the renames themselves reach the disk. */
static void sync_dir_of(const char *path)
{
    char dir[PATH_MAX];
    const char *name;
    if (split_path(path, dir, sizeof dir, &name))
        return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd); /* best effort: some file systems refuse a directory's fsync */
        close(fd);
    }
}

int cli_outputs_open(cli_outputs *s, const char *const *inputs, int nin)
{
    int rc = 0;
    for (int i = 0; i < s->n && !rc; i++)
        rc = resolve(&s->o[i]);
    for (int i = 0; i < s->n && !rc; i++) {
        cli_output *o = &s->o[i];
        for (int j = 0; j < nin && !rc; j++) {
            struct stat st;
            if (inputs[j] && o->exists && stat(inputs[j], &st) == 0 && same_file(&st, &o->st)) {
                fprintf(stderr, "flashattn: %s: is the input file %s: an output may not "
                        "replace an input\n", o->path, inputs[j]);
                rc = EXIT_USAGE;
            }
        }
        for (int j = 0; j < i && !rc; j++) {
            const cli_output *p = &s->o[j];
            if ((o->exists && p->exists && same_file(&o->st, &p->st)) ||
                strcmp(o->dest, p->dest) == 0) {
                fprintf(stderr, "flashattn: %s and %s: the same file for two outputs\n", p->path,
                        o->path);
                rc = EXIT_USAGE;
            }
        }
    }
    /* the whole set's bytes against each destination's free space (an existing file's own
     * blocks are freed only after the rename: not counted) */
    for (int i = 0; i < s->n && !rc; i++) {
        uint64_t total = 0, avail;
        for (int j = 0; j < s->n; j++)
            total += (uint64_t)s->o[j].x->a.nbytes + CLI_FILE_SLACK;
        if (free_bytes(s->o[i].dest, &avail) == 0 && total > avail) {
            fprintf(stderr, "flashattn: %s: the outputs need %" PRIu64 " bytes, the file system "
                    "has %" PRIu64 " free\n", s->o[i].path, total, avail);
            rc = EXIT_ERROR;
        }
    }
    if (rc)
        return rc;
    watch_signals();
    for (int i = 0; i < s->n; i++) {
        cli_output *o = &s->o[i];
        char dir[PATH_MAX];
        const char *name;
        split_path(o->dest, dir, sizeof dir, &name);
        if ((size_t)snprintf(o->tmp, sizeof o->tmp, "%s/.flashattn-XXXXXX",
                             strcmp(dir, "/") ? dir : "") >= sizeof o->tmp) {
            fprintf(stderr, "flashattn: %s: cannot write: %s\n", o->path, strerror(ENAMETOOLONG));
            o->tmp[0] = '\0';
            rc = EXIT_ERROR;
            break;
        }
        enter_critical(); /* the file exists only once the handler knows it */
        int fd = mkstemp(o->tmp);
        const int e = errno;
        if (fd >= 0) {
            live_tmp[i] = o->tmp;
            atomic_store(&live_count, i + 1);
        } else {
            o->tmp[0] = '\0';
        }
        leave_critical();
        if (fd < 0) {
            fprintf(stderr, "flashattn: %s: cannot write into %s: %s\n", o->path, dir,
                    strerror(e));
            rc = EXIT_ERROR;
            break;
        }
        /* the permission bits fopen would give: the old file's, else 0666 less the umask */
        mode_t mode;
        if (o->exists) {
            mode = o->st.st_mode & 0777;
        } else {
            mode = umask(0);
            umask(mode);
            mode = 0666 & ~mode;
        }
        if (fchmod(fd, mode) != 0 || !(o->f = fdopen(fd, "wb"))) {
            fprintf(stderr, "flashattn: %s: cannot write: %s\n", o->path, strerror(errno));
            close(fd);
            rc = EXIT_ERROR;
            break;
        }
    }
    if (rc)
        cleanup(s);
    return rc;
}

int cli_outputs_commit(cli_outputs *s)
{
    char err[512];
    for (int i = 0; i < s->n; i++) {
        cli_output *o = &s->o[i];
        const npy_array *a = &o->x->a;
        err[0] = '\0';
        if (npy_write_stream(o->f, o->path, a->kind, a->ndim, a->shape, a->data, err,
                             sizeof err) ||
            fsync(fileno(o->f)) != 0) {
            if (err[0])
                fprintf(stderr, "flashattn: %s\n", err);
            else
                fprintf(stderr, "flashattn: %s: write failed: %s\n", o->path, strerror(errno));
            cleanup(s);
            return EXIT_ERROR;
        }
        FILE *f = o->f;
        o->f = NULL;
        if (fclose(f) != 0) {
            fprintf(stderr, "flashattn: %s: write failed: %s\n", o->path, strerror(errno));
            cleanup(s);
            return EXIT_ERROR;
        }
    }
    enter_critical(); /* a signal now waits for the whole set */
    for (int i = 0; i < s->n; i++) {
        cli_output *o = &s->o[i];
        if (rename(o->tmp, o->dest) != 0) {
            const int e = errno;
            leave_critical();
            fprintf(stderr, "flashattn: %s: cannot rename the finished output into place: %s "
                    "(%d of %d outputs were written)\n", o->path, strerror(e), i, s->n);
            cleanup(s);
            return EXIT_ERROR;
        }
        o->tmp[0] = '\0';
        live_tmp[i] = NULL;
    }
    atomic_store(&live_count, 0);
    for (int i = 0; i < s->n; i++)
        sync_dir_of(s->o[i].dest);
    leave_critical();
    return 0;
}

void cli_outputs_abort(cli_outputs *s) { cleanup(s); }
