/* test_config.c -- defaults, file < env < flags, and refusals. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/stat.h>

#include "pilotlight/config.h"
#include "pilotlight/engine.h"
#include "pilotlight/log.h"
#include "unit.h"

static int load(pl_config *cfg, int argc, char **argv, char **envp,
                pl_config_action *action, char *err)
{
    return pl_config_load(cfg, argc, argv, envp, action, err, 512);
}

static void test_defaults(void)
{
    char *argv[] = {"pilotlight", NULL};
    pl_config cfg;
    pl_config_action action;
    char err[512];

    CHECK_EQ(load(&cfg, 1, argv, NULL, &action, err), 0);
    CHECK_EQ(action, PL_CONFIG_RUN);
    CHECK_STR(cfg.listen.host, "0.0.0.0");
    CHECK_EQ(cfg.listen.port, 8080);
    CHECK_EQ(cfg.connection_timeout_ms, 30000);
    CHECK_EQ(cfg.keepalive_ms, 300000);
    CHECK_EQ(cfg.park_timeout_ms, 35000); /* connection timeout + 5 s */
    CHECK_EQ(cfg.match_order, PL_ORDER_FIFO);
    CHECK_EQ(cfg.idle_timeout_ms, 120000);
    CHECK_EQ(cfg.log_level, PL_LOG_INFO);
}

static void test_precedence(void)
{
    char path[] = "/tmp/pl-config-XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");
    char *argv[] = {"pilotlight", "--config", path, "--max-waiters=7",
                    "--match-order", "lifo", NULL};
    char *envp[] = {"PILOTLIGHT_MAX_WAITERS=5", "PILOTLIGHT_KEEPALIVE_MS=42",
                    "OTHER=1", NULL};
    pl_config cfg;
    pl_config_action action;
    char err[512];

    fputs("# comment\nmax_waiters = 3\nkeepalive_ms=9 # trailing\n"
          "connection_timeout_ms = 1000\nlisten = [::1]:0\n", f);
    fclose(f);
    CHECK_EQ(load(&cfg, 6, argv, envp, &action, err), 0);
    CHECK_EQ(cfg.max_waiters, 7);     /* flag beats env beats file */
    CHECK_EQ(cfg.keepalive_ms, 42);   /* env beats file */
    CHECK_EQ(cfg.connection_timeout_ms, 1000);
    CHECK_EQ(cfg.park_timeout_ms, 6000);
    CHECK_EQ(cfg.match_order, PL_ORDER_LIFO);
    CHECK_STR(cfg.listen.host, "::1");
    CHECK_EQ(cfg.listen.port, 0);
    unlink(path);
}

static void expect_error(char **argv, int argc, char **envp, const char *needle)
{
    pl_config cfg;
    pl_config_action action;
    char err[512] = "";

    CHECK(load(&cfg, argc, argv, envp, &action, err) < 0); /* -EINVAL, or a file's errno */
    CHECK(strstr(err, needle) != NULL);
    if (strstr(err, needle) == NULL)
        fprintf(stderr, "  error '%s' should name '%s'\n", err, needle);
}

static void test_refusals(void)
{
    char *a1[] = {"pilotlight", "--match-order", "sideways", NULL};
    char *a2[] = {"pilotlight", "--max-waiters=-1", NULL};
    char *a3[] = {"pilotlight", "--listen", "nope", NULL};
    char *a4[] = {"pilotlight", "--no-such-thing", NULL};
    char *a5[] = {"pilotlight", "--max-waiters", NULL};
    char *a6[] = {"pilotlight", "--config", "/nonexistent/pl.conf", NULL};
    char *a7[] = {"pilotlight", "--listen", "127.0.0.1:65536", NULL};
    char *a8[] = {"pilotlight", "--log-level", "loud", NULL};
    char *a0[] = {"pilotlight", NULL};
    char *env[] = {"PILOTLIGHT_IDLE_TIMEOUT_MS=soon", NULL};

    expect_error(a1, 3, NULL, "match_order");
    expect_error(a2, 2, NULL, "max_waiters");
    expect_error(a3, 3, NULL, "listen");
    expect_error(a4, 2, NULL, "--no-such-thing");
    expect_error(a5, 2, NULL, "--max-waiters");
    expect_error(a6, 3, NULL, "/nonexistent/pl.conf");
    expect_error(a7, 3, NULL, "listen");
    expect_error(a8, 3, NULL, "log_level");
    expect_error(a0, 1, env, "PILOTLIGHT_IDLE_TIMEOUT_MS");
}

/* Host names are taken as written (resolved when the server starts, so
 * --check-config needs no resolver); only their spelling is checked. */
