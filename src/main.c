/* main.c -- pilotlight: a warm-start connection broker. */
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>

#include "pilotlight/config.h"
#include "pilotlight/hash.h"
#include "pilotlight/log.h"
#include "pilotlight/server.h"

extern char **environ;

/* Each connection is a descriptor: take every one the hard limit allows,
 * and keep max_connections below it (a few stay for the listener, logs and
 * libuv's own) so accept never runs out first. */
static void raise_fd_limit(pl_config *cfg)
{
    struct rlimit rl;
    uint64_t asked = cfg->max_connections;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur != RLIM_INFINITY && pl_config_fit_nofile(cfg, rl.rlim_cur) < asked)
        PL_LOG(PL_LOG_INFO, "max_connections lowered to fit the file-descriptor limit",
               "\"max_connections\":%llu,\"nofile\":%llu",
               (unsigned long long)cfg->max_connections, (unsigned long long)rl.rlim_cur);
}

int main(int argc, char **argv)
{
    pl_config cfg;
    pl_config_action action;
    char err[512];

#ifdef PL_NEEDS_SSE42
    /* Refused here, before any request, instead of SIGILL on the first. */
    if (!__builtin_cpu_supports("sse4.2")) {
        fprintf(stderr, "pilotlight: this build needs a CPU with SSE4.2 "
                        "(build with meson -Dsse42=disabled for this one)\n");
        return 1;
    }
#endif
    if (pl_config_load(&cfg, argc, argv, environ, &action, err, sizeof(err)) != 0) {
        fprintf(stderr, "pilotlight: %s\n", err);
        return 2;
    }
    switch (action) {
    case PL_CONFIG_HELP:
        pl_config_usage(stdout);
        return 0;
    case PL_CONFIG_VERSION:
        printf("pilotlight %s\n", PL_VERSION);
        return 0;
    case PL_CONFIG_CHECK:
        pl_config_print(&cfg, stdout);
        return 0;
    case PL_CONFIG_RUN:
        break;
    }
    pl_log_threshold = (pl_log_level)cfg.log_level;
    signal(SIGPIPE, SIG_IGN);
    pl_hash_init();
    raise_fd_limit(&cfg);
    return pl_server_run(&cfg, argc, argv, environ);
}
