/* upgrade.c -- SIGUSR2: start the new binary, hand it every socket, step down. */
#include <errno.h>
#include <fcntl.h>
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
#include "pilotlight/upgrade.h"

struct pl_upgrade {
    pl_upgrade_opts o;
    uv_process_t proc;
    uv_poll_t poll;
    uv_timer_t timer;
    int sock;
    int handles;     /* open handles; freed when none is left */
    int finished;    /* done() has run */
    int exited;
    /* What was sent, to settle or close once READY comes. */
    pl_waiter **parked;
    pl_conn **idle;
    size_t nparked, nidle, cap_parked, cap_idle;
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

/* Ends the upgrade either way: done() runs once, the socket and timers
 * close; a new process that did not take over is killed. */
static void finish(pl_upgrade *u, int ok, const char *why)
{
    if (u->finished)
        return;
    u->finished = 1;
    if (ok)
        PL_LOG(PL_LOG_INFO, "upgrade: handed over",
               "\"pid\":%d,\"parked\":%zu,\"idle\":%zu", u->proc.pid, u->nparked, u->nidle);
    else
        PL_LOG(PL_LOG_ERROR, "upgrade failed: still serving", "\"error\":\"%s\"", why);
    close(u->sock);
    u->sock = -1;
    close_handle((uv_handle_t *)&u->poll);
    close_handle((uv_handle_t *)&u->timer);
    if (!ok && !u->exited)
        uv_process_kill(&u->proc, SIGKILL); /* its exit closes the handle */
    else
        close_handle((uv_handle_t *)&u->proc); /* the new process lives on */
    u->o.done(u->o.arg, ok);
}

void pl_upgrade_abort(pl_upgrade *u, const char *why)
{
    finish(u, 0, why);
}

static void on_child_exit(uv_process_t *p, int64_t status, int signo)
{
    pl_upgrade *u = p->data;
    char why[96];

    u->exited = 1;
    snprintf(why, sizeof(why), "the new process exited (status %lld, signal %d) "
             "before taking over", (long long)status, signo);
    finish(u, 0, why);
    close_handle((uv_handle_t *)p);
}

static void on_timeout(uv_timer_t *t)
{
    finish(t->data, 0, "the new process did not say HELLO in time");
}

/* ---- the old side: send ---- */

typedef struct {
    pl_upgrade *u;
    pl_handover_rec recs[PL_HANDOVER_BATCH];
    size_t n, total;
    unsigned serves;
    int err;
} batch;

static void flush(batch *bt)
{
    int rc;

    if (bt->err || bt->n == 0)
        return;
    rc = pl_handover_send(bt->u->sock, bt->recs, bt->n);
    if (rc != 0)
        bt->err = rc;
    bt->total += bt->n;
    bt->n = 0;
}

/* Appends <r>; the strings it points to must live until the next flush. */
static void add(batch *bt, const pl_handover_rec *r)
{
    bt->recs[bt->n++] = *r;
    if (bt->n == PL_HANDOVER_BATCH)
        flush(bt);
}

static int grow(void **arr, size_t *cap, size_t n, size_t size)
{
    void *p;

    if (n < *cap)
        return 0;
    p = pl_realloc(*arr, (*cap ? *cap * 2 : 256) * size);
    if (p == NULL)
        return -1;
    *arr = p;
    *cap = *cap ? *cap * 2 : 256;
    return 0;
}

static void send_parked(pl_conn *c, const pl_waiter_info *info, void *arg)
{
    batch *bt = arg;
    pl_upgrade *u = bt->u;
    int fd = pl_conn_handover_fd(c);
    pl_handover_rec r = {.type = PL_HO_PARKED, .fd = fd};
    const pl_config *cfg = pl_broker_config(u->o.broker);

    if (fd < 0 || bt->err)
        return; /* stays here, and is closed with the drain */
    if (grow((void **)&u->parked, &u->cap_parked, u->nparked, sizeof(*u->parked)) != 0) {
        bt->err = -ENOMEM;
        return;
    }
    r.serves = (uint8_t)pl_broker_conn_serves(c);
    r.keep_alive = (uint8_t)pl_conn_keep_alive(c);
    r.age_ms = uv_now(u->o.loop) - info->parked_at;
    r.ka_idle_s = (uint32_t)cfg->tcp_keepalive_idle_s;
    r.ka_interval_s = (uint32_t)cfg->tcp_keepalive_interval_s;
    r.ka_count = (uint32_t)cfg->tcp_keepalive_count;
    r.user_timeout_ms = (uint32_t)cfg->tcp_user_timeout_ms;
    r.key = info->key; /* points into the engine: unchanged until READY */
    r.id = info->id;
    r.id_len = info->id_len;
    u->parked[u->nparked++] = info->w;
    add(bt, &r);
}

static void send_idle(pl_conn *c, void *arg)
{
    batch *bt = arg;
    pl_upgrade *u = bt->u;
    pl_handover_rec r = {.type = PL_HO_IDLE, .serves = (uint8_t)bt->serves,
                         .fd = pl_conn_handover_fd(c)};

    if (bt->err)
        return;
    if (grow((void **)&u->idle, &u->cap_idle, u->nidle, sizeof(*u->idle)) != 0) {
        bt->err = -ENOMEM;
        return;
    }
    u->idle[u->nidle++] = c;
    add(bt, &r);
}

/* Sends everything, then waits for the verdict. Returns NULL on READY,
 * else why not. */
static const char *hand_over(pl_upgrade *u)
{
    static char why[PL_HANDOVER_ID_MAX + 64];
    batch bt = {.u = u};
    pl_handover_rec verdict[PL_HANDOVER_BATCH];
    char buf[PL_HANDOVER_MSG_MAX];
    int n;

    for (int i = 0; i < 2; i++) {
        pl_handover_rec r = {.type = PL_HO_LISTENER, .serves = (uint8_t)u->o.serves[i]};
        for (int j = 0; u->o.https[i] != NULL && j < pl_http_listener_count(u->o.https[i]); j++)
            if ((r.fd = pl_http_listener_fd(u->o.https[i], j)) >= 0)
                add(&bt, &r);
    }
    pl_broker_each_parked(u->o.broker, send_parked, &bt);
    for (int i = 0; i < 2; i++) {
        bt.serves = u->o.serves[i];
        if (u->o.https[i] != NULL)
            pl_http_each_idle(u->o.https[i], send_idle, &bt);
    }
    flush(&bt);
    add(&bt, &(pl_handover_rec){.type = PL_HO_END, .count = bt.total, .fd = -1});
    flush(&bt);
    if (bt.err) {
        snprintf(why, sizeof(why), "sending the state: %s", strerror(-bt.err));
        return why;
    }
    n = pl_handover_recv(u->sock, verdict, buf);
    if (n > 0 && verdict[0].type == PL_HO_READY)
        return NULL;
    if (n > 0 && verdict[0].type == PL_HO_FAIL)
        snprintf(why, sizeof(why), "the new process could not adopt: %.*s",
                 (int)verdict[0].id_len, verdict[0].id);
    else
        snprintf(why, sizeof(why), "no answer from the new process: %s",
                 n < 0 ? strerror(-n) : n == 0 ? "closed" : "unexpected message");
    return why;
}

static void on_hello(uv_poll_t *p, int status, int events)
{
    pl_upgrade *u = p->data;
    pl_handover_rec hello[PL_HANDOVER_BATCH];
    char buf[PL_HANDOVER_MSG_MAX];
    struct timeval tv = {PL_UPGRADE_TIMEOUT_MS / 1000, 0};
    const char *why;
    int n;

    (void)events;
    uv_poll_stop(p);
    n = status < 0 ? status : pl_handover_recv(u->sock, hello, buf);
    if (n == 0 && !u->exited)
        return; /* closed: its exit (or the timer) tells why */
    if (n <= 0 || hello[0].type != PL_HO_HELLO) {
        finish(u, 0, "the new process closed its end before HELLO");
        return;
    }
    uv_timer_stop(&u->timer);
    /* From here to READY the loop waits: bounded by the socket timeouts
     * (uv_poll made the socket non-blocking). */
    fcntl(u->sock, F_SETFL, fcntl(u->sock, F_GETFL) & ~O_NONBLOCK);
    setsockopt(u->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(u->sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    why = hand_over(u);
    if (why != NULL) {
        finish(u, 0, why);
        return;
    }
    /* The new process holds every socket sent: our descriptors close
     * without a byte written, which the peers cannot see. */
    for (size_t i = 0; i < u->nparked; i++)
        pl_broker_hand_over(u->o.broker, u->parked[i]);
    for (size_t i = 0; i < u->nidle; i++)
        pl_conn_close(u->idle[i]);
    finish(u, 1, NULL);
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
    uv_poll_init(opts->loop, &u->poll, u->sock);
    uv_poll_start(&u->poll, UV_READABLE, on_hello);
    uv_timer_init(opts->loop, &u->timer);
    uv_timer_start(&u->timer, on_timeout, PL_UPGRADE_TIMEOUT_MS, 0);
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
    struct timeval tv = {PL_UPGRADE_TIMEOUT_MS / 1000, 0};
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
        return -1;
    }
    snprintf(state, sizeof(state), "MAINPID=%d\nREADY=1", (int)getpid());
    pl_handover_notify(state);
    PL_LOG(PL_LOG_INFO, "upgrade: adopted",
           "\"pid\":%d,\"listeners\":%zu,\"parked\":%zu,\"idle\":%zu", (int)getpid(),
           a.listeners, a.parked, a.idle);
    return 0;
}
