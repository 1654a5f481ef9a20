/* upgrade.h -- the binary upgrade (SIGUSR2), both sides: the old process
 * starts the new one and hands it its sockets (handover.h has the format);
 * the new one adopts them before it serves.
 *
 * The old process stays in charge until the new one says READY: until then
 * it changed nothing, so any failure (the program does not start, dies,
 * says FAIL, or is silent for PL_UPGRADE_TIMEOUT_MS) leaves it serving as
 * before. The hand-over itself, from HELLO to READY, runs without returning
 * to the loop, so no poll can be matched by both processes. */
#ifndef PILOTLIGHT_UPGRADE_H
#define PILOTLIGHT_UPGRADE_H

#include <uv.h>

#include "pilotlight/broker.h"
#include "pilotlight/http.h"

#define PL_UPGRADE_TIMEOUT_MS 30000

typedef struct pl_upgrade pl_upgrade;

typedef struct {
    uv_loop_t *loop;
    pl_broker *broker;
    pl_http *https[2];  /* the listeners: controllers (or all), dispatch or NULL */
    unsigned serves[2]; /* PL_SERVE_* of each */
    const char *program;
    char **argv;        /* the new process gets argv[1..] */
    char **envp;        /* and this environment, plus PL_HANDOVER_ENV */
    /* Called once: <ok> when the new process took everything over (the
     * caller then stops accepting and drains), else 0 (still serving). */
    void (*done)(void *arg, int ok);
    void *arg;
} pl_upgrade_opts;

/* Starts the program. Returns the upgrade in progress, or NULL when it
 * could not be started (logged; nothing changed). It frees itself after
 * done() has run, once its handles are closed. */
pl_upgrade *pl_upgrade_start(const pl_upgrade_opts *opts);

/* Gives up an upgrade not yet handed over (e.g. SIGTERM came first): the
 * new process is killed, done(arg, 0) runs. */
void pl_upgrade_abort(pl_upgrade *u, const char *why);

/* The new process's side: reads the state from <fd> (then closes it) and
 * adopts listeners into <https> by their serves, parked polls into
 * <broker>, idle connections. Answers READY and tells the service manager
 * (MAINPID, READY=1), or FAIL with the reason. Returns 0, or -1 (logged):
 * what was adopted is then closed without a byte written. */
int pl_upgrade_adopt(int fd, pl_broker *broker, pl_http *const https[2],
                     const unsigned serves[2]);

#endif
