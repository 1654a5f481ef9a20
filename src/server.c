/* server.c -- runs the loop: listen, serve, reload on SIGHUP, upgrade on
 * SIGUSR2, and drain on SIGTERM/SIGINT. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/resource.h>

#include <netdb.h>

#include "pilotlight/broker.h"
#include "pilotlight/handover.h"
#include "pilotlight/http.h"
#include "pilotlight/lag.h"
#include "pilotlight/log.h"
#include "pilotlight/mem.h"
#include "pilotlight/notify.h"
#include "pilotlight/peers.h"
#include "pilotlight/pool.h"
#include "pilotlight/reclaim.h"
#include "pilotlight/redirect.h"
#include "pilotlight/routes.h"
#include "pilotlight/server.h"
#include "pilotlight/upgrade.h"
#include "pilotlight/uvmem.h"

#define LAG_PERIOD_MS 100 /* event-loop lag samples: ten a second */

enum { SERVING = 0, DELAYING, DRAINING, DONE };

typedef struct {
    uv_loop_t loop;
    pl_config *cfg;
    int argc;           /* what the configuration was loaded from, for reload */
    char **argv, **envp;
    pl_broker *broker;
    pl_lag *lag;            /* the event loop's lag, into the broker's metrics */
    pl_http *http;          /* controllers (and dispatch, unless split) */
    pl_http *dispatch_http; /* dispatch_listen, or NULL */
    int draining_https;     /* listeners not yet drained */
    unsigned serves[2];     /* PL_SERVE_* of http and dispatch_http */
    pl_upgrade *up;         /* a binary upgrade in progress, or NULL */
    pl_peers *peers;        /* the key ring's members, or NULL */
    pl_peers *retired[4];   /* rings a reload turned off: freed at exit */
    char exe[PATH_MAX];     /* this binary, as resolved at start */
    uv_signal_t sigterm, sigint, sighup, sigusr2;
    uv_timer_t drain_timer; /* drain delay, then the shutdown deadline */
    int phase;              /* SERVING, DELAYING, DRAINING, DONE */
} server;

static void on_drained(void *arg)
{
    server *s = arg;

    if (s->phase == DONE || --s->draining_https > 0)
        return;
    s->phase = DONE;
    PL_LOG(PL_LOG_INFO, "drained", NULL);
    pl_http_stop(s->http);
    if (s->dispatch_http)
        pl_http_stop(s->dispatch_http);
    pl_broker_stop(s->broker);
    pl_peers_stop(s->peers);
    for (int i = 0; i < 4; i++)
        pl_peers_stop(s->retired[i]);
    pl_lag_stop(s->lag);
    pl_reclaim_stop();
    uv_close((uv_handle_t *)&s->sigterm, NULL);
    uv_close((uv_handle_t *)&s->sigint, NULL);
    uv_close((uv_handle_t *)&s->sighup, NULL);
    uv_close((uv_handle_t *)&s->sigusr2, NULL);
    uv_close((uv_handle_t *)&s->drain_timer, NULL);
}

static void on_deadline(uv_timer_t *t)
{
    server *s = t->data;

    PL_LOG(PL_LOG_WARN, "closing every connection now", NULL);
    pl_http_close_all(s->http);
    if (s->dispatch_http)
        pl_http_close_all(s->dispatch_http);
}

static void start_drain(server *s)
{
    s->phase = DRAINING;
    pl_broker_close_parked(s->broker);
    uv_timer_start(&s->drain_timer, on_deadline, s->cfg->shutdown_timeout_ms, 0);
    s->draining_https = s->dispatch_http ? 2 : 1;
    pl_http_drain(s->http, on_drained, s);
    if (s->dispatch_http)
        pl_http_drain(s->dispatch_http, on_drained, s);
}

static void on_delay_over(uv_timer_t *t)
{
    start_drain(t->data);
}

