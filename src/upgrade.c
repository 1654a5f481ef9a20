/* upgrade.c -- SIGUSR2: start the new binary, hand it every socket, step down. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "pilotlight/handover.h"
#include "pilotlight/log.h"
#include "pilotlight/mem.h"
#include "pilotlight/notify.h"
#include "pilotlight/upgrade.h"

/* The old side is a small state machine on the loop: it never blocks, so
 * the process serves throughout, and each step has its bound. */
enum { AWAIT_HELLO, SENDING, AWAIT_READY };

/* A connection being handed over: a parked poll (<w> set) or an idle one. */
typedef struct {
    pl_waiter *w;
    pl_conn *c;
    int frozen;     /* pl_conn_freeze()'s answer */
    uint8_t serves; /* PL_SERVE_* of its listener */
} held;

struct pl_upgrade {
    pl_upgrade_opts o;
    uv_process_t proc;
    uv_poll_t poll;
    uv_timer_t timer; /* the current step's bound */
    int sock;
    int handles;      /* open handles; freed when none is left */
    int finished;     /* done() has run */
    int exited;
    int step;         /* AWAIT_HELLO, SENDING, AWAIT_READY */
    /* What is handed over, in record order (then END): the listeners, the
     * parked polls (held: nothing here answers them until the verdict) and
     * the idle connections (frozen: nothing here reads them). */
    int lfd[2 * PL_HTTP_LISTENERS_MAX];
    uint8_t lserves[2 * PL_HTTP_LISTENERS_MAX];
    size_t nlisteners;
    held *parked, *idle;
    size_t nparked, nidle, cap_parked, cap_idle;
    int out_of_memory;
    size_t sent;        /* records sent so far */
    uint64_t held_ns;   /* when the polls were held */
    uint64_t window_ns; /* from then to READY: neither process could match them */
};

static void handle_closed(uv_handle_t *h)
{
    pl_upgrade *u = h->data;

    if (--u->handles == 0) {
        pl_free(u->parked);
        pl_free(u->idle);
        pl_free(u);
    }
}

static void close_handle(uv_handle_t *h)
{
    if (!uv_is_closing(h))
        uv_close(h, handle_closed);
}

/* Gives back what was held for a hand-over that did not happen: each poll
 * is served here again, a deadline passed meanwhile answered at once. */
static void release(pl_upgrade *u)
{
    for (size_t i = 0; i < u->nparked; i++) {
        pl_conn_thaw(u->parked[i].c, u->parked[i].frozen);
        pl_broker_hold(u->o.broker, u->parked[i].w, 0);
    }
    for (size_t i = 0; i < u->nidle; i++)
        pl_conn_thaw(u->idle[i].c, u->idle[i].frozen);
    u->nparked = u->nidle = 0;
}

/* Ends the upgrade either way: done() runs once, the socket and timers
 * close; a new process that did not take over is killed, and what was
 * held for it is released first. */
static void finish(pl_upgrade *u, pl_upgrade_result result, const char *why)
{
    if (u->finished)
        return;
    u->finished = 1;
    if (result == PL_UPGRADE_HANDED_OVER) {
        PL_LOG(PL_LOG_INFO, "upgrade: handed over",
               "\"pid\":%d,\"parked\":%zu,\"idle\":%zu,\"transfer_ms\":%.3f", u->proc.pid,
               u->nparked, u->nidle, (double)u->window_ns / 1e6);
    } else {
        release(u);
        PL_LOG(PL_LOG_ERROR, "upgrade failed: still serving", "\"error\":\"%s\"", why);
    }
    close(u->sock);
    u->sock = -1;
    close_handle((uv_handle_t *)&u->poll);
    close_handle((uv_handle_t *)&u->timer);
    if (result != PL_UPGRADE_HANDED_OVER && !u->exited)
        uv_process_kill(&u->proc, SIGKILL); /* its exit closes the handle */
    else
        close_handle((uv_handle_t *)&u->proc); /* the new process lives on */
    u->o.done(u->o.arg, result);
}

void pl_upgrade_abort(pl_upgrade *u, const char *why)
{
    finish(u, PL_UPGRADE_ABORTED, why);
}

static void on_child_exit(uv_process_t *p, int64_t status, int signo)
{
    pl_upgrade *u = p->data;
    char why[96];

    u->exited = 1;
    snprintf(why, sizeof(why), "the new process exited (status %lld, signal %d) "
             "before taking over", (long long)status, signo);
    finish(u, PL_UPGRADE_FAILED, why);
    close_handle((uv_handle_t *)p);
}