static void test_listen_names(void)
{
    static const struct {
        const char *value, *host;
        int port;
    } ok[] = {
        {"localhost:8080", "localhost", 8080},
        {"pilotlight-1.svc.cluster.local:0", "pilotlight-1.svc.cluster.local", 0},
        {"my_host:9", "my_host", 9},
        {"0.0.0.0:8080", "0.0.0.0", 8080},
        {"[::]:8081", "::", 8081},
    };
    static const char *const bad[] = {
        "localhost", "localhost:", ":8080", "-host:80", ".host:80", "ho st:80",
        "[localhost]:80", "host/x:80", "10.1:80", "1.2.3.4.5:80", "localhost:http",
    };
    char *argv[] = {"pilotlight", NULL};
    pl_config cfg;
    pl_config_action action;
    char err[512];

    CHECK_EQ(load(&cfg, 1, argv, NULL, &action, err), 0);
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        CHECK_EQ(pl_config_set(&cfg, "listen", ok[i].value, err, sizeof(err)), 0);
        CHECK_STR(cfg.listen.host, ok[i].host);
        CHECK_EQ(cfg.listen.port, ok[i].port);
        CHECK_EQ(pl_config_set(&cfg, "dispatch_listen", ok[i].value, err, sizeof(err)), 0);
        CHECK_STR(cfg.dispatch_listen.host, ok[i].host);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CHECK_EQ(pl_config_set(&cfg, "listen", bad[i], err, sizeof(err)), -EINVAL);
        CHECK(strstr(err, "listen") != NULL);
    }
}

static void test_actions(void)
{
    char *a1[] = {"pilotlight", "--check-config", NULL};
    char *a2[] = {"pilotlight", "--version", NULL};
    char *a3[] = {"pilotlight", "--help", NULL};
    pl_config cfg;
    pl_config_action action;
    char err[512];

    CHECK_EQ(load(&cfg, 2, a1, NULL, &action, err), 0);
    CHECK_EQ(action, PL_CONFIG_CHECK);
    CHECK_EQ(load(&cfg, 2, a2, NULL, &action, err), 0);
    CHECK_EQ(action, PL_CONFIG_VERSION);
    CHECK_EQ(load(&cfg, 2, a3, NULL, &action, err), 0);
    CHECK_EQ(action, PL_CONFIG_HELP);
}

/* The documented file in config/ must set every setting to its default. */
static void test_documented_file_is_defaults(void)
{
    char path[1024];
    char *argv[] = {"pilotlight", "--config", path, NULL};
    char *plain[] = {"pilotlight", NULL};
    pl_config a, b;
    pl_config_action action;
    char err[512];
    const char *src = getenv("PL_SOURCE_ROOT");

    snprintf(path, sizeof(path), "%s/config/pilotlight.conf", src ? src : ".");
    CHECK_EQ(load(&a, 3, argv, NULL, &action, err), 0);
    CHECK_EQ(load(&b, 1, plain, NULL, &action, err), 0);
    CHECK(memcmp(&a, &b, sizeof(a)) == 0);
}

/* Every setting --check-config prints is documented in the file. */
/* pl_config_print()'s output, malloc'd. */
static char *print_config(const pl_config *cfg)
{
    char *out = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&out, &len);

    pl_config_print(cfg, mem);
    fclose(mem);
    return out;
}

static void test_every_setting_documented(void)
{
    char path[1024], *doc, name[128];
    const char *src = getenv("PL_SOURCE_ROOT");
    char *argv[] = {"pilotlight", NULL};
    pl_config cfg;
    pl_config_action action;
    char err[512];
    FILE *f;
    size_t n = 0;
    char *printed;

    snprintf(path, sizeof(path), "%s/config/pilotlight.conf", src ? src : ".");
    f = fopen(path, "r");
    CHECK(f != NULL);
    if (f == NULL)
        return;
    doc = calloc(1, 1 << 16);
    n = fread(doc, 1, (1 << 16) - 1, f);
    fclose(f);
    CHECK(n > 0);
    CHECK_EQ(load(&cfg, 1, argv, NULL, &action, err), 0);
    printed = print_config(&cfg);
    for (char *line = strtok(printed, "\n"); line; line = strtok(NULL, "\n")) {
        char want[160];
        if (sscanf(line, "%127s", name) != 1)
            continue;
        snprintf(want, sizeof(want), "\n%s =", name);
        CHECK(strstr(doc, want) != NULL);
        if (strstr(doc, want) == NULL)
            fprintf(stderr, "  setting %s is not documented in %s\n", name, path);
    }
    free(printed);
    free(doc);
}