static void on_signal(uv_signal_t *sig, int signum)
{
    server *s = sig->data;

    if (s->phase == DONE)
        return;
    if (s->up != NULL)
        pl_upgrade_abort(s->up, signum == SIGTERM ? "SIGTERM came first" : "SIGINT came first");
    if (s->phase != SERVING) {
        /* Whatever the phase: no new connection, none left open, exit. */
        PL_LOG(PL_LOG_WARN, "second signal: closing now", NULL);
        if (s->phase == DELAYING)
            start_drain(s); /* closes the listeners and the parked polls */
        on_deadline(&s->drain_timer);
        return;
    }
    PL_LOG(PL_LOG_INFO, "draining", "\"signal\":\"%s\"", signum == SIGTERM ? "SIGTERM" : "SIGINT");
    /* Out of the ring first: its parked polls are sent to their keys' new
     * owners now, and what still reaches it goes there too. */
    pl_peers_leave(s->peers);
    pl_broker_set_draining(s->broker);
    if (s->cfg->drain_delay_ms > 0) {
        s->phase = DELAYING;
        pl_http_wind_down(s->http);
        if (s->dispatch_http)
            pl_http_wind_down(s->dispatch_http);
        uv_timer_start(&s->drain_timer, on_delay_over, s->cfg->drain_delay_ms, 0);
    } else {
        start_drain(s);
    }
}

static void set_port(struct sockaddr *sa, uint16_t port)
{
    if (sa->sa_family == AF_INET6)
        ((struct sockaddr_in6 *)(void *)sa)->sin6_port = htons(port);
    else
        ((struct sockaddr_in *)(void *)sa)->sin_port = htons(port);
}

/* 1 when an entry of <list> before <ai> has the same address (a hosts
 * file may name one address twice). */
static int seen_before(const struct addrinfo *list, const struct addrinfo *ai)
{
    for (; list != ai; list = list->ai_next) {
        if (list->ai_family != ai->ai_family)
            continue;
        if (ai->ai_family == AF_INET6
                ? memcmp(&((struct sockaddr_in6 *)(void *)list->ai_addr)->sin6_addr,
                         &((struct sockaddr_in6 *)(void *)ai->ai_addr)->sin6_addr, 16) == 0
                : ((struct sockaddr_in *)(void *)list->ai_addr)->sin_addr.s_addr ==
                      ((struct sockaddr_in *)(void *)ai->ai_addr)->sin_addr.s_addr)
            return 1;
    }
    return 0;
}

/* The addresses of <addr>'s host into *list: a numeric host is one
 * address (<one>, in <ss>), a name is resolved now, once, before the loop
 * runs (free the list with uv_freeaddrinfo unless it is <one>). Returns 0
 * or a libuv error. */
static int resolve(server *s, const pl_listen_addr *addr, struct addrinfo *one,
                   struct sockaddr_storage *ss, struct addrinfo **list)
{
    struct addrinfo hints;
    uv_getaddrinfo_t req;
    int rc;

    memset(one, 0, sizeof(*one));
    if (uv_ip4_addr(addr->host, 0, (struct sockaddr_in *)(void *)ss) == 0 ||
        uv_ip6_addr(addr->host, 0, (struct sockaddr_in6 *)(void *)ss) == 0) {
        one->ai_family = ss->ss_family;
        one->ai_addr = (struct sockaddr *)ss;
        *list = one;
        return 0;
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    rc = uv_getaddrinfo(&s->loop, &req, NULL, addr->host, NULL, &hints); /* synchronous */
    *list = rc == 0 ? req.addrinfo : NULL;
    if (rc != 0)
        PL_LOG(PL_LOG_ERROR, "cannot resolve listen address",
               "\"host\":\"%s\",\"error\":\"%s\"", addr->host, uv_strerror(rc));
    return rc;
}

/* Listens on every address of <addr>'s host (see resolve()), all on the
 * same port: with port 0, the one the first bind picked. With several
 * addresses, IPv6 ones are bound IPv6-only so none overlaps an IPv4 one; a
 * lone [::] stays dual-stack (libuv clears IPV6_V6ONLY). An address this
 * host cannot bind (EADDRNOTAVAIL, EAFNOSUPPORT: e.g. ::1 in a container
 * without IPv6) is skipped with a warning. Returns 0 when at least one
 * listens and no other error occurred. */
static int listen_all(server *s, pl_http *h, const pl_listen_addr *addr, const char *role)
{
    struct addrinfo one, *list, *ai;
    struct sockaddr_storage ss;
    uint16_t port = addr->port;
    char where[INET6_ADDRSTRLEN + 8];
    int rc = resolve(s, addr, &one, &ss, &list), bound = 0;

    for (ai = list; ai != NULL && rc == 0; ai = ai->ai_next) {
        if (seen_before(list, ai))
            continue;
        set_port(ai->ai_addr, port);
        rc = pl_http_listen(h, ai->ai_addr,
                            list->ai_next != NULL && ai->ai_family == AF_INET6
                                ? UV_TCP_IPV6ONLY : 0,
                            &port);
        pl_log_address(where, sizeof(where), ai->ai_addr, port);
        if (rc == UV_EADDRNOTAVAIL || rc == UV_EAFNOSUPPORT) {
            PL_LOG(PL_LOG_WARN, "address not available here, skipped",
                   "\"host\":\"%s\",\"address\":\"%s\",\"error\":\"%s\"",
                   addr->host, where, uv_strerror(rc));
            rc = 0;
        } else if (rc == 0) {
            bound++;
            PL_LOG(PL_LOG_INFO, "listening",
                   "\"address\":\"%s\",\"host\":\"%s\",\"serves\":\"%s\","
                   "\"version\":\"" PL_VERSION "\"", where, addr->host, role);
        }
    }
    if (list != &one)
        uv_freeaddrinfo(list);
    if (rc == 0 && bound == 0)
        rc = UV_EADDRNOTAVAIL;
    if (rc != 0)
        PL_LOG(PL_LOG_ERROR, "cannot listen", "\"host\":\"%s\",\"port\":%u,\"error\":\"%s\"",
               addr->host, port, uv_strerror(rc));
    return rc;
}

void pl_server_hold_signals(int how)
{
    sigset_t set;

    sigemptyset(&set);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGUSR2);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigprocmask(how, &set, NULL);
}

