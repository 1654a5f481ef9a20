/* server.h -- the process's event loop: listener, signals, graceful drain. */
#ifndef PILOTLIGHT_SERVER_H
#define PILOTLIGHT_SERVER_H

#include <signal.h>

#include "pilotlight/config.h"

/* Blocks (<how> SIG_BLOCK) or unblocks (SIG_UNBLOCK) the signals that act
 * on a running server: SIGHUP, SIGUSR2, SIGTERM, SIGINT. Held from the
 * process's start (main.c) until the loop's handlers exist, so that one
 * sent meanwhile is delivered then, not acted on by its default. */
void pl_server_hold_signals(int how);

/* Serves <cfg> until SIGTERM or SIGINT has drained it. SIGHUP loads the
 * configuration again from <argc>/<argv> and <envp> (what <cfg> was loaded
 * from; they must outlive the call) and updates <cfg> in place with what can
 * change live. Returns the process exit status: 0 after a clean drain, 1
 * when it could not start. */
int pl_server_run(pl_config *cfg, int argc, char **argv, char **envp);

#endif
