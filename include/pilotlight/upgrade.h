/* upgrade.h -- the binary upgrade (SIGUSR2), both sides: the old process
 * starts the new one and hands it its sockets (handover.h has the format);
 * the new one adopts them before it serves.
 *
 * The old process stays in charge until the new one says READY: until then
 * it changed nothing, so any failure (the program does not start, dies,
 * says FAIL, or misses a step's bound) leaves it serving as before. Its
 * side runs on the loop and never blocks: it serves throughout. From the
 * moment it takes stock (HELLO) to the verdict, what it hands over is held
 * here: no dispatch matches a poll being handed over, nothing reads an idle
 * connection being handed over, so no poll can be matched by both
 * processes; polls parked meanwhile are its own. */
#ifndef PILOTLIGHT_UPGRADE_H
#define PILOTLIGHT_UPGRADE_H

#include <uv.h>

#include "pilotlight/broker.h"
#include "pilotlight/http.h"
#include "pilotlight/upgrade-t.h"

typedef struct pl_upgrade pl_upgrade;

typedef struct {
    uv_loop_t *loop;
    pl_broker *broker;
    pl_http *https[2];  /* the listeners: controllers (or all), dispatch or NULL */
    unsigned serves[2]; /* PL_SERVE_* of each */
    const char *program;
    char **argv;        /* the new process gets argv[1..] */
    char **envp;        /* and this environment, plus PL_HANDOVER_ENV */
    uint64_t step_ms;   /* the bound of each step: HELLO, each message, READY */
    /* Called once: PL_UPGRADE_HANDED_OVER when the new process took
     * everything over (the caller then stops accepting and drains), else
     * why not (still serving, everything held released). */
    void (*done)(void *arg, pl_upgrade_result result);
    void *arg;
} pl_upgrade_opts;

/* Starts the program. Returns the upgrade in progress, or NULL when it
 * could not be started (logged; nothing changed). It frees itself after
 * done() has run, once its handles are closed. */
pl_upgrade *pl_upgrade_start(const pl_upgrade_opts *opts);

/* Gives up an upgrade not yet handed over (e.g. SIGTERM came first): the
 * new process is killed, done(arg, PL_UPGRADE_ABORTED) runs. */
void pl_upgrade_abort(pl_upgrade *u, const char *why);

/* The new process's side, before its loop runs: reads the state from <fd>
 * (then closes it; each read bounded by upgrade_step_timeout_ms) and
 * adopts listeners into <https> by their serves, parked polls into
 * <broker>, idle connections. Answers READY and tells the service manager
 * (MAINPID, READY=1), or FAIL with the reason. Returns 0, or -EPROTO (logged):
 * what was adopted is then closed without a byte written. */
int pl_upgrade_adopt(int fd, pl_broker *broker, pl_http *const https[2],
                     const unsigned serves[2]);

#endif