static void on_timeout(uv_timer_t *t)
{
    pl_upgrade *u = t->data;
    char why[128];

    snprintf(why, sizeof(why), "the new process %s within %llu ms",
             u->step == AWAIT_HELLO ? "did not say HELLO"
             : u->step == SENDING   ? "took in no part of the state"
                                    : "did not answer READY",
             (unsigned long long)u->o.step_ms);
    finish(u, PL_UPGRADE_TIMEOUT, why);
}

static void on_io(uv_poll_t *p, int status, int events);

/* Step <step> begins, or makes progress: its bound starts again, and the
 * socket is watched for <events> (0: not at all). */
static void step_to(pl_upgrade *u, int step, int events)
{
    u->step = step;
    uv_timer_start(&u->timer, on_timeout, u->o.step_ms, 0);
    if (events != 0)
        uv_poll_start(&u->poll, events, on_io);
    else
        uv_poll_stop(&u->poll);
}

/* ---- the old side: taking stock ---- */

static int grow(void **arr, size_t *cap, size_t n, size_t size)
{
    void *p;

    if (n < *cap)
        return 0;
    p = pl_realloc(*arr, (*cap ? *cap * 2 : 256) * size);
    if (p == NULL)
        return -ENOMEM;
    *arr = p;
    *cap = *cap ? *cap * 2 : 256;
    return 0;
}

static void note_parked(pl_conn *c, const pl_waiter_info *info, void *arg)
{
    pl_upgrade *u = arg;

    if (pl_conn_handover_fd(c) < 0 || u->out_of_memory)
        return; /* stays here, and is closed with the drain */
    if (grow((void **)&u->parked, &u->cap_parked, u->nparked, sizeof(*u->parked)) != 0) {
        u->out_of_memory = 1;
        return;
    }
    u->parked[u->nparked++] = (held){info->w, c, 0, (uint8_t)pl_broker_conn_serves(c)};
}

static void note_idle(pl_conn *c, void *arg)
{
    pl_upgrade *u = arg;

    if (u->out_of_memory)
        return;
    if (grow((void **)&u->idle, &u->cap_idle, u->nidle, sizeof(*u->idle)) != 0) {
        u->out_of_memory = 1;
        return;
    }
    u->idle[u->nidle++] = (held){NULL, c, 0, (uint8_t)pl_broker_conn_serves(c)};
}

/* Notes what is to be handed over, then holds it: from here to the
 * verdict no dispatch reaches a poll that both processes may hold, and
 * nothing here reads a connection the other may be reading. Returns 0, or
 * -ENOMEM (then nothing is held). */
static int take_stock(pl_upgrade *u)
{
    for (int i = 0; i < 2; i++) {
        for (int j = 0; u->o.https[i] != NULL && j < pl_http_listener_count(u->o.https[i]);
             j++) {
            int fd = pl_http_listener_fd(u->o.https[i], j);
            if (fd >= 0 && u->nlisteners < sizeof(u->lfd) / sizeof(u->lfd[0])) {
                u->lfd[u->nlisteners] = fd;
                u->lserves[u->nlisteners++] = (uint8_t)u->o.serves[i];
            }
        }
    }
    pl_broker_each_parked(u->o.broker, note_parked, u);
    for (int i = 0; i < 2; i++)
        if (u->o.https[i] != NULL)
            pl_http_each_idle(u->o.https[i], note_idle, u);
    if (u->out_of_memory) {
        u->nparked = u->nidle = 0;
        return -ENOMEM;
    }
    u->held_ns = uv_hrtime();
    for (size_t i = 0; i < u->nparked; i++) {
        pl_broker_hold(u->o.broker, u->parked[i].w, 1);
        u->parked[i].frozen = pl_conn_freeze(u->parked[i].c);
    }
    for (size_t i = 0; i < u->nidle; i++)
        u->idle[i].frozen = pl_conn_freeze(u->idle[i].c);
    return 0;
}

/* ---- the old side: sending ---- */

/* Record <i> of the hand-over (END after the rest). Its strings point into
 * the engine, unchanged while the poll is held. */
