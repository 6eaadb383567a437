/*
 * The command's option parser on any argument vector: the first byte picks the subcommand,
 * the rest splits at NUL bytes into arguments. It must return an exit code or accept, never
 * crash or leak. What it accepts goes to the library, which checks the combinations (causal
 * with a window, say) itself: the fa_params it built, through fa_forward on tiny tensors, must
 * be taken or refused as an invalid argument that names the params field -- the message the
 * command prints for it.
 */
#include "config.h"

#include <string.h>

#include "../../src/cli/cli.h"
#include "fuzz.h"

#define MAX_ARGS 64

static fa_context *reference(void)
{
    static fa_context *ctx;
    if (!ctx) {
        fa_options o;
        fa_options_init(&o);
        o.backend = FA_BACKEND_REFERENCE;
        o.num_threads = 1;
        if (fa_context_create(&o, &ctx) != FA_OK)
            fuzz_fail("context: %s", fa_last_error());
    }
    return ctx;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const struct {
        const char *cmd, *allowed;
    } cmds[3] = {{"forward", "io"}, {"backward", "io grad"}, {"check", "check"}};
    static FILE *null_out;
    if (!null_out) { /* the parser's messages and --help go nowhere (the sanitizers write to
                        file descriptor 2 directly, not through stdio) */
        null_out = fopen("/dev/null", "w");
        stdout = stderr = null_out;
    }
    if (size == 0)
        return 0;
    const int c = data[0] % 3;
    char *text = malloc(size); /* size - 1 bytes of arguments and a final NUL */
    if (!text)
        return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    char *argv[MAX_ARGS];
    int argc = 0;
    for (size_t at = 0; at < size && argc < MAX_ARGS; at += strlen(text + at) + 1)
        argv[argc++] = text + at;
    if (argc == 1 && argv[0][0] == '\0')
        argc = 0;

    cli_opts o;
    int rc = cli_parse(cmds[c].cmd, argc, argv, cmds[c].allowed, &o);
    if (rc < 0 && (rc = cli_apply_profile(&o)) == 0) /* as the commands do (nothing loaded) */
        rc = -1;
    if (rc >= 0) {
        if (rc != EXIT_PASS && rc != EXIT_USAGE)
            fuzz_fail("cli_parse returned %d", rc);
        free(text);
        return 0;
    }
    /* accepted: the library takes the same parameters (seq 3 x 5 keys, so that windows and
     * alignments have room) */
    float q[12] = {0}, k[20] = {0}, v[20] = {0}, out[12], lse[3];
    fa_tensor tq, tk, tv, to, tl;
    fa_tensor_init(&tq, q, FA_F32, 1, 3, 1, 4, 0);
    fa_tensor_init(&tk, k, FA_F32, 1, 5, 1, 4, 0);
    fa_tensor_init(&tv, v, FA_F32, 1, 5, 1, 4, 0);
    fa_tensor_init(&to, out, FA_F32, 1, 3, 1, 4, 0);
    fa_tensor_init(&tl, lse, FA_F32, 1, 3, 1, 1, 1);
    fa_status s = fa_forward(reference(), &o.p, &tq, &tk, &tv, &to, &tl);
    if (s != FA_OK && (s != FA_ERR_INVALID_ARGUMENT || !strstr(fa_last_error(), "params->")))
        fuzz_fail("parsed options that fa_forward refuses without naming a parameter: %s (%s)",
                  fa_status_string(s), fa_last_error());
    cli_opts_free(&o);
    free(text);
    return 0;
}