static void test_secrets(void)
{
    char path[] = "/tmp/pl-secret-XXXXXX";
    int fd = mkstemp(path);
    char *argv[] = {"pilotlight", "--token-mode", "enforce", "--token-secret-file", path, NULL};
    char *nosecret[] = {"pilotlight", "--token-mode", "log", NULL};
    char *envp[] = {"PILOTLIGHT_DISPATCH_TOKEN=hunter2", NULL};
    pl_config cfg;
    pl_config_action action;
    char err[512], *printed;

    CHECK_EQ(write(fd, "s3cret\n", 7), 7);
    close(fd);
    CHECK_EQ(load(&cfg, 5, argv, envp, &action, err), 0);
    CHECK_STR(cfg.token_secret, "s3cret");
    CHECK_STR(cfg.dispatch_token, "hunter2");
    CHECK_EQ(cfg.token_mode, PL_TOKEN_MODE_ENFORCE);
    printed = print_config(&cfg);
    CHECK(strstr(printed, "s3cret") == NULL && strstr(printed, "hunter2") == NULL);
    CHECK(strstr(printed, "token_secret = (set)") != NULL);
    free(printed);
    unlink(path);
    expect_error(nosecret, 3, NULL, "token_secret");
}


static void test_previous_secret(void)
{
    char path[] = "/tmp/pl-prev-XXXXXX";
    int fd = mkstemp(path);
    char *argv[] = {"pilotlight", "--token-mode", "enforce", "--token-secret", "new",
                    "--token-secret-previous-file", path, NULL};
    char *missing[] = {"pilotlight", "--token-secret-previous-file", "/nonexistent/x", NULL};
    char *envp[] = {"PILOTLIGHT_TOKEN_SECRET_PREVIOUS=from-env", NULL};
    pl_config cfg;
    pl_config_action action;
    char err[512], *printed;

    CHECK_EQ(write(fd, "old\r\n", 5), 5);
    close(fd);
    CHECK_EQ(load(&cfg, 7, argv, NULL, &action, err), 0);
    CHECK_STR(cfg.token_secret_previous, "old");
    CHECK_EQ(load(&cfg, 5, argv, envp, &action, err), 0);
    CHECK_STR(cfg.token_secret_previous, "from-env");
    printed = print_config(&cfg);
    CHECK(strstr(printed, "from-env") == NULL);
    CHECK(strstr(printed, "token_secret_previous = (set)") != NULL);
    free(printed);
    unlink(path);
    expect_error(missing, 3, NULL, "token_secret_previous_file /nonexistent/x");
}

typedef struct {
    char names[8][64], values[8][64];
    int n;
} diff_log;

static void on_diff(const char *name, const char *value, void *arg)
{
    diff_log *d = arg;

    if (d->n < 8) {
        snprintf(d->names[d->n], 64, "%s", name);
        snprintf(d->values[d->n], 64, "%s", value);
        d->n++;
    }
}

static void test_diff_and_fit(void)
{
    char *a[] = {"pilotlight", NULL};
    char *b[] = {"pilotlight", "--max-waiters", "7", "--log-level", "debug",
                 "--dispatch-token", "tok", NULL};
    pl_config x, y;
    pl_config_action action;
    char err[512];
    diff_log d = {.n = 0};

    CHECK_EQ(load(&x, 1, a, NULL, &action, err), 0);
    CHECK_EQ(load(&y, 7, b, NULL, &action, err), 0);
    pl_config_diff(&x, &x, on_diff, &d);
    CHECK_EQ(d.n, 0);
    pl_config_diff(&x, &y, on_diff, &d);
    CHECK_EQ(d.n, 3);
    CHECK_STR(d.names[0], "dispatch_token");
    CHECK_STR(d.values[0], "(set)"); /* a secret is never printed */
    CHECK_STR(d.names[1], "max_waiters");
    CHECK_STR(d.values[1], "7");
    CHECK_STR(d.names[2], "log_level");
    CHECK_STR(d.values[2], "debug");
    y.max_connections = 5000;
    CHECK_EQ(pl_config_fit_nofile(&y, 1024, NULL), 960);
    CHECK_EQ(pl_config_fit_nofile(&y, 100, NULL), 50);
    CHECK_EQ(pl_config_fit_nofile(&y, 100000, NULL), 50); /* never raised */
}

/* A temporary directory for the reader's tests; "" when none. */
static char tmpdir[64];

/* <name> in tmpdir; two calls' answers can be used together. */
static const char *tmp(const char *name)
{
    static char paths[2][128];
    static int i;

    i = !i;
    snprintf(paths[i], sizeof(paths[i]), "%s/%s", tmpdir, name);
    return paths[i];
}