/* The limits of a listener serving <serves>: the dispatch listener of a
 * split has a share of the descriptors of its own (pl_config_fit_nofile). */
static pl_http_limits http_limits(const pl_config *cfg, unsigned serves)
{
    pl_http_limits limits = {
        .max_connections = serves == PL_SERVE_DISPATCH ? cfg->dispatch_max_connections
                                                       : cfg->max_connections,
        .max_header_bytes = cfg->max_header_bytes,
        .max_url_bytes = cfg->max_url_bytes,
        .max_body_bytes = cfg->max_body_bytes,
        .header_timeout_ms = cfg->header_timeout_ms,
        .idle_timeout_ms = cfg->idle_timeout_ms,
    };
    return limits;
}

static void log_changed(const char *name, const char *value, void *arg)
{
    char esc[PL_CONFIG_STRING_MAX * 6 + 1];

    (void)arg;
    pl_log_escape(esc, sizeof(esc), value, strlen(value));
    PL_LOG(PL_LOG_INFO, "setting changed", "\"name\":\"%s\",\"value\":\"%s\"", name, esc);
}

/* The settings a running process cannot take up: they stay as they were. */
static void keep_fixed(const pl_config *cur, pl_config *next)
{
    if (memcmp(&cur->listen, &next->listen, sizeof(cur->listen)) != 0 ||
        memcmp(&cur->dispatch_listen, &next->dispatch_listen, sizeof(cur->listen)) != 0)
        PL_LOG(PL_LOG_WARN, "listen addresses cannot change live: kept (restart or upgrade "
               "to change them)", NULL);
    next->listen = cur->listen;
    next->dispatch_listen = cur->dispatch_listen;
}

static int ring_settings_differ(const pl_config *a, const pl_config *b)
{
    return strcmp(a->ring_peers, b->ring_peers) != 0 || strcmp(a->ring_dns, b->ring_dns) != 0 ||
           strcmp(a->ring_self, b->ring_self) != 0 || a->ring_check_ms != b->ring_check_ms ||
           a->ring_check_timeout_ms != b->ring_check_timeout_ms ||
           a->ring_resolve_ms != b->ring_resolve_ms;
}

static int start_peers(server *s);
static pl_peers_opts peers_opts(server *s);

/* The ring's settings after a reload (s->cfg is the new configuration):
 * the members as the new list or name has them, kept members keeping their
 * state, and the polls of keys that moved sent on as on any change. */
static void ring_reload(server *s, int was_on)
{
    int on = s->cfg->ring_peers[0] != '\0' || s->cfg->ring_dns[0] != '\0';
    pl_peers_opts o = peers_opts(s);
    char err[256];

    if (was_on && on) {
        if (pl_peers_reconfigure(s->peers, &o, err, sizeof(err)) != 0)
            PL_LOG(PL_LOG_ERROR, "ring settings not taken up", "\"error\":\"%s\"", err);
    } else if (on) {
        start_peers(s);
    } else if (s->peers != NULL) {
        /* No ring any more: this instance serves every key. */
        pl_peers_stop(s->peers);
        for (int i = 0; i < 4; i++)
            if (s->retired[i] == NULL) {
                s->retired[i] = s->peers;
                break;
            }
        s->peers = NULL;
        pl_broker_ring_off(s->broker);
    }
}