static void record(pl_upgrade *u, size_t i, pl_handover_rec *r)
{
    const pl_config *cfg = pl_broker_config(u->o.broker);
    pl_waiter_info info;

    memset(r, 0, sizeof(*r));
    r->fd = -1;
    if (i < u->nlisteners) {
        r->type = PL_HO_LISTENER;
        r->serves = u->lserves[i];
        r->fd = u->lfd[i];
    } else if ((i -= u->nlisteners) < u->nparked) {
        pl_engine_waiter_info(u->parked[i].w, &info);
        r->type = PL_HO_PARKED;
        r->serves = u->parked[i].serves;
        r->fd = pl_conn_handover_fd(u->parked[i].c);
        r->keep_alive = (uint8_t)pl_conn_keep_alive(u->parked[i].c);
        r->age_ms = uv_now(u->o.loop) - info.parked_at;
        r->ka_idle_s = (uint32_t)cfg->tcp_keepalive_idle_s;
        r->ka_interval_s = (uint32_t)cfg->tcp_keepalive_interval_s;
        r->ka_count = (uint32_t)cfg->tcp_keepalive_count;
        r->user_timeout_ms = (uint32_t)cfg->tcp_user_timeout_ms;
        r->key = info.key;
        r->id = info.id;
        r->id_len = info.id_len;
    } else if ((i -= u->nparked) < u->nidle) {
        r->type = PL_HO_IDLE;
        r->serves = u->idle[i].serves;
        r->fd = pl_conn_handover_fd(u->idle[i].c);
    } else {
        r->type = PL_HO_END;
        r->count = u->nlisteners + u->nparked + u->nidle;
    }
}

/* Why a send failed: the new process's own FAIL when it left one. */
static const char *send_failed(pl_upgrade *u, int err, char *why, size_t len)
{
    pl_handover_rec recs[PL_HANDOVER_BATCH];
    char buf[PL_HANDOVER_MSG_MAX];
    int n = pl_handover_recv(u->sock, recs, buf);

    if (n > 0 && recs[0].type == PL_HO_FAIL)
        snprintf(why, len, "the new process could not adopt: %.*s", (int)recs[0].id_len,
                 recs[0].id);
    else
        snprintf(why, len, "sending the state: %s", strerror(-err));
    for (int i = 0; i < n; i++)
        if (pl_handover_has_fd(recs[i].type))
            close(recs[i].fd);
    return why;
}

/* Sends as much of the hand-over as the socket takes, one message at a
 * time; then waits for the verdict. */
static void send_some(pl_upgrade *u)
{
    size_t total = u->nlisteners + u->nparked + u->nidle; /* END's index */
    char why[PL_HANDOVER_ID_MAX + 64];

    while (u->sent <= total) {
        pl_handover_rec recs[PL_HANDOVER_BATCH];
        size_t n = 0;
        int rc;

        while (n < PL_HANDOVER_BATCH && u->sent + n <= total) {
            record(u, u->sent + n, &recs[n]);
            n++;
        }
        rc = pl_handover_send(u->sock, recs, n);
        if (rc == -EAGAIN || rc == -EWOULDBLOCK) {
            uv_poll_start(&u->poll, UV_WRITABLE, on_io); /* its bound runs on */
            return;
        }
        if (rc != 0) {
            finish(u, PL_UPGRADE_FAILED, send_failed(u, rc, why, sizeof(why)));
            return;
        }
        u->sent += n;
        step_to(u, SENDING, 0);
    }
    step_to(u, AWAIT_READY, UV_READABLE);
}

/* ---- the old side: the new process's messages ---- */

/* READY: the new process holds every socket sent; our descriptors close
 * without a byte written, which the peers cannot see. */
static void handed_over(pl_upgrade *u)
{
    u->window_ns = uv_hrtime() - u->held_ns;
    for (size_t i = 0; i < u->nparked; i++)
        pl_broker_hand_over(u->o.broker, u->parked[i].w);
    for (size_t i = 0; i < u->nidle; i++)
        pl_conn_close(u->idle[i].c);
    finish(u, PL_UPGRADE_HANDED_OVER, NULL);
}

