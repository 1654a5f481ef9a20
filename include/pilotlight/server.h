/* server.h -- the process's event loop: listener, signals, graceful drain. */
#ifndef PILOTLIGHT_SERVER_H
#define PILOTLIGHT_SERVER_H

#include "pilotlight/config.h"

/* Serves <cfg> until SIGTERM or SIGINT has drained it. SIGHUP loads the
 * configuration again from <argc>/<argv> and <envp> (what <cfg> was loaded
 * from; they must outlive the call) and updates <cfg> in place with what can
 * change live. Returns the process exit status: 0 after a clean drain, 1
 * when it could not start. */
int pl_server_run(pl_config *cfg, int argc, char **argv, char **envp);

#endif