/* SIGHUP: the configuration is read again from where it came from at start
 * (file, environment as it was, flags) and what can change live is taken
 * up. A configuration that does not load changes nothing. */
static void reload(server *s)
{
    pl_config *next = pl_malloc(sizeof(*next));
    pl_config_action action;
    struct rlimit rl;
    char err[512];

    if (next == NULL ||
        pl_config_load(next, s->argc, s->argv, s->envp, &action, err, sizeof(err)) != 0) {
        if (next == NULL)
            snprintf(err, sizeof(err), "out of memory");
        PL_LOG(PL_LOG_ERROR, "reload failed: configuration unchanged", "\"error\":\"%s\"", err);
        pl_broker_count_reload_error(s->broker);
        pl_free(next);
        return;
    }
    pl_config_log_notes(next);
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        pl_config_fit_nofile(next, rl.rlim_cur, NULL);
    keep_fixed(s->cfg, next);
    if (pl_broker_reconfigure(s->broker, next) != 0) {
        PL_LOG(PL_LOG_ERROR, "reload failed: configuration unchanged",
               "\"error\":\"out of memory\"");
        pl_free(next);
        return;
    }
    int ring_changed = ring_settings_differ(s->cfg, next);
    int ring_was_on = s->peers != NULL;
    pl_config_diff(s->cfg, next, log_changed, NULL);
    memcpy(s->cfg, next, sizeof(*next));
    pl_free(next);
    if (ring_changed)
        ring_reload(s, ring_was_on);
    pl_http_limits limits = http_limits(s->cfg, s->serves[0]);
    pl_http_set_limits(s->http, &limits);
    limits = http_limits(s->cfg, PL_SERVE_DISPATCH);
    if (s->dispatch_http)
        pl_http_set_limits(s->dispatch_http, &limits);
    pl_log_threshold = (pl_log_level)s->cfg->log_level;
    PL_LOG(PL_LOG_INFO, "reloaded", NULL);
}

/* SIGHUP and SIGUSR2 act only while serving with no upgrade under way;
 * otherwise they are logged and ignored. Returns whether <sig> is. */
static int ignored(const server *s, const char *sig)
{
    const char *why = s->phase != SERVING ? "draining"
                      : s->up != NULL ? "an upgrade is in progress" : NULL;

    if (why != NULL)
        PL_LOG(PL_LOG_WARN, "signal ignored", "\"signal\":\"%s\",\"why\":\"%s\"", sig, why);
    return why != NULL;
}

static void on_sighup(uv_signal_t *sig, int signum)
{
    server *s = sig->data;

    (void)signum;
    if (!ignored(s, "SIGHUP"))
        reload(s);
}

/* The new process took over, or did not (then nothing changed here). */
static void on_upgrade_done(void *arg, pl_upgrade_result result)
{
    server *s = arg;

    s->up = NULL;
    pl_broker_count_upgrade(s->broker, result);
    if (result != PL_UPGRADE_HANDED_OVER || s->phase != SERVING)
        return;
    /* It serves already: stop accepting and finish what is in progress,
     * with no drain delay (nothing needs to be taken out of rotation). */
    PL_LOG(PL_LOG_INFO, "draining", "\"signal\":\"SIGUSR2\"");
    pl_broker_set_draining(s->broker);
    start_drain(s);
}

static void on_sigusr2(uv_signal_t *sig, int signum)
{
    server *s = sig->data;

    (void)signum;
    if (ignored(s, "SIGUSR2"))
        return;
    pl_upgrade_opts o = {
        .loop = &s->loop,
        .broker = s->broker,
        .https = {s->http, s->dispatch_http},
        .serves = {s->serves[0], s->serves[1]},
        .program = s->cfg->upgrade_binary[0] ? s->cfg->upgrade_binary : s->exe,
        .argv = s->argv,
        .envp = s->envp,
        .step_ms = s->cfg->upgrade_step_timeout_ms,
        .done = on_upgrade_done,
        .arg = s,
    };
    s->up = pl_upgrade_start(&o);
    if (s->up == NULL)
        pl_broker_count_upgrade(s->broker, PL_UPGRADE_FAILED);
}

