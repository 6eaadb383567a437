/*
 * .npy reader and writer (see npy.h for the contract). Written from the NPY format
 * specification. The header grammar accepted here is the subset of Python literal syntax that
 * numpy.save produces, plus the harmless variations numpy's own parser (ast.literal_eval) also
 * takes: any key order, either quote, any blank space, optional trailing commas. Stricter than
 * numpy on purpose: the header must end in '\n' (the spec says so; numpy does not check),
 * duplicate keys, escapes, comments and non-decimal integers are refused.
 *
 *   header := blank* dict blank*                     (the last byte of the header is '\n')
 *   dict   := '{' [ item (',' item)* [','] ] '}'
 *   item   := string ':' value                       (keys: descr, fortran_order, shape; once each)
 *   value  := string | list | 'True' | 'False' | tuple
 *   tuple  := '(' ')' | '(' int ',' ')' | '(' int (',' int)+ [','] ')'
 *   int    := ['+' | '-'] digit+                     (no leading zeros; 1.x/2.x also 'L' suffix;
 *                                                     '-' is parsed to name it, refused unless -0)
 *   string := "'" byte* "'" | '"' byte* '"'          (no backslash, no newline inside)
 *   blank  := ' ' | '\t' | '\r' | '\n'
 *
 * A list value is only meaningful for 'descr' (structured dtypes); it is skipped as a balanced
 * bracket span so that the message can quote it, and then refused.
 *
 * Safety invariants of the reader, in the order the code establishes them:
 *   1. every byte index into the header is < its length (the lexer's pos <= n, checked before
 *      each access; the header is not NUL-terminated and may contain any byte, NUL included);
 *   2. nothing is allocated before the header length is known to be <= 1 MiB and to fit in
 *      the file; the data buffer only after its size is known to be <= max_bytes and equal to
 *      the bytes the file has after the header;
 *   3. every loop advances through a finite buffer: the lexer consumes >= 1 byte per token or
 *      stops, so parsing ends in O(header length);
 *   4. every integer product is checked before it is formed (dims are parsed into int64 with an
 *      overflow guard; their product times the item size must fit in int64, numpy's own rule).
 */
#include "config.h"

#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* fileno, fstat, fdopen, O_CLOEXEC */
#endif

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "npy.h"

/* The data goes to and from disk without byte swapping, and the files say little-endian. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c assumes a little-endian host: add byte swapping to npy_read/npy_write first"
#endif

static const unsigned char npy_magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

#define NPY_SUPPORTED                                                                          \
    "supported: '<f2' '<f4' '<f8' '<u2' '|V2' '<i4' '<i8' '|b1', or '=' in place of '<'; "   \
    "FP8 codes: '|u1' '|V1' '<V1' '<f1'"

/* ---------------------------------------------------------------------------------------- */
/* Messages                                                                                 */

#if defined(__GNUC__)
static void set_err(char *err, size_t errlen, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#endif

/* A path as a message shows it: whole up to NPY_PATH_SHOWN bytes, else its first 64 and last
 * NPY_PATH_SHOWN - 67 bytes around "...", so that the reason after it always fits. */
#define NPY_PATH_SHOWN 200

/* "path: message" into err, always terminated, truncated to errlen (no message if err is NULL
 * or errlen is 0). */
static void set_err(char *err, size_t errlen, const char *path, const char *fmt, ...)
{
    if (err == NULL || errlen == 0)
        return;
    const char *p = path != NULL ? path : "(null path)";
    const size_t len = strlen(p), tail = NPY_PATH_SHOWN - 67;
    int n = len <= NPY_PATH_SHOWN ? snprintf(err, errlen, "%s: ", p)
                                  : snprintf(err, errlen, "%.64s...%s: ", p, p + len - tail);
    if (n < 0) {
        err[0] = '\0';
        return;
    }
    if ((size_t)n >= errlen - 1)
        return; /* the path alone filled the buffer; snprintf has terminated it */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
    va_end(ap);
}

/* Copies untrusted bytes s[0..n) into dst for a message: printable ASCII except '\' as is,
 * every other byte as \xNN; at most `show` source bytes, then "..." if anything was cut.
 * Invariant of the loop: o + 4 <= dstlen, i.e. room for "..." and the terminator remains. */
static void printable(char *dst, size_t dstlen, const char *s, size_t n, size_t show)
{
    size_t o = 0;
    int cut = 0;
    if (dstlen < 4) {
        if (dstlen > 0)
            dst[0] = '\0';
        return;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char piece[8];
        size_t k;
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            piece[0] = (char)c;
            k = 1;
        } else {
            snprintf(piece, sizeof piece, "\\x%02x", c);
            k = 4;
        }
        if (i >= show || o + k + 4 > dstlen) {
            cut = 1;
            break;
        }
        memcpy(dst + o, piece, k);
        o += k;
    }
    if (cut) {
        memcpy(dst + o, "...", 3);
        o += 3;
    }
    dst[o] = '\0';
}