static void write_file(const char *path, const char *data, size_t len)
{
    FILE *f = fopen(path, "wb");

    CHECK(f != NULL);
    if (f != NULL) {
        CHECK_EQ(fwrite(data, 1, len, f), len);
        fclose(f);
    }
}

/* Loads with --config <path>; returns load()'s answer, the error in <err>. */
static int load_conf(const char *path, pl_config *cfg, char *err)
{
    char *argv[] = {"pilotlight", "--config", (char *)path, NULL};
    pl_config_action action;

    err[0] = '\0';
    return load(cfg, 3, argv, NULL, &action, err);
}

static void expect_refused(const char *path, const char *needle)
{
    pl_config cfg;
    char err[512];

    CHECK(load_conf(path, &cfg, err) < 0); /* -EINVAL, -EFBIG, or the file's errno */
    CHECK(strstr(err, path) != NULL && strstr(err, needle) != NULL);
    if (strstr(err, path) == NULL || strstr(err, needle) == NULL)
        fprintf(stderr, "  error '%s' should name %s and '%s'\n", err, path, needle);
}

/* Only a regular file is read, whole, and never waited for. */
static void test_file_kinds(void)
{
    pl_config cfg;
    char err[512], *big;
    const size_t two_mib = 2 * 1024 * 1024;

    CHECK_EQ(mkfifo(tmp("fifo"), 0600), 0);
    expect_refused(tmp("fifo"), "a FIFO, not a regular file"); /* no writer: no wait */
    CHECK_EQ(mkdir(tmp("dir"), 0700), 0);
    expect_refused(tmp("dir"), "a directory, not a regular file");
    expect_refused("/dev/zero", "a character device, not a regular file");
    big = malloc(two_mib);
    CHECK(big != NULL);
    memset(big, '#', two_mib);
    write_file(tmp("big"), big, two_mib);
    free(big);
    expect_refused(tmp("big"), "more than 1048576 bytes");
    /* a symlink is followed to its file (ConfigMaps are symlinks) */
    write_file(tmp("real.conf"), "max_waiters = 12\n", 16);
    CHECK_EQ(symlink(tmp("real.conf"), tmp("link.conf")), 0);
    CHECK_EQ(load_conf(tmp("link.conf"), &cfg, err), 0);
    CHECK_EQ(cfg.max_waiters, 12);
    CHECK_EQ(symlink(tmp("fifo"), tmp("link-fifo")), 0);
    expect_refused(tmp("link-fifo"), "a FIFO");
    expect_refused(tmp("absent"), "No such file or directory");
}

/* A line is read whole, or refused with its number: never cut in two. */
static void test_lines(void)
{
    pl_config cfg;
    char err[512], line[1200];

    /* the comment that once spilled its tail into a setting of its own */
    memset(line, 'x', sizeof(line));
    line[0] = '#';
    memcpy(line + 1023, "connection_timeout_ms = 777\n", 28);
    write_file(tmp("long.conf"), line, 1023 + 28);
    expect_refused(tmp("long.conf"), ":1: line longer than 1024 bytes");
    /* 1024 bytes is a line like any other, with LF or CRLF or neither */
    memset(line, ' ', 1024);
    memcpy(line, "max_waiters = 99", 16);
    memcpy(line + 1024, "\r\nmax_waiters_per_key = 7", 25);
    write_file(tmp("edge.conf"), line, 1024 + 25);
    CHECK_EQ(load_conf(tmp("edge.conf"), &cfg, err), 0);
    CHECK_EQ(cfg.max_waiters, 99);
    CHECK_EQ(cfg.max_waiters_per_key, 7);
    write_file(tmp("nul.conf"), "max_waiters = 5\nmax_waiters = 6\0# x\n", 34);
    expect_refused(tmp("nul.conf"), ":2: a NUL byte");
    write_file(tmp("empty.conf"), "", 0);
    CHECK_EQ(load_conf(tmp("empty.conf"), &cfg, err), 0);
}