static void on_io(uv_poll_t *p, int status, int events)
{
    pl_upgrade *u = p->data;
    pl_handover_rec recs[PL_HANDOVER_BATCH];
    char buf[PL_HANDOVER_MSG_MAX], why[PL_HANDOVER_ID_MAX + 64];
    int n;

    (void)events;
    if (u->step == SENDING && status == 0) {
        send_some(u);
        return;
    }
    n = status < 0 ? status : pl_handover_recv(u->sock, recs, buf);
    if (n == -EAGAIN || n == -EWOULDBLOCK || n == -EINTR)
        return;
    for (int i = 0; i < n; i++) /* nothing it sends us carries one */
        if (pl_handover_has_fd(recs[i].type))
            close(recs[i].fd);
    if (u->step == AWAIT_HELLO) {
        if (n == 0 && !u->exited) {
            uv_poll_stop(p); /* closed: its exit (or the bound) tells why */
            return;
        }
        if (n <= 0 || recs[0].type != PL_HO_HELLO) {
            finish(u, PL_UPGRADE_FAILED, "the new process closed its end before HELLO");
            return;
        }
        if (take_stock(u) != 0) {
            finish(u, PL_UPGRADE_FAILED, "out of memory");
            return;
        }
        step_to(u, SENDING, 0);
        send_some(u);
        return;
    }
    if (n > 0 && recs[0].type == PL_HO_READY) {
        handed_over(u);
        return;
    }
    if (n > 0 && recs[0].type == PL_HO_FAIL)
        snprintf(why, sizeof(why), "the new process could not adopt: %.*s",
                 (int)recs[0].id_len, recs[0].id);
    else
        snprintf(why, sizeof(why), "no answer from the new process: %s",
                 n < 0 ? strerror(-n) : n == 0 ? "closed" : "unexpected message");
    finish(u, PL_UPGRADE_FAILED, why);
}

/* The environment for the new process: ours, with PL_HANDOVER_ENV=3. */
static char **child_env(char **envp, char *var)
{
    size_t n = 0, k = 0, pre = strlen(PL_HANDOVER_ENV "=");
    char **env;

    while (envp && envp[n])
        n++;
    env = pl_malloc((n + 2) * sizeof(*env));
    if (env == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++)
        if (strncmp(envp[i], PL_HANDOVER_ENV "=", pre) != 0)
            env[k++] = envp[i];
    snprintf(var, 32, PL_HANDOVER_ENV "=3");
    env[k++] = var;
    env[k] = NULL;
    return env;
}

pl_upgrade *pl_upgrade_start(const pl_upgrade_opts *opts)
{
    pl_upgrade *u = pl_malloc(sizeof(*u));
    uv_stdio_container_t stdio[4];
    uv_process_options_t po;
    char var[32], **env = NULL, **args = NULL;
    int sv[2] = {-1, -1}, rc = UV_ENOMEM, argc = 0;

    if (u == NULL)
        goto fail;
    memset(u, 0, sizeof(*u));
    u->o = *opts;
    while (opts->argv[argc])
        argc++;
    args = pl_malloc((size_t)(argc + 1) * sizeof(*args));
    env = child_env(opts->envp, var);
    if (args == NULL || env == NULL)
        goto fail;
    memcpy(args, opts->argv, (size_t)(argc + 1) * sizeof(*args));
    args[0] = (char *)opts->program;
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
        rc = -errno;
        goto fail;
    }
    memset(&po, 0, sizeof(po));
    for (int i = 0; i < 3; i++) {
        stdio[i].flags = UV_INHERIT_FD;
        stdio[i].data.fd = i;
    }
    stdio[3].flags = UV_INHERIT_FD;
    stdio[3].data.fd = sv[1];
    po.file = opts->program;
    po.args = args;
    po.env = env;
    po.stdio = stdio;
    po.stdio_count = 4;
    po.exit_cb = on_child_exit;
    rc = uv_spawn(opts->loop, &u->proc, &po);
    if (rc != 0)
        goto fail;
    close(sv[1]);
    pl_free(args);
    pl_free(env);
    u->sock = sv[0];
    u->proc.data = u->poll.data = u->timer.data = u;
    u->handles = 3;
    uv_poll_init(opts->loop, &u->poll, u->sock); /* makes it non-blocking */
    uv_timer_init(opts->loop, &u->timer);
    step_to(u, AWAIT_HELLO, UV_READABLE);
    PL_LOG(PL_LOG_INFO, "upgrade: started", "\"pid\":%d", u->proc.pid);
    return u;
fail:
    PL_LOG(PL_LOG_ERROR, "upgrade failed: still serving", "\"error\":\"cannot start %s: %s\"",
           opts->program, uv_strerror(rc));
    if (sv[0] >= 0) {
        close(sv[0]);
        close(sv[1]);
    }
    pl_free(args);
    pl_free(env);
    pl_free(u);
    return NULL;
}

/* ---- the new side: adopt ---- */

typedef struct {
    pl_broker *b;
    pl_http *const *https;
    const unsigned *serves;
    size_t listeners, parked, idle, records;
} adoption;

static pl_http *http_for(const adoption *a, unsigned serves)
{
    for (int i = 0; i < 2; i++)
        if (a->https[i] != NULL && a->serves[i] == serves)
            return a->https[i];
    return NULL;
}