/* A server context for one listener serving <serves>, not yet listening.
 * Returns it, or NULL. */
static pl_http *new_http(server *s, unsigned serves)
{
    pl_http_limits limits = http_limits(s->cfg, serves);
    pl_http_callbacks cb = {
        .on_request = pl_routes_on_request,
        .on_response = pl_routes_on_response,
    };
    pl_http *h = pl_http_new(&s->loop, &limits, &cb, pl_broker_view_of(s->broker, serves));

    if (h == NULL) {
        PL_LOG(PL_LOG_ERROR, "out of memory at start", NULL);
        return NULL;
    }
    pl_broker_attach(s->broker, h);
    return h;
}

/* Listens with <h> on every address of <addr>. Returns 0, or a negative
 * errno (logged). */
static int listen_on(server *s, pl_http *h, const pl_listen_addr *addr, unsigned serves)
{
    int rc = listen_all(s, h, addr, pl_broker_serves_name(serves));

    if (rc != 0) {
        pl_http_stop(h);
        return rc;
    }
    return 0;
}

/* Takes over the sockets of the process that started this one (a binary
 * upgrade: PL_HANDOVER_ENV names the descriptor). Returns 0 or -1. */
static int adopt(server *s, const char *fdvar)
{
    pl_http *https[2] = {s->http, s->dispatch_http};
    unsigned serves[2] = {s->serves[0], s->serves[1]};
    char *end;
    long fd = strtol(fdvar, &end, 10);
    int rc;

    if (*end != '\0' || fd < 3 || fd > 65535) {
        PL_LOG(PL_LOG_ERROR, "upgrade: bad " PL_HANDOVER_ENV, NULL);
        return -EINVAL;
    }
    if ((rc = pl_upgrade_adopt((int)fd, s->broker, https, serves)) == 0)
        return 0;
    /* Close what was adopted: without a byte written, so the old process,
     * which still holds every socket, serves on as if nothing happened. */
    for (int i = 0; i < 2; i++)
        if (https[i] != NULL)
            pl_http_close_all(https[i]);
    return rc;
}

static void on_ring(void *arg, const pl_ring *ring, int self, int agreed)
{
    pl_broker_ring_changed(arg, ring, self, agreed);
}

/* A peer's check told its view: the members may have changed. */
static void on_heard(void *arg, uint64_t digest, const char *name, size_t len)
{
    server *s = arg;

    pl_peers_heard(s->peers, digest, name, len);
}

static pl_peers_opts peers_opts(server *s)
{
    const pl_config *cfg = s->cfg;
    pl_peers_opts o = {
        .list = cfg->ring_peers,
        .dns = cfg->ring_dns,
        .self = cfg->ring_self,
        .self_host = cfg->listen.host,
        .self_port = cfg->listen.port,
        /* Asked on the dispatch listener when there is one: it keeps
         * descriptors of its own, which controllers cannot take. */
        .check_port = cfg->dispatch_listen.host[0] != '\0' ? cfg->dispatch_listen.port : 0,
        .skew_ms = &pl_broker_metrics(s->broker)->ring_clock_skew_ms,
        .check_ms = cfg->ring_check_ms,
        .timeout_ms = cfg->ring_check_timeout_ms,
        .resolve_ms = cfg->ring_resolve_ms,
    };
    return o;
}

/* Joins the key ring, when one is configured: listening already, so the
 * peers that check this instance find it serving. */
static int start_peers(server *s)
{
    const pl_config *cfg = s->cfg;
    pl_peers_opts o = peers_opts(s);
    char err[256];

    if (cfg->ring_peers[0] == '\0' && cfg->ring_dns[0] == '\0')
        return 0;
    pl_redirect_on_heard(pl_broker_ring(s->broker), on_heard, s);
    s->peers = pl_peers_start(&s->loop, &o, on_ring, s->broker, err, sizeof(err));
    if (s->peers == NULL) {
        PL_LOG(PL_LOG_ERROR, "cannot join the ring", "\"error\":\"%s\"", err);
        return -EINVAL;
    }
    pl_status_set_peers(pl_broker_status(s->broker), s->peers);
    return 0;
}