/* "(2, 3)", "(5,)", "()" into buf (at least 8 bytes; long shapes are cut, still terminated). */
static void format_shape(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t o = 0;
    buf[o++] = '(';
    buf[o] = '\0';
    for (int i = 0; i < ndim && o < len; i++) {
        int w = snprintf(buf + o, len - o, i > 0 ? ", %" PRId64 : "%" PRId64, shape[i]);
        if (w < 0 || (size_t)w >= len - o) {
            buf[len - 1] = '\0';
            return;
        }
        o += (size_t)w;
    }
    snprintf(buf + o, len - o, ndim == 1 ? ",)" : ")");
}

/* ---------------------------------------------------------------------------------------- */
/* Kinds and sizes                                                                          */

size_t npy_kind_size(npy_kind k)
{
    switch (k) {
    case NPY_F16: return 2;
    case NPY_F32: return 4;
    case NPY_F64: return 8;
    case NPY_U2: return 2;
    case NPY_I4: return 4;
    case NPY_I8: return 8;
    case NPY_B1:
    case NPY_U1: return 1;
    }
    return 0;
}

const char *npy_kind_descr(npy_kind k)
{
    switch (k) {
    case NPY_F16: return "<f2";
    case NPY_F32: return "<f4";
    case NPY_F64: return "<f8";
    case NPY_U2: return "<u2";
    case NPY_I4: return "<i4";
    case NPY_I8: return "<i8";
    case NPY_B1: return "|b1";
    case NPY_U1: return "|u1";
    }
    return NULL;
}

/* Data bytes of a shape, numpy's rule: the product of the NON-ZERO dims times the item size
 * must fit in int64 even when some dim is 0 (the array is then empty, nbytes 0). Checking the
 * zero-size case too keeps every later product of trailing dims (a stride) overflow-free.
 * Each factor is checked before the multiply: prod <= INT64_MAX / d  <=>  prod * d <= INT64_MAX.
 * Returns 0 and *nbytes, or -1 on overflow. Dims must already be >= 0. */
