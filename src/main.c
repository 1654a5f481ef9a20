/* main.c -- pilotlight: a warm-start connection broker. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "pilotlight/config.h"
#include "pilotlight/hash.h"
#include "pilotlight/log.h"
#include "pilotlight/server.h"

extern char **environ;

/* Each connection is a descriptor: take every one the hard limit allows,
 * and share them out (pl_config_fit_nofile) so that accept never runs out
 * first and no plane can take another's. Returns 0 and fills *fds, or -1
 * when the limit is unlimited (nothing to share out). */
static int raise_fd_limit(pl_config *cfg, pl_config_fds *fds)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return -1;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur == RLIM_INFINITY)
        return -1;
    pl_config_fit_nofile(cfg, rl.rlim_cur, fds);
    return 0;
}

/* The signals that act on a running server, blocked from the first
 * instruction of ours (a constructor runs before main, right after the
 * dynamic loader) until the loop's handlers exist (server.c unblocks
 * them): one sent while the process starts is delivered then, rather than
 * killing it with the default action. What comes before, while the loader
 * maps the libraries, no program can catch. */
__attribute__((constructor)) static void hold_signals(void)
{
    pl_server_hold_signals(SIG_BLOCK);
}

int main(int argc, char **argv)
{
    pl_config cfg;
    pl_config_action action;
    pl_config_fds fds;
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
        if (raise_fd_limit(&cfg, &fds) == 0)
            printf("# file descriptors: %llu; controllers' listener %llu, dispatch listener "
                   "%llu, ring checks %llu, the process's own %llu\n",
                   (unsigned long long)fds.nofile, (unsigned long long)fds.controllers,
                   (unsigned long long)fds.dispatch, (unsigned long long)fds.ring,
                   (unsigned long long)fds.own);
        pl_config_print(&cfg, stdout);
        fputs(cfg.notes, stderr);
        return 0;
    case PL_CONFIG_RUN:
        break;
    }
    pl_log_threshold = (pl_log_level)cfg.log_level;
    signal(SIGPIPE, SIG_IGN);
    pl_hash_init();
    pl_config_log_notes(&cfg);
    if (raise_fd_limit(&cfg, &fds) == 0)
        PL_LOG(PL_LOG_INFO, "file descriptors shared out",
               "\"nofile\":%llu,\"controllers\":%llu,\"dispatch\":%llu,\"ring\":%llu,"
               "\"own\":%llu", (unsigned long long)fds.nofile,
               (unsigned long long)fds.controllers, (unsigned long long)fds.dispatch,
               (unsigned long long)fds.ring, (unsigned long long)fds.own);
    return pl_server_run(&cfg, argc, argv, environ);
}