static int start(server *s)
{
    const pl_config *cfg = s->cfg;
    int split = cfg->dispatch_listen.host[0] != '\0', rc;
    const char *fdvar = getenv(PL_HANDOVER_ENV);
    ssize_t n = readlink("/proc/self/exe", s->exe, sizeof(s->exe) - 1);

    /* Resolved now: a binary replaced on disk later leaves /proc/self/exe
     * naming a deleted file, while this path names the new one. */
    s->exe[n > 0 ? n : 0] = '\0';
    s->broker = pl_broker_new(&s->loop, cfg);
    if (s->broker == NULL) {
        PL_LOG(PL_LOG_ERROR, "out of memory at start", NULL);
        return -ENOMEM;
    }
    s->lag = pl_lag_start(&s->loop, &pl_broker_metrics(s->broker)->loop_lag, LAG_PERIOD_MS);
    s->serves[0] = split ? PL_SERVE_CONTROLLERS : PL_SERVE_CONTROLLERS | PL_SERVE_DISPATCH;
    s->serves[1] = PL_SERVE_DISPATCH;
    s->http = new_http(s, s->serves[0]);
    if (s->http == NULL || (split && (s->dispatch_http = new_http(s, s->serves[1])) == NULL))
        return -ENOMEM;
    /* Handled from before "listening" is said: a SIGHUP or SIGUSR2 sent as
     * soon as the process is up must not kill it. */
    uv_signal_init(&s->loop, &s->sigterm);
    uv_signal_init(&s->loop, &s->sigint);
    uv_signal_init(&s->loop, &s->sighup);
    uv_signal_init(&s->loop, &s->sigusr2);
    uv_timer_init(&s->loop, &s->drain_timer);
    s->sigterm.data = s->sigint.data = s->sighup.data = s->sigusr2.data = s;
    s->drain_timer.data = s;
    uv_signal_start(&s->sigterm, on_signal, SIGTERM);
    uv_signal_start(&s->sigint, on_signal, SIGINT);
    uv_signal_start(&s->sighup, on_sighup, SIGHUP);
    uv_signal_start(&s->sigusr2, on_sigusr2, SIGUSR2);
    /* delivered now, to the handlers just set up, should one have come */
    pl_server_hold_signals(SIG_UNBLOCK);
    if (fdvar != NULL) {
        if ((rc = adopt(s, fdvar)) != 0)
            return rc;
    } else {
        if ((rc = listen_on(s, s->http, &cfg->listen, s->serves[0])) != 0 ||
            (split && (rc = listen_on(s, s->dispatch_http, &cfg->dispatch_listen,
                                      s->serves[1])) != 0))
            return rc;
        pl_notify("READY=1");
    }
    if ((rc = start_peers(s)) != 0)
        return rc;
    PL_LOG(PL_LOG_DEBUG, "sizes", "\"connection_bytes\":%zu,\"waiter_bytes\":%zu",
           pl_conn_size(), pl_engine_waiter_size(0));
    return 0;
}

static void close_any(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

int pl_server_run(pl_config *cfg, int argc, char **argv, char **envp)
{
    server s;
    int rc;

    memset(&s, 0, sizeof(s));
    s.cfg = cfg;
    s.argc = argc;
    s.argv = argv;
    s.envp = envp;
    pl_uvmem_install(); /* before libuv allocates anything */
    if (uv_loop_init(&s.loop) != 0)
        return 1;
    pl_reclaim_start(&s.loop);
    rc = start(&s);
    if (rc == 0)
        uv_run(&s.loop, UV_RUN_DEFAULT);
    /* A failed start leaves handles open: close them so the loop can end. */
    uv_walk(&s.loop, close_any, NULL);
    uv_run(&s.loop, UV_RUN_DEFAULT);
    uv_loop_close(&s.loop);
    if (s.broker != NULL)
        pl_status_log_ledger(pl_broker_status(s.broker));
    pl_http_free(s.http);
    pl_http_free(s.dispatch_http);
    pl_broker_free(s.broker);
    pl_peers_free(s.peers);
    for (int i = 0; i < 4; i++)
        pl_peers_free(s.retired[i]);
    pl_lag_free(s.lag);
    /* Pooled objects are out of the leak checkers' sight: one still handed
     * out now is a leak, and fails the run as valgrind would. */
    if (pl_pool_in_use_total() != 0) {
        PL_LOG(PL_LOG_ERROR, "pooled objects leaked", "\"objects\":%llu",
               (unsigned long long)pl_pool_in_use_total());
        rc = 1;
    }
    PL_LOG(PL_LOG_INFO, "exit", "\"status\":%d", rc == 0 ? 0 : 1);
    return rc == 0 ? 0 : 1;
}