static void log_listening(int fd, unsigned port, unsigned serves)
{
    struct sockaddr_storage ss = {.ss_family = AF_UNSPEC};
    socklen_t len = sizeof(ss);
    char where[INET6_ADDRSTRLEN + 8];

    getsockname(fd, (struct sockaddr *)&ss, &len);
    pl_log_address(where, sizeof(where), (const struct sockaddr *)&ss, port);
    PL_LOG(PL_LOG_INFO, "listening",
           "\"address\":\"%s\",\"serves\":\"%s\",\"version\":\"" PL_VERSION
           "\",\"adopted\":true", where, pl_broker_serves_name(serves));
}

/* Adopts one record; its descriptor is consumed either way. Returns NULL,
 * or why not. */
static const char *adopt_one(adoption *a, const pl_handover_rec *r)
{
    pl_http *h = http_for(a, r->serves);
    pl_conn *c;
    uint16_t port;

    if (h == NULL) {
        close(r->fd);
        return "a socket for a listener this configuration does not have";
    }
    switch (r->type) {
    case PL_HO_LISTENER:
        if (pl_http_adopt_listener(h, r->fd, &port) != 0)
            return "a listening socket was refused";
        log_listening(r->fd, port, r->serves);
        a->listeners++;
        return NULL;
    case PL_HO_PARKED:
    case PL_HO_IDLE:
        c = pl_http_adopt(h, r->fd, r->type == PL_HO_PARKED, r->keep_alive);
        if (c == NULL)
            return "a connection could not be adopted";
        if (r->type == PL_HO_IDLE) {
            a->idle++;
            return NULL;
        }
        if (pl_broker_adopt(a->b, c, &r->key, r->id, r->id_len, r->age_ms) != 0) {
            pl_conn_close(c);
            return "a parked poll could not be adopted";
        }
        a->parked++;
        return NULL;
    default:
        if (pl_handover_has_fd(r->type))
            close(r->fd);
        return "an unexpected record";
    }
}

/* Reads and adopts until END. Returns NULL, or why not. */
static const char *adopt_all(int fd, adoption *a)
{
    pl_handover_rec recs[PL_HANDOVER_BATCH];
    char buf[PL_HANDOVER_MSG_MAX];

    for (;;) {
        int n = pl_handover_recv(fd, recs, buf), i;
        const char *why = NULL;

        if (n <= 0)
            return n == 0 ? "the old process closed before END" : "a malformed message";
        for (i = 0; i < n && why == NULL; i++) {
            if (recs[i].type == PL_HO_END)
                return recs[i].count == a->records && i == n - 1 ? NULL
                                                                 : "END does not match";
            why = adopt_one(a, &recs[i]);
            a->records++;
        }
        for (; i < n; i++) /* after a failure, the rest are never opened */
            if (pl_handover_has_fd(recs[i].type))
                close(recs[i].fd);
        if (why != NULL)
            return why;
    }
}

int pl_upgrade_adopt(int fd, pl_broker *broker, pl_http *const https[2],
                     const unsigned serves[2])
{
    adoption a = {.b = broker, .https = https, .serves = serves};
    pl_handover_rec r = {.type = PL_HO_HELLO, .count = (uint64_t)getpid(), .fd = -1};
    uint64_t ms = pl_broker_config(broker)->upgrade_step_timeout_ms;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000 * 1000)};
    const char *why;
    char state[64];

    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    why = pl_handover_send(fd, &r, 1) != 0 ? "cannot say HELLO" : adopt_all(fd, &a);
    if (why == NULL && a.listeners == 0)
        why = "no listening socket";
    r.type = why == NULL ? PL_HO_READY : PL_HO_FAIL;
    r.id = why;
    r.id_len = why ? strlen(why) : 0;
    if (why == NULL && pl_handover_send(fd, &r, 1) != 0)
        why = "cannot say READY";
    else if (why != NULL)
        pl_handover_send(fd, &r, 1);
    close(fd);
    if (why != NULL) {
        PL_LOG(PL_LOG_ERROR, "upgrade: adoption failed", "\"error\":\"%s\"", why);
        return -EPROTO;
    }
    snprintf(state, sizeof(state), "MAINPID=%d\nREADY=1", (int)getpid());
    pl_notify(state);
    PL_LOG(PL_LOG_INFO, "upgrade: adopted",
           "\"pid\":%d,\"listeners\":%zu,\"parked\":%zu,\"idle\":%zu", (int)getpid(),
           a.listeners, a.parked, a.idle);
    return 0;
}
