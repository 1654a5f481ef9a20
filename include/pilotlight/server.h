/* server.h -- the process's event loop: listener, signals, graceful drain. */
#ifndef PILOTLIGHT_SERVER_H
#define PILOTLIGHT_SERVER_H

#include "pilotlight/config.h"

/* Serves <cfg> until SIGTERM or SIGINT has drained it. Returns the process
 * exit status: 0 after a clean drain, 1 when it could not start. */
int pl_server_run(const pl_config *cfg);

#endif