static int shape_bytes(int ndim, const int64_t *shape, size_t item, uint64_t *nbytes)
{
    uint64_t prod = item;
    int empty = 0;
    for (int i = 0; i < ndim; i++) {
        uint64_t d = (uint64_t)shape[i];
        if (d == 0) {
            empty = 1;
            continue;
        }
        if (prod > (uint64_t)INT64_MAX / d)
            return -1;
        prod *= d;
    }
    if (prod > (uint64_t)SIZE_MAX)
        return -1;
    *nbytes = empty ? 0 : prod;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Header lexer                                                                             */

typedef enum { TK_END, TK_PUNCT, TK_STR, TK_INT, TK_NAME, TK_WORD } tk_type;

typedef struct {
    tk_type type;
    size_t pos, len;   /* the token's bytes are h[pos .. pos + len) */
    char punct;        /* TK_PUNCT: one of { } ( ) [ ] : , */
    size_t spos, slen; /* TK_STR: the bytes between the quotes */
    int64_t ival;      /* TK_INT: the value when !ovf */
    int neg, ovf;      /* TK_INT: written with '-'; magnitude above INT64_MAX */
} token;

typedef struct {
    const char *path;
    const char *h;   /* the header, not terminated, any byte possible */
    size_t n;        /* its length */
    size_t pos;      /* next byte to lex; invariant: pos <= n */
    int long_suffix; /* accept Python 2's "3L" (numpy does for versions <= 2.0) */
    token tk;        /* the current token: one token of lookahead is all the grammar needs */
    char *err;
    size_t errlen;
} lexer;

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static int is_alpha(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static int is_blank(unsigned char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }
/* Bytes that can make up a bare word: numbers, names, and what malformed numbers look like
 * ("2.5", "-1", "1e9"), so that those get a message about the number, not about a byte. */
static int is_word(unsigned char c)
{
    return is_digit(c) || is_alpha(c) || c == '.' || c == '+' || c == '-';
}

/* How the current token reads in a message: end of header, or its (sanitized) text in quotes. */
static void tk_text(const lexer *L, char *buf, size_t len)
{
    if (L->tk.type == TK_END) {
        snprintf(buf, len, "end of header");
        return;
    }
    char raw[96];
    printable(raw, sizeof raw, L->h + L->tk.pos, L->tk.len, 40);
    snprintf(buf, len, L->tk.type == TK_STR ? "%s" : "'%s'", raw);
}

/* "header syntax error at byte N: expected WHAT, found TOKEN"; returns -1 for the caller. */
static int expected(lexer *L, const char *what)
{
    char found[128];
    tk_text(L, found, sizeof found);
    set_err(L->err, L->errlen, L->path, "header syntax error at byte %zu: expected %s, found %s",
            L->tk.pos, what, found);
    return -1;
}

/* Classifies the bare word h[p .. p+len) into TK_INT, TK_NAME or TK_WORD (anything else). */
static void classify_word(lexer *L, size_t p, size_t len)
{
    const unsigned char *w = (const unsigned char *)L->h + p;
    token *t = &L->tk;
    size_t i = 0, end = len;
    t->type = TK_WORD;
    if (w[0] == '+' || w[0] == '-') {
        t->neg = w[0] == '-';
        i = 1;
    }
    if (L->long_suffix && end > i + 1 && w[end - 1] == 'L')
        end--; /* "3L": the digits are before the suffix */
    size_t j = i;
    while (j < end && is_digit(w[j]))
        j++;
    if (j == end && j > i) {
        if (w[i] == '0' && end - i > 1)
            return; /* "007": not a Python 3 integer literal */
        uint64_t v = 0;
        for (size_t k = i; k < end; k++) {
            unsigned d = (unsigned)(w[k] - '0');
            if (v > ((uint64_t)INT64_MAX - d) / 10) {
                t->ovf = 1; /* keep the type; the value is unusable */
                break;
            }
            v = v * 10 + d;
        }
        t->type = TK_INT;
        t->ival = (int64_t)v;
        return;
    }
    if (i == 0 && is_alpha(w[0])) {
        for (size_t k = 1; k < len; k++)
            if (!is_alpha(w[k]) && !is_digit(w[k]))
                return;
        t->type = TK_NAME;
    }
}

/* Moves to the next token. Returns 0, or -1 with the message set (bad byte, bad string).
 * Every call either consumes at least one byte or returns TK_END (invariant 3). */
static int lex(lexer *L)
{
    token *t = &L->tk;
    memset(t, 0, sizeof *t);
    while (L->pos < L->n && is_blank((unsigned char)L->h[L->pos]))
        L->pos++;
    t->pos = L->pos;
    if (L->pos == L->n) {
        t->type = TK_END;
        return 0;
    }
    unsigned char c = (unsigned char)L->h[L->pos];
    if (c != '\0' && strchr("{}()[]:,", c) != NULL) {
        t->type = TK_PUNCT;
        t->punct = (char)c;
        t->len = 1;
        L->pos++;
        return 0;
    }
    if (c == '\'' || c == '"') {
        size_t q = L->pos + 1;
        while (q < L->n && (unsigned char)L->h[q] != c) {
            if (L->h[q] == '\\') {
                set_err(L->err, L->errlen, L->path,
                        "header syntax error at byte %zu: backslash escapes are not supported "
                        "in header strings", q);
                return -1;
            }
            if (L->h[q] == '\n')
                break; /* a quoted string cannot span lines */
            q++;
        }
        if (q == L->n || (unsigned char)L->h[q] != c) {
            set_err(L->err, L->errlen, L->path,
                    "header syntax error at byte %zu: unterminated string", L->pos);
            return -1;
        }
        t->type = TK_STR;
        t->spos = L->pos + 1;
        t->slen = q - t->spos;
        t->len = q + 1 - L->pos;
        L->pos = q + 1;
        return 0;
    }
    if (is_word(c)) {
        size_t q = L->pos;
        while (q < L->n && is_word((unsigned char)L->h[q]))
            q++;
        t->len = q - L->pos;
        classify_word(L, L->pos, t->len);
        L->pos = q;
        return 0;
    }
    char b[16];
    printable(b, sizeof b, L->h + L->pos, 1, 1);
    set_err(L->err, L->errlen, L->path,
            "header syntax error at byte %zu: unexpected character '%s'", L->pos, b);
    return -1;
}

static int is_punct(const lexer *L, char p) { return L->tk.type == TK_PUNCT && L->tk.punct == p; }

/* ---------------------------------------------------------------------------------------- */
/* Header parser                                                                            */

enum { KEY_DESCR, KEY_FORTRAN, KEY_SHAPE, NKEYS };
static const char *const key_names[NKEYS] = {"descr", "fortran_order", "shape"};

typedef struct {
    int seen[NKEYS];
    size_t descr_pos, descr_len; /* the descr's bytes in the header: string contents, or the */
    int descr_is_list;           /* whole "[...]" span of a structured dtype                 */
    int fortran;
    int ndim;
    int64_t shape[NPY_MAX_DIMS];
} header_info;

/* On entry the current token is '['. Skips to the matching ']', stepping over quoted strings
 * and requiring each close to match the innermost open (a structured descr nests tuples and
 * lists, e.g. [('a', '<f4', (2,))]); leaves the token after it current. Bounded by the header
 * length; nesting deeper than the stack is refused rather than followed. */
static int skip_list(lexer *L, header_info *hi)
{
    char closer[32]; /* the expected close of each open bracket; closer[depth-1] is the innermost */
    size_t start = L->tk.pos, q = start, depth = 0;
    while (q < L->n) {
        unsigned char c = (unsigned char)L->h[q];
        if (c == '\'' || c == '"') {
            size_t e = q + 1;
            while (e < L->n && (unsigned char)L->h[e] != c)
                e++;
            if (e == L->n)
                break; /* unterminated string: reported as an unterminated list */
            q = e + 1;
            continue;
        }
        if (c == '[' || c == '(' || c == '{') {
            if (depth == sizeof closer)
                break; /* deeper than any dtype numpy writes */
            closer[depth++] = c == '[' ? ']' : c == '(' ? ')' : '}';
        } else if (c == ']' || c == ')' || c == '}') {
            if (depth == 0 || closer[depth - 1] != (char)c)
                break; /* a close that does not match the innermost open */
            if (--depth == 0) {
                q++;
                hi->descr_pos = start;
                hi->descr_len = q - start;
                hi->descr_is_list = 1;
                L->pos = q;
                return lex(L);
            }
        }
        q++;
    }
    set_err(L->err, L->errlen, L->path,
            "header syntax error at byte %zu: unbalanced brackets in the value of 'descr'",
            start);
    return -1;
}

/* On entry the current token starts the value of 'shape'; on success the token after the
 * closing ')' is current. A tuple of 0..NPY_MAX_DIMS integers >= 0, written the way Python
 * writes tuples: "()", "(n,)", "(a, b)", "(a, b,)"; "(n)" is an int in Python, not a tuple. */
static int parse_shape(lexer *L, header_info *hi)
{
    char txt[128];
    if (!is_punct(L, '('))
        return expected(L, "a tuple of integers for 'shape'");
    if (lex(L))
        return -1;
    int n = 0;
    while (!is_punct(L, ')')) {
        const token *t = &L->tk;
        if (t->type != TK_INT || (t->neg && (t->ival != 0 || t->ovf))) {
            tk_text(L, txt, sizeof txt);
            if (t->type == TK_INT)
                set_err(L->err, L->errlen, L->path,
                        "negative dimension %s in 'shape': dims must be non-negative integers",
                        txt);
            else if (t->type == TK_END || t->type == TK_PUNCT)
                return expected(L, "an integer or ')' in 'shape'");
            else
                set_err(L->err, L->errlen, L->path,
                        "shape entry %s is not a non-negative integer", txt);
            return -1;
        }
        if (t->ovf) {
            tk_text(L, txt, sizeof txt);
            set_err(L->err, L->errlen, L->path,
                    "shape entry %s overflows int64 (integer overflow)", txt);
            return -1;
        }
        if (n == NPY_MAX_DIMS) {
            set_err(L->err, L->errlen, L->path, "too many dimensions in 'shape': more than %d",
                    NPY_MAX_DIMS);
            return -1;
        }
        hi->shape[n++] = t->ival;
        if (lex(L))
            return -1;
        if (is_punct(L, ',')) {
            if (lex(L))
                return -1;
        } else if (is_punct(L, ')')) {
            if (n == 1) {
                set_err(L->err, L->errlen, L->path,
                        "'shape' (%" PRId64 ") is not a tuple: a 1-d shape needs a trailing "
                        "comma, (%" PRId64 ",)", hi->shape[0], hi->shape[0]);
                return -1;
            }
        } else {
            return expected(L, "',' or ')' in 'shape'");
        }
    }
    hi->ndim = n;
    return lex(L);
}

/* Parses the whole header into hi: syntax, keys (known, once each, all present) and value
 * types. What the values mean (is the descr supported, is the size sane) is checked after,
 * so a malformed header is always reported as such, whatever its values. */
static int parse_header(lexer *L, header_info *hi)
{
    char txt[128];
    if (lex(L))
        return -1;
    if (!is_punct(L, '{'))
        return expected(L, "'{' (the header must be a dict literal)");
    if (lex(L))
        return -1;
    while (!is_punct(L, '}')) {
        if (L->tk.type != TK_STR)
            return expected(L, "a quoted key or '}'");
        int key = -1;
        for (int k = 0; k < NKEYS; k++)
            if (L->tk.slen == strlen(key_names[k]) &&
                memcmp(L->h + L->tk.spos, key_names[k], L->tk.slen) == 0)
                key = k;
        tk_text(L, txt, sizeof txt);
        if (key < 0) {
            set_err(L->err, L->errlen, L->path,
                    "unknown header key %s (expected 'descr', 'fortran_order', 'shape')", txt);
            return -1;
        }
        if (hi->seen[key]) {
            set_err(L->err, L->errlen, L->path, "duplicate header key %s", txt);
            return -1;
        }
        hi->seen[key] = 1;
        if (lex(L))
            return -1;
        if (!is_punct(L, ':')) {
            snprintf(txt, sizeof txt, "':' after key '%s'", key_names[key]);
            return expected(L, txt);
        }
        if (lex(L))
            return -1;
        if (key == KEY_DESCR) {
            if (is_punct(L, '[')) {
                if (skip_list(L, hi))
                    return -1;
            } else if (L->tk.type == TK_STR) {
                hi->descr_pos = L->tk.spos;
                hi->descr_len = L->tk.slen;
                if (lex(L))
                    return -1;
            } else {
                return expected(L, "a string (or a list) for 'descr'");
            }
        } else if (key == KEY_FORTRAN) {
            int is_true = L->tk.type == TK_NAME && L->tk.len == 4 &&
                          memcmp(L->h + L->tk.pos, "True", 4) == 0;
            int is_false = L->tk.type == TK_NAME && L->tk.len == 5 &&
                           memcmp(L->h + L->tk.pos, "False", 5) == 0;
            if (!is_true && !is_false)
                return expected(L, "True or False for 'fortran_order'");
            hi->fortran = is_true;
            if (lex(L))
                return -1;
        } else if (parse_shape(L, hi)) {
            return -1;
        }
        /* After a value: ',' (then another item or the closing brace) or the closing brace. */
        if (is_punct(L, ',')) {
            if (lex(L))
                return -1;
        } else if (!is_punct(L, '}')) {
            snprintf(txt, sizeof txt, "',' or '}' after the value of '%s'", key_names[key]);
            return expected(L, txt);
        }
    }
    if (lex(L))
        return -1;
    if (L->tk.type != TK_END)
        return expected(L, "only padding after the dict's '}'");
    for (int k = 0; k < NKEYS; k++)
        if (!hi->seen[k]) {
            set_err(L->err, L->errlen, L->path, "missing header key '%s'", key_names[k]);
            return -1;
        }
    return 0;
}

/* Maps the parsed descr to a kind, or explains the refusal. */
static int check_descr(lexer *L, const header_info *hi, npy_kind *kind)
{
    static const struct {
        char text[4];
        npy_kind kind;
    } ok[] = {
        {"<f2", NPY_F16}, {"<f4", NPY_F32}, {"<f8", NPY_F64}, {"<u2", NPY_U2}, {"|V2", NPY_U2},
        {"=f2", NPY_F16}, {"=f4", NPY_F32}, {"=f8", NPY_F64}, {"=u2", NPY_U2},
        {"<i4", NPY_I4},  {"<i8", NPY_I8},  {"=i4", NPY_I4},  {"=i8", NPY_I8},
        {"|b1", NPY_B1},
        {"|u1", NPY_U1},  {"|V1", NPY_U1},  {"<V1", NPY_U1},  {"<f1", NPY_U1}, /* ml_dtypes' FP8 */
    };
    const char *d = L->h + hi->descr_pos;
    char txt[160];
    if (!hi->descr_is_list && hi->descr_len == 3)
        for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
            if (memcmp(d, ok[i].text, 3) == 0) {
                *kind = ok[i].kind;
                return 0;
            }
    printable(txt, sizeof txt, d, hi->descr_len, 64);
    if (hi->descr_is_list)
        set_err(L->err, L->errlen, L->path,
                "unsupported descr %s: structured dtypes are not supported (" NPY_SUPPORTED ")",
                txt);
    else if (hi->descr_len > 0 && (d[0] == '>' || d[0] == '!'))
        set_err(L->err, L->errlen, L->path,
                "unsupported descr '%s': big-endian data is not supported, convert with "
                "a.astype(a.dtype.newbyteorder('<')) (" NPY_SUPPORTED ")", txt);
    else
        set_err(L->err, L->errlen, L->path, "unsupported descr '%s' (" NPY_SUPPORTED ")", txt);
    return -1;
}

/* ---------------------------------------------------------------------------------------- */
/* Reader                                                                                   */

const char *npy_file_type(unsigned mode)
{
    return S_ISDIR(mode)    ? "a directory"
           : S_ISFIFO(mode) ? "a FIFO"
           : S_ISCHR(mode)  ? "a character device"
           : S_ISBLK(mode)  ? "a block device"
           : S_ISSOCK(mode) ? "a socket"
           : S_ISREG(mode)  ? "a regular file"
                            : "not a regular file";
}

/* Reads exactly n bytes (the caller knows from fstat that the file has them). */
static int read_exact(FILE *f, void *buf, size_t n, const char *path, char *err, size_t errlen)
{
    if (n == 0 || fread(buf, 1, n, f) == n)
        return 0;
    if (ferror(f))
        set_err(err, errlen, path, "read error: %s", strerror(errno));
    else
        set_err(err, errlen, path, "read error: the file shrank while being read");
    return -1;
}

/* The reader's allocations, with the tests' failure injection (npy_fault_arm). */
static long fault_countdown;
static int fault_fired;

void npy_fault_arm(long n)
{
    fault_countdown = n;
    fault_fired = 0;
}

int npy_fault_fired(void) { return fault_fired; }

static void *npy_alloc(size_t n)
{
    if (fault_countdown > 0 && --fault_countdown == 0) {
        fault_fired = 1;
        return NULL;
    }
    return malloc(n);
}

int npy_read(const char *path, size_t max_bytes, npy_array *out, char *err, size_t errlen)
{
    int rc = -1;
    FILE *f = NULL;
    char *header = NULL;
    void *data = NULL;
    struct stat st;
    unsigned char pre[12];

    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (out == NULL) {
        set_err(err, errlen, path, "npy_read: no output array given");
        return -1;
    }
    memset(out, 0, sizeof *out);
    if (path == NULL) {
        set_err(err, errlen, path, "npy_read: no path given");
        return -1;
    }

    /* Only a regular file is opened: opening a FIFO for reading waits for a writer (forever if
     * none comes), opening a device may act on it. stat first; then an open that cannot block
     * and fstat of what was opened, in case the path changed in between. Every size check below
     * trusts st_size, which only a regular file has. */
    struct stat named;
    if (stat(path, &named) != 0) {
        set_err(err, errlen, path, "cannot open: %s", strerror(errno));
        return -1;
    }
    if (!S_ISREG(named.st_mode)) {
        set_err(err, errlen, path, "not a regular file (%s): .npy input is read from regular "
                "files only", npy_file_type(named.st_mode));
        return -1;
    }
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        set_err(err, errlen, path, "cannot open: %s", strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) != 0) {
        set_err(err, errlen, path, "cannot stat: %s", strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        set_err(err, errlen, path, "not a regular file (%s): .npy input is read from regular "
                "files only", npy_file_type(st.st_mode));
        close(fd);
        return -1;
    }
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0 ||
        (f = fdopen(fd, "rb")) == NULL) {
        set_err(err, errlen, path, "cannot open: %s", strerror(errno));
        close(fd);
        return -1;
    }
    const uint64_t fsize = (uint64_t)st.st_size;
    if (fsize == 0) {
        if (fgetc(f) != EOF) /* /proc and /sys files report 0 bytes and have content */
            set_err(err, errlen, path, "the file reports a size of 0 bytes but has content (a "
                    "/proc or /sys file?): its size cannot be checked before reading; copy it "
                    "to a regular file");
        else
            set_err(err, errlen, path, "empty file (0 bytes): not a .npy file");
        goto fail;
    }

    /* Preamble: magic (6), major, minor (1 each), header length (2 for 1.x, 4 for 2.x/3.x). */
    size_t have = fsize < 8 ? (size_t)fsize : 8;
    if (read_exact(f, pre, have, path, err, errlen))
        goto fail;
    if (memcmp(pre, npy_magic, have < 6 ? have : 6) != 0) {
        char found[64];
        printable(found, sizeof found, (const char *)pre, have < 6 ? have : 6, 6);
        set_err(err, errlen, path, "bad magic: not a .npy file (expected \\x93NUMPY, found %s)",
                found);
        goto fail;
    }
    if (have < 8) {
        set_err(err, errlen, path, "truncated preamble: the file has only %zu bytes", have);
        goto fail;
    }
    const unsigned major = pre[6], minor = pre[7];
    /* Strict like numpy (which refuses e.g. 1.5): a new minor may change the layout. */
    if ((major != 1 && major != 2 && major != 3) || minor != 0) {
        set_err(err, errlen, path,
                "unsupported format version %u.%u (supported: 1.0, 2.0, 3.0)", major, minor);
        goto fail;
    }
    const size_t lenbytes = major == 1 ? 2 : 4, prelen = 8 + lenbytes;
    if (fsize < prelen) {
        set_err(err, errlen, path, "truncated preamble: the file has only %" PRIu64 " bytes",
                fsize);
        goto fail;
    }
    if (read_exact(f, pre + 8, lenbytes, path, err, errlen))
        goto fail;
    uint64_t hlen = (uint64_t)pre[8] | (uint64_t)pre[9] << 8;
    if (lenbytes == 4)
        hlen |= (uint64_t)pre[10] << 16 | (uint64_t)pre[11] << 24;

    /* Invariant 2: the header is allocated only once it is known to be small and present. */
    if (hlen > NPY_MAX_HEADER_BYTES) {
        set_err(err, errlen, path, "header length %" PRIu64 " exceeds the 1 MiB limit", hlen);
        goto fail;
    }
    if (hlen > fsize - prelen) {
        set_err(err, errlen, path,
                "header length %" PRIu64 " runs past end of file (%" PRIu64
                " bytes after the preamble)", hlen, fsize - prelen);
        goto fail;
    }
    if (hlen == 0) {
        set_err(err, errlen, path, "empty header: not terminated by '\\n'");
        goto fail;
    }
    header = npy_alloc((size_t)hlen);
    if (header == NULL) {
        set_err(err, errlen, path, "out of memory for a %" PRIu64 "-byte header", hlen);
        rc = NPY_ERR_NO_MEMORY;
        goto fail;
    }
    if (read_exact(f, header, (size_t)hlen, path, err, errlen))
        goto fail;
    if (header[hlen - 1] != '\n') {
        set_err(err, errlen, path, "header not terminated by '\\n'");
        goto fail;
    }

    lexer L = {.path = path, .h = header, .n = (size_t)hlen, .long_suffix = major <= 2,
               .err = err, .errlen = errlen};
    header_info hi;
    memset(&hi, 0, sizeof hi);
    npy_kind kind;
    if (parse_header(&L, &hi) || check_descr(&L, &hi, &kind))
        goto fail;
    if (hi.fortran) {
        set_err(err, errlen, path,
                "Fortran-order arrays are not supported: save with np.ascontiguousarray");
        goto fail;
    }

    /* Invariant 4, then invariant 2 for the data: size against the limit and the file. */
    uint64_t nbytes;
    char shp[256];
    format_shape(shp, sizeof shp, hi.ndim, hi.shape);
    if (shape_bytes(hi.ndim, hi.shape, npy_kind_size(kind), &nbytes)) {
        set_err(err, errlen, path,
                "shape %s overflows: its size times the item size (%zu) does not fit in 64 bits "
                "(integer overflow)", shp, npy_kind_size(kind));
        goto fail;
    }
    if (nbytes > max_bytes) {
        set_err(err, errlen, path,
                "declared data size %" PRIu64 " bytes (shape %s, '%s') exceeds the limit of %zu "
                "bytes", nbytes, shp, npy_kind_descr(kind), max_bytes);
        goto fail;
    }
    const uint64_t avail = fsize - prelen - hlen;
    if (avail < nbytes) {
        set_err(err, errlen, path, "truncated data: header declares %" PRIu64
                " bytes, file has %" PRIu64, nbytes, avail);
        goto fail;
    }
    if (avail > nbytes) {
        set_err(err, errlen, path, "trailing bytes: header declares %" PRIu64
                " bytes of data, file has %" PRIu64 " (%" PRIu64 " extra)",
                nbytes, avail, avail - nbytes);
        goto fail;
    }

    /* One byte for an empty array, so that success always means data != NULL. */
    data = npy_alloc(nbytes > 0 ? (size_t)nbytes : 1);
    if (data == NULL) {
        set_err(err, errlen, path, "out of memory for %" PRIu64 " bytes of data", nbytes);
        rc = NPY_ERR_NO_MEMORY;
        goto fail;
    }
    if (read_exact(f, data, (size_t)nbytes, path, err, errlen))
        goto fail;
    if (fgetc(f) != EOF) { /* the file grew after fstat */
        set_err(err, errlen, path, "trailing bytes: the file grew while being read");
        goto fail;
    }
    free(header);
    fclose(f);

    out->kind = kind;
    out->ndim = hi.ndim;
    memcpy(out->shape, hi.shape, sizeof out->shape);
    out->data = data;
    out->nbytes = (size_t)nbytes;
    return 0;

fail:
    free(data);
    free(header);
    if (f != NULL)
        fclose(f);
    memset(out, 0, sizeof *out);
    return rc;
}

void npy_free(npy_array *a)
{
    if (a == NULL)
        return;
    free(a->data);
    memset(a, 0, sizeof *a);
}

/* ---------------------------------------------------------------------------------------- */
/* Writer                                                                                   */

/* The header numpy.save writes for the array (into head, its length into *headlen, the data's
 * size into *nbytes), after checking the arguments; -1 with a message if one is invalid. */
#define NPY_DICT_MAX 320 /* the dict's longest form (8 dims of 19 digits) is about 230 bytes */
#define NPY_HEAD_MAX (12 + NPY_DICT_MAX + 64)
static int make_header(const char *path, npy_kind kind, int ndim, const int64_t *shape,
                       const void *data, unsigned char head[NPY_HEAD_MAX], size_t *headlen,
                       uint64_t *nbytes_out, char *err, size_t errlen)
{
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    const char *descr = npy_kind_descr(kind);
    if (path == NULL) {
        set_err(err, errlen, path, "npy_write: no path given");
        return -1;
    }
    if (descr == NULL) {
        set_err(err, errlen, path, "npy_write: invalid kind %d", (int)kind);
        return -1;
    }
    if (ndim < 0 || ndim > NPY_MAX_DIMS || (ndim > 0 && shape == NULL)) {
        set_err(err, errlen, path, "npy_write: invalid ndim %d (0..%d, with a shape)", ndim,
                NPY_MAX_DIMS);
        return -1;
    }
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0) {
            set_err(err, errlen, path, "npy_write: negative dimension %" PRId64 " at index %d",
                    shape[i], i);
            return -1;
        }
    uint64_t nbytes;
    if (shape_bytes(ndim, shape, npy_kind_size(kind), &nbytes)) {
        set_err(err, errlen, path, "npy_write: shape overflows (integer overflow)");
        return -1;
    }
    if (nbytes > 0 && data == NULL) {
        set_err(err, errlen, path, "npy_write: no data for %" PRIu64 " bytes", nbytes);
        return -1;
    }

    /* The dict exactly as numpy writes it: keys sorted, Python reprs, a ", " after each item. */
    char dict[NPY_DICT_MAX];
    char shp[256];
    format_shape(shp, sizeof shp, ndim, shape);
    int dlen = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                        descr, shp);
    if (dlen < 0 || (size_t)dlen >= sizeof dict) {
        set_err(err, errlen, path, "npy_write: header does not fit"); /* unreachable */
        return -1;
    }

    /* Padding: magic + version + length field + dict + spaces + '\n' is a multiple of 64, so
     * the data starts aligned. Version 1.0 holds a header of up to 65535 bytes; past that (not
     * reachable with NPY_MAX_DIMS = 8, kept for the specification) 2.0 with a 4-byte length. */
    size_t prelen = 10;
    size_t pad = (64 - (prelen + (size_t)dlen + 1) % 64) % 64;
    size_t hlen = (size_t)dlen + pad + 1;
    unsigned major = 1;
    if (hlen > 0xffff) {
        major = 2;
        prelen = 12;
        pad = (64 - (prelen + (size_t)dlen + 1) % 64) % 64;
        hlen = (size_t)dlen + pad + 1;
    }
    memcpy(head, npy_magic, 6);
    head[6] = (unsigned char)major;
    head[7] = 0;
    for (size_t i = 0; i < prelen - 8; i++)
        head[8 + i] = (unsigned char)(hlen >> (8 * i));
    memcpy(head + prelen, dict, (size_t)dlen);
    memset(head + prelen + dlen, ' ', pad);
    head[prelen + hlen - 1] = '\n';

    *headlen = prelen + hlen;
    *nbytes_out = nbytes;
    return 0;
}

