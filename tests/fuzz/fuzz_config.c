/* fuzz_config.c -- libFuzzer target for the configuration reader: a
 * config file's contents and the environment (and flags) around it.
 *
 * The input is: two bytes (little-endian) giving the file's length (taken
 * modulo what is there), a mode byte, the file's bytes, then a block of
 * NUL-separated strings, each an environment entry ("NAME=value") or, when
 * it begins with '-', a command-line argument. The file is a memfd named
 * by --config /proc/self/fd/N, so the whole reader runs: open, fstat, the
 * bounded read, the lines. Mode bit 0 also names that memfd as
 * token_secret_file, so the secret reader sees the same bytes.
 *
 * Each input is loaded twice, and a configuration that loads must:
 * print the same both times; satisfy what the loader promises (strings
 * terminated, choices in range, no setting combination it refuses); and
 * load again from its own printout and print the same (the string
 * settings aside: a '#', edge spaces or a newline from the environment
 * are nothing a file can say).
 *
 * Build: meson setup with -Dfuzzing=true (tests/fuzz/run.sh does). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/mman.h>

#include "pilotlight/config.h"

#define MAX_STRINGS 24

static int memfd = -1, outfd = -1;
static char mem_path[64], out_path[64];

/* Its printout, the string settings left out (set empty; a secret stands
 * in for a token mode's): they may hold what the format cannot write back,
 * a '#', edge spaces, a newline. malloc'd. */
static char *printout(const pl_config *cfg)
{
    pl_config c = *cfg;
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);

    if (f == NULL)
        abort();
    c.dispatch_token[0] = c.token_secret_file[0] = c.token_secret_previous[0] = '\0';
    c.token_secret_previous_file[0] = c.upgrade_binary[0] = '\0';
    strcpy(c.token_secret, c.token_mode != PL_TOKEN_MODE_DISABLED ? "x" : "");
    pl_config_print(&c, f);
    fclose(f);
    return out;
}

static void terminated(const char *s, size_t cap)
{
    if (memchr(s, '\0', cap) == NULL)
        abort();
}

/* What every loaded configuration holds to. */
static void check(const pl_config *c)
{
    terminated(c->listen.host, sizeof(c->listen.host));
    terminated(c->dispatch_listen.host, sizeof(c->dispatch_listen.host));
    terminated(c->token_secret, sizeof(c->token_secret));
    terminated(c->token_secret_file, sizeof(c->token_secret_file));
    terminated(c->dispatch_token, sizeof(c->dispatch_token));
    terminated(c->token_secret_previous, sizeof(c->token_secret_previous));
    terminated(c->token_secret_previous_file, sizeof(c->token_secret_previous_file));
    terminated(c->upgrade_binary, sizeof(c->upgrade_binary));
    if (c->match_order < 0 || c->match_order > 1 || c->delivery < 0 || c->delivery > 1 ||
        c->token_mode < 0 || c->token_mode > 2 || c->log_level < 0 || c->log_level > 3)
        abort();
    if (c->token_mode != PL_TOKEN_MODE_DISABLED && c->token_secret[0] == '\0')
        abort();
    if (c->park_timeout_ms <= c->connection_timeout_ms || c->connection_timeout_ms == 0 ||
        c->connection_timeout_ms >= 300000 || c->max_header_bytes < 1024 ||
        c->max_body_bytes < 1024 || c->upgrade_step_timeout_ms < 100)
        abort();
}

static int load(pl_config *cfg, int argc, char **argv, char **envp, char *err)
{
    pl_config_action action;
    int rc;

    memset(err, 0x55, 512); /* an error must be a string within its room */
    rc = pl_config_load(cfg, argc, argv, envp, &action, err, 512);
    if (rc > 0) /* an error is a negative errno */
        abort();
    if (rc != 0 && (memchr(err, '\0', 512) == NULL || err[0] == '\0'))
        abort();
    return rc;
}

static void set_file(int fd, const uint8_t *data, size_t n)
{
    if (ftruncate(fd, 0) != 0 || (n > 0 && pwrite(fd, data, n, 0) != (ssize_t)n))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *argv[MAX_STRINGS + 4], *envp[MAX_STRINGS + 2], *strings, err[512], secret[96];
    size_t flen, pos;
    int argc = 0, envc = 0;
    pl_config a, b, c;
    uint8_t mode;

    if (memfd < 0) {
        memfd = memfd_create("pl-config", MFD_CLOEXEC);
        outfd = memfd_create("pl-config-printed", MFD_CLOEXEC);
        if (memfd < 0 || outfd < 0)
            abort();
        snprintf(mem_path, sizeof(mem_path), "/proc/self/fd/%d", memfd);
        snprintf(out_path, sizeof(out_path), "/proc/self/fd/%d", outfd);
    }
    if (size < 3)
        return 0;
    flen = ((size_t)data[0] | (size_t)data[1] << 8) % (size - 3 + 1);
    mode = data[2];
    set_file(memfd, data + 3, flen);

    /* the strings after the file, NUL-terminated copies */
    pos = 3 + flen;
    strings = malloc(size - pos + 1);
    if (strings == NULL)
        return 0;
    memcpy(strings, data + pos, size - pos);
    strings[size - pos] = '\0';
    argv[argc++] = "pilotlight";
    argv[argc++] = "--config";
    argv[argc++] = mem_path;
    if (mode & 1) {
        snprintf(secret, sizeof(secret), "PILOTLIGHT_TOKEN_SECRET_FILE=%s", mem_path);
        envp[envc++] = secret;
    }
    for (char *s = strings; s < strings + (size - pos) && argc + envc < MAX_STRINGS + 3;
         s += strlen(s) + 1) {
        if (*s == '-')
            argv[argc++] = s;
        else if (*s != '\0')
            envp[envc++] = s;
    }
    argv[argc] = NULL;
    envp[envc] = NULL;

    if (load(&a, argc, argv, envp, err) == 0) {
        char *plain[] = {"pilotlight", "--config", out_path, NULL};
        char *pa, *pb, *pc;

        check(&a);
        if (load(&b, argc, argv, envp, err) != 0)
            abort(); /* the same input, the same answer */
        pa = printout(&a);
        pb = printout(&b);
        if (strcmp(pa, pb) != 0)
            abort();
        /* read back from its own printout */
        set_file(outfd, (const uint8_t *)pa, strlen(pa));
        if (load(&c, 3, plain, NULL, err) != 0)
            abort();
        check(&c);
        pc = printout(&c);
        if (strcmp(pa, pc) != 0)
            abort();
        free(pa);
        free(pb);
        free(pc);
    }
    free(strings);
    return 0;
}