/* A *_file setting is read the same way. */
static void test_secret_files(void)
{
    char *fifo[] = {"pilotlight", "--token-secret-file", (char *)NULL, NULL};
    char path[128];
    pl_config cfg;
    pl_config_action action;
    char err[512];

    snprintf(path, sizeof(path), "%s", tmp("fifo"));
    fifo[2] = path;
    CHECK_EQ(load(&cfg, 3, fifo, NULL, &action, err), -EINVAL);
    CHECK(strstr(err, "token_secret_file") != NULL && strstr(err, "a FIFO") != NULL);
    snprintf(path, sizeof(path), "%s", tmp("dir"));
    CHECK_EQ(load(&cfg, 3, fifo, NULL, &action, err), -EINVAL);
    CHECK(strstr(err, "a directory") != NULL);
    write_file(tmp("nul.secret"), "abc\0def\n", 8);
    snprintf(path, sizeof(path), "%s", tmp("nul.secret"));
    CHECK_EQ(load(&cfg, 3, fifo, NULL, &action, err), -EINVAL);
    CHECK(strstr(err, "NUL") != NULL);
    fifo[1] = "--token-secret-previous-file";
    snprintf(path, sizeof(path), "%s", tmp("fifo"));
    CHECK_EQ(load(&cfg, 3, fifo, NULL, &action, err), -EINVAL);
    CHECK(strstr(err, "token_secret_previous_file") != NULL);
}

/* Settings valid alone that cannot work together are refused, saying why. */
static void test_senseless_combinations(void)
{
    static const struct {
        const char *flags[4];
        const char *needle; /* NULL: accepted */
    } cases[] = {
        {{"--park-timeout-ms", "30000"}, "is not above connection_timeout_ms"},
        {{"--park-timeout-ms", "29999"}, "is not above connection_timeout_ms"},
        {{"--park-timeout-ms", "30001"}, NULL},
        {{"--park-timeout-ms", "0"}, NULL},
        {{"--connection-timeout-ms", "300000"}, "connection_timeout_ms = 300000 is not below"},
        {{"--connection-timeout-ms", "299999"}, NULL},
        {{"--connection-timeout-ms", "100", "--park-timeout-ms", "200"}, NULL},
        {{"--max-header-bytes", "1023"}, "max_header_bytes = 1023 is below 1024"},
        {{"--max-header-bytes", "1024"}, NULL},
        {{"--max-body-bytes", "0"}, "max_body_bytes = 0 is below 1024"},
        {{"--max-body-bytes", "1024"}, NULL},
        {{"--ring-peers", "10.0.0.1:8080,10.0.0.2:8080", "--ring-self", "10.0.0.2:8080"}, NULL},
        {{"--ring-peers", "10.0.0.1:8080,10.0.0.2:8080"}, "must be one of ring_peers"},
        {{"--ring-peers", "10.0.0.1:8080,10.0.0.2"}, "\"10.0.0.2\" is not host:port"},
        {{"--ring-dns", "pilotlight.ns.svc:8080"}, NULL},
        {{"--ring-dns", "pilotlight.ns.svc:9090"}, "its port is not listen's (8080)"},
        {{"--ring-dns", "pilotlight.ns.svc:9090", "--ring-self", "10.0.0.1:9090"}, NULL},
        {{"--ring-dns", "n:8080", "--ring-peers", "10.0.0.1:8080"}, "one or the other"},
        {{"--ring-self", "10.0.0.1:8080"}, "neither ring_peers nor ring_dns"},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *argv[6] = {"pilotlight"};
        int argc = 1;
        pl_config cfg;
        pl_config_action action;
        char err[512] = "";

        for (int j = 0; j < 4 && cases[i].flags[j]; j++)
            argv[argc++] = (char *)cases[i].flags[j];
        CHECK_EQ(load(&cfg, argc, argv, NULL, &action, err), cases[i].needle ? -EINVAL : 0);
        if (cases[i].needle != NULL) {
            CHECK(strstr(err, cases[i].needle) != NULL);
            if (strstr(err, cases[i].needle) == NULL)
                fprintf(stderr, "  case %zu: '%s' should say '%s'\n", i, err, cases[i].needle);
        }
    }
}

int main(void)
{
    RUN(test_defaults);
    RUN(test_precedence);
    RUN(test_refusals);
    RUN(test_listen_names);
    RUN(test_actions);
    RUN(test_documented_file_is_defaults);
    RUN(test_every_setting_documented);
    RUN(test_secrets);
    RUN(test_previous_secret);
    RUN(test_diff_and_fit);
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/pl-config-files-XXXXXX");
    if (mkdtemp(tmpdir) != NULL) {
        RUN(test_file_kinds);
        RUN(test_lines);
        RUN(test_secret_files);
        char cmd[96];
        snprintf(cmd, sizeof(cmd), "rm -rf -- %s", tmpdir);
        if (system(cmd) != 0)
            fprintf(stderr, "  could not remove %s\n", tmpdir);
    } else {
        CHECK(!"mkdtemp");
    }
    RUN(test_senseless_combinations);
    return unit_finish();
}