/* Header and data to f, flushed: the flush is part of the write (a full disk often shows only
 * there). */
static int write_all(FILE *f, const char *path, const unsigned char *head, size_t headlen,
                     const void *data, uint64_t nbytes, char *err, size_t errlen)
{
    errno = 0;
    if (fwrite(head, 1, headlen, f) != headlen ||
        (nbytes > 0 && fwrite(data, 1, (size_t)nbytes, f) != nbytes) || fflush(f) != 0) {
        set_err(err, errlen, path, "write failed: %s", errno != 0 ? strerror(errno) : "I/O error");
        return -1;
    }
    return 0;
}

int npy_write_stream(FILE *f, const char *path, npy_kind kind, int ndim, const int64_t *shape,
                     const void *data, char *err, size_t errlen)
{
    unsigned char head[NPY_HEAD_MAX];
    size_t headlen;
    uint64_t nbytes;
    if (make_header(path, kind, ndim, shape, data, head, &headlen, &nbytes, err, errlen))
        return -1;
    if (f == NULL) {
        set_err(err, errlen, path, "npy_write_stream: no stream given");
        return -1;
    }
    return write_all(f, path, head, headlen, data, nbytes, err, errlen);
}

int npy_write(const char *path, npy_kind kind, int ndim, const int64_t *shape, const void *data,
              char *err, size_t errlen)
{
    unsigned char head[NPY_HEAD_MAX];
    size_t headlen;
    uint64_t nbytes;
    if (make_header(path, kind, ndim, shape, data, head, &headlen, &nbytes, err, errlen))
        return -1; /* nothing created for invalid arguments */
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        set_err(err, errlen, path, "cannot open for writing: %s", strerror(errno));
        return -1;
    }
    int bad = write_all(f, path, head, headlen, data, nbytes, err, errlen);
    if (fclose(f) != 0 && !bad) {
        set_err(err, errlen, path, "write failed: %s", strerror(errno));
        bad = -1;
    }
    return bad ? -1 : 0;
}
