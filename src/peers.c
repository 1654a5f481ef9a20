/* peers.c -- the key ring's members: a list or a DNS name, each peer's
 * /readyz asked again and again on a connection kept between checks. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "pilotlight/h1.h"
#include "pilotlight/log.h"
#include "pilotlight/mem.h"
#include "pilotlight/peers.h"

#define HOST_MAX 256

/* The most a peer's answer to a check may take, head and body. */
#define ANSWER_MAX 4096

/* One candidate member, and its check. */
typedef struct cand {
    struct pl_peers *p;
    char name[PL_RING_NAME_MAX]; /* "host:port", as the ring names it */
    char host[HOST_MAX];
    uint16_t port;
    unsigned up : 1;        /* a member: its last check said ready */
    unsigned self : 1;      /* this instance: never checked */
    unsigned seen : 1;      /* in the last DNS answer */
    unsigned gone : 1;      /* no longer a candidate: freed once closed */
    unsigned busy : 1;      /* a check is in flight */
    unsigned resolving : 1; /* its host name is being looked up */
    unsigned given_up : 1;  /* ... and the check it was for timed out */
    unsigned open : 1;      /* its handle is open (closing included) */
    unsigned ready : 1;     /* connected: a kept connection to ask on */
    unsigned recheck : 1;   /* check again once the handle has closed */
    unsigned has_view : 1;  /* its last answer said its view */
    unsigned warned : 1;    /* its answer named another member: said once */
    unsigned alias : 1;     /* ... this one: it is this instance by another name */
    unsigned failed;        /* checks unanswered in a row */
    uint64_t view;          /* its view, as its last answer said (pl_ring_digest) */
    int64_t skew_ms;        /* its wall clock less ours, at its last answer */
    uint64_t started;       /* the check in flight began (loop ms) */
    uint64_t lost_at;       /* its kept connection last ended (loop ms) */
    uv_tcp_t tcp;
    uv_connect_t connect;
    uv_write_t write;
    uv_getaddrinfo_t resolve;
    size_t got;             /* bytes of the answer so far */
    pl_h1_response answer;  /* the check's answer, read as it comes */
    char buf[512];          /* one read */
    char ask[160 + PL_RING_NAME_MAX]; /* the check, as written */
} cand;

struct pl_peers {
    uv_loop_t *loop;
    pl_peers_opts o;
    char list[4096], dns_host[HOST_MAX], self[PL_RING_NAME_MAX], self_host[HOST_MAX];
    uint16_t dns_port;
    int use_dns;
    cand *c[PL_RING_MEMBERS_MAX];
    size_t n;
    int left;          /* this instance has left */
    int stopping;
    pl_ring ring;
    int self_index;
    pl_peers_changed_fn changed;
    void *arg;
    uv_timer_t timer;
    uv_getaddrinfo_t dns;
    int resolving;
    uint64_t resolved_at;
    int warned_self;
    int stale;         /* a peer's view differs: look the name up again */
    int agreed;        /* every member up reports this instance's view */
    uint64_t digest;   /* this instance's view (pl_ring_digest of ring) */
};

static cand *find(const pl_peers *p, const char *name, size_t len)
{
    for (size_t i = 0; i < p->n; i++)
        if (strlen(p->c[i]->name) == len && memcmp(p->c[i]->name, name, len) == 0)
            return p->c[i];
    return NULL;
}

/* Adds the candidate <name> ("host:port", <len> bytes). Returns it, or
 * NULL when it is malformed, too long, one too many or out of memory. */
static cand *add(pl_peers *p, const char *name, size_t len)
{
    cand *c;

    if (len >= PL_RING_NAME_MAX || p->n == PL_RING_MEMBERS_MAX ||
        (c = pl_malloc(sizeof(*c))) == NULL)
        return NULL;
    memset(c, 0, sizeof(*c));
    if (pl_ring_split(name, len, c->host, sizeof(c->host), &c->port) != 0) {
        pl_free(c);
        return NULL;
    }
    memcpy(c->name, name, len);
    c->name[len] = '\0';
    c->self = strcmp(c->name, p->self) == 0;
    c->p = p;
    p->c[p->n++] = c;
    return c;
}

static void drop(pl_peers *p, cand *c)
{
    for (size_t i = 0; i < p->n; i++)
        if (p->c[i] == c) {
            p->c[i] = p->c[--p->n];
            break;
        }
    pl_free(c);
}

static int counts(const cand *c)
{
    return !c->self && !c->alias && c->up && !c->gone;
}

/* Whether every member up reported this instance's view at its last
 * answer; one that reports none (an older build) is taken to agree. */
static int all_agree(const pl_peers *p)
{
    for (size_t i = 0; i < p->n; i++)
        if (counts(p->c[i]) && p->c[i]->has_view && p->c[i]->view != p->digest)
            return 0;
    return 1;
}

static void largest_skew(const pl_peers *p)
{
    int64_t most = 0;

    for (size_t i = 0; i < p->n; i++) {
        int64_t s = p->c[i]->skew_ms < 0 ? -p->c[i]->skew_ms : p->c[i]->skew_ms;
        if (counts(p->c[i]) && p->c[i]->has_view && s > most)
            most = s;
    }
    if (p->o.skew_ms != NULL)
        *p->o.skew_ms = most;
}

/* The ring from this instance (unless it left) and the peers up; tells
 * <changed> when it, or whether the members up agree on it, differs from
 * what was told last. */
static void rebuild(pl_peers *p)
{
    pl_ring next;
    int self = -1, agreed;

    pl_ring_init(&next);
    for (size_t i = 0; i < p->n; i++)
        if (counts(p->c[i]))
            pl_ring_add(&next, p->c[i]->name, strlen(p->c[i]->name));
    if (!p->left && p->self[0] != '\0') {
        pl_ring_add(&next, p->self, strlen(p->self));
        self = pl_ring_find(&next, p->self, strlen(p->self));
    }
    p->digest = pl_ring_digest(&next);
    agreed = all_agree(p);
    largest_skew(p);
    if (pl_ring_same(&next, &p->ring) && self == p->self_index && agreed == p->agreed)
        return;
    if (!pl_ring_same(&next, &p->ring) || self != p->self_index)
        PL_LOG(PL_LOG_INFO, "ring changed", "\"members\":%zu,\"self\":%d,\"agreed\":%d",
               next.n, self, agreed);
    p->ring = next;
    p->self_index = self;
    p->agreed = agreed;
    if (!p->stopping)
        p->changed(p->arg, &p->ring, self, agreed);
}

static void resolve(pl_peers *p);
static void check_start(pl_peers *p, cand *c, uint64_t now);

/* A view other than ours was seen: the DNS name is looked up again now, or
 * on the next tick if it was a moment ago. */
static void stale(pl_peers *p)
{
    uint64_t now = uv_now(p->loop);

    if (!p->use_dns || p->stopping)
        return;
    if (!p->resolving && now - p->resolved_at >= p->o.check_ms) {
        p->resolved_at = now;
        resolve(p);
    } else {
        p->stale = 1;
    }
}

void pl_peers_heard(pl_peers *p, uint64_t digest, const char *name, size_t len)
{
    cand *c;

    if (p == NULL || p->stopping)
        return;
    if (digest != p->digest)
        stale(p);
    /* A trigger only: the name is never taken as a member. A member we
     * count whose view moved is asked again now; its answer settles
     * "agreed" (and the moves that wait for it), one check per change. */
    c = find(p, name, len);
    if (c != NULL && !c->self && !c->gone && c->has_view && c->view != digest && !c->busy &&
        !c->recheck && !(c->open && !c->ready))
        check_start(p, c, uv_now(p->loop));
}

/* ---- one check ---- */

static void on_closed(uv_handle_t *h)
{
    cand *c = h->data;
    pl_peers *p = c->p;

    c->open = c->ready = 0;
    if (p->stopping)
        return;
    if (c->gone && !c->resolving) {
        drop(p, c);
    } else if (c->recheck) {
        c->recheck = 0;
        check_start(p, c, uv_now(p->loop));
    }
}

static void close_conn(cand *c)
{
    c->ready = 0;
    if (c->open && !uv_is_closing((uv_handle_t *)&c->tcp))
        uv_close((uv_handle_t *)&c->tcp, on_closed);
}

/* Reads "<view, 16 hex digits> <wall clock, epoch ms> <name>" from <c>'s
 * answer (its X-PL-Ring header). */
static void read_view(cand *c)
{
    pl_peers *p = c->p;
    const pl_h1_response *a = &c->answer;
    pl_ring_view rv;
    const char *name = rv.name;
    struct timespec ts;

    c->has_view = 0;
    if (!a->has_value || pl_ring_view_read(a->value, a->value_len, 1, &rv) != 0)
        return; /* not a view this build reads: as if none */
    clock_gettime(CLOCK_REALTIME, &ts);
    c->has_view = 1;
    c->view = rv.digest;
    /* Its clock at its answer, against ours half a round trip before we
     * read it. */
    c->skew_ms = (int64_t)rv.ms - ((int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 -
                                (int64_t)(uv_now(p->loop) - c->started) / 2);
    if (strcmp(name, c->name) != 0 && !c->warned) {
        c->warned = 1;
        c->alias = strcmp(name, p->self) == 0;
        PL_LOG(PL_LOG_ERROR, c->alias ? "ring: a member is this instance by another name: "
                                        "not counted; name each member once, alike everywhere"
                                      : "ring: a member answers by another name: views "
                                        "cannot agree; name each member once, alike everywhere",
               "\"member\":\"%s\",\"says\":\"%s\"", c->name, name);
    }
    if (rv.digest != p->digest)
        stale(p);
}

/* Ends <c>'s check with an answer: <status> (200: ready), the connection
 * kept for the next check when <keep>. */
static void answered(cand *c, int status, int keep)
{
    c->busy = 0;
    c->failed = 0;
    c->up = status == 200;
    read_view(c);
    if (!keep)
        close_conn(c);
    rebuild(c->p); /* a member's view may have changed, if nothing else */
}

/* Ends <c>'s check without an answer. <certain>: nobody listens there (a
 * refused connection), which takes it out at once; otherwise it takes
 * PL_PEERS_FAILS in a row. */
static void unanswered(cand *c, int certain)
{
    int was = c->up;

    c->busy = 0;
    close_conn(c);
    if (certain || ++c->failed >= PL_PEERS_FAILS)
        c->up = 0;
    if (c->up != was)
        rebuild(c->p);
}

/* The kept connection ended or misbehaved: its peer may be gone, so it is
 * checked again as soon as the handle has closed. Once a check period at
 * most: a peer that closes every connection it accepts is not asked in a
 * loop. Returns whether it will be.
 *
 * The loss counts as one check unanswered, so the check made at once
 * decides: a process being killed still completes handshakes on its
 * listener until the kernel has closed it, then resets them, and that
 * check fails without a refusal. */
static int lost(cand *c)
{
    uint64_t now = uv_now(c->p->loop);
    int again = c->lost_at == 0 || now - c->lost_at >= c->p->o.check_ms;

    if (again && c->failed + 1 < PL_PEERS_FAILS)
        c->failed++;
    c->lost_at = now;
    c->recheck = (unsigned)again;
    close_conn(c);
    return again;
}

static void on_alloc(uv_handle_t *h, size_t size, uv_buf_t *buf)
{
    cand *c = h->data;

    (void)size;
    *buf = uv_buf_init(c->buf, (unsigned)sizeof(c->buf));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    cand *c = s->data;
    int rc;

    if (n == 0)
        return;
    if (n < 0 || !c->busy) {
        /* Between checks, or as a check began on it: the kept connection
         * ended (or sent what nobody asked for). Asked again on a fresh
         * one at once; an answer cut short is no answer, one whose end is
         * the close is an answer. */
        if (c->busy && c->got > 0) {
            if (pl_h1_response_eof(&c->answer) == 1)
                answered(c, (int)c->answer.status, 0);
            else
                unanswered(c, 0);
        } else if (c->busy) {
            c->busy = 0;
            if (!lost(c))
                unanswered(c, 0);
        } else {
            lost(c);
        }
        return;
    }
    c->got += (size_t)n;
    rc = pl_h1_response_execute(&c->answer, buf->base, (size_t)n);
    if (rc < 0)
        unanswered(c, 0);
    else if (rc > 0)
        answered(c, (int)c->answer.status, c->answer.keep_alive);
}

static void on_written(uv_write_t *w, int status)
{
    cand *c = w->data;

    if (status < 0 && c->busy && !c->p->stopping)
        unanswered(c, 0);
}

static void ask(cand *c)
{
    int n = snprintf(c->ask, sizeof(c->ask),
                     "GET /readyz HTTP/1.1\r\nHost: pilotlight\r\nX-PL-Ring: %016llx %s\r\n\r\n",
                     (unsigned long long)c->p->digest, c->p->self[0] ? c->p->self : "-");
    uv_buf_t b = uv_buf_init(c->ask, (unsigned)n);

    c->got = 0;
    pl_h1_response_init(&c->answer, ANSWER_MAX, "x-pl-ring");
    c->write.data = c;
    if (uv_write(&c->write, (uv_stream_t *)&c->tcp, &b, 1, on_written) != 0)
        unanswered(c, 0);
}

static void on_connected(uv_connect_t *req, int status)
{
    cand *c = req->data;

    if (c->p->stopping || uv_is_closing((uv_handle_t *)&c->tcp))
        return;
    if (status < 0) {
        unanswered(c, status == UV_ECONNREFUSED);
        return;
    }
    c->ready = 1;
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0)
        unanswered(c, 0);
    else
        ask(c);
}

static void connect_to(cand *c, const struct sockaddr *sa)
{
    if (uv_tcp_init(c->p->loop, &c->tcp) != 0) {
        unanswered(c, 0);
        return;
    }
    c->tcp.data = c;
    c->open = 1;
    c->connect.data = c;
    uv_tcp_nodelay(&c->tcp, 1);
    if (uv_tcp_connect(&c->connect, &c->tcp, sa, on_connected) != 0)
        unanswered(c, 1);
}

/* Where <c> is asked: its own port, or the dispatch listeners' (the same
 * on every instance). */
static uint16_t check_port(const cand *c)
{
    return c->p->o.check_port != 0 ? c->p->o.check_port : c->port;
}

static void connect_addr(cand *c, const struct sockaddr *sa)
{
    struct sockaddr_storage ss;

    memcpy(&ss, sa, sa->sa_family == AF_INET ? sizeof(struct sockaddr_in)
                                             : sizeof(struct sockaddr_in6));
    if (ss.ss_family == AF_INET)
        ((struct sockaddr_in *)&ss)->sin_port = htons(check_port(c));
    else
        ((struct sockaddr_in6 *)&ss)->sin6_port = htons(check_port(c));
    connect_to(c, (struct sockaddr *)&ss);
}

static void on_host(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    cand *c = req->data;
    pl_peers *p = c->p;

    c->resolving = 0;
    if (p->stopping) {
        uv_freeaddrinfo(res);
        return;
    }
    if (c->gone && !c->open) {
        uv_freeaddrinfo(res);
        drop(p, c);
        return;
    }
    if (c->given_up) {
        c->given_up = 0; /* its check already failed */
    } else if (status == 0 && res != NULL &&
               (res->ai_family == AF_INET || res->ai_family == AF_INET6)) {
        connect_addr(c, res->ai_addr);
    } else {
        unanswered(c, 0);
    }
    uv_freeaddrinfo(res);
}

static void check_start(pl_peers *p, cand *c, uint64_t now)
{
    struct sockaddr_in6 a6;
    struct sockaddr_in a4;
    struct addrinfo hints;

    c->busy = 1;
    c->started = now;
    if (c->ready) {
        ask(c);
    } else if (uv_ip4_addr(c->host, check_port(c), &a4) == 0) {
        connect_to(c, (struct sockaddr *)&a4);
    } else if (uv_ip6_addr(c->host, check_port(c), &a6) == 0) {
        connect_to(c, (struct sockaddr *)&a6);
    } else {
        memset(&hints, 0, sizeof(hints));
        hints.ai_socktype = SOCK_STREAM;
        c->resolve.data = c;
        if (uv_getaddrinfo(p->loop, &c->resolve, on_host, c->host, NULL, &hints) != 0)
            unanswered(c, 0);
        else
            c->resolving = 1;
    }
}

/* ---- the DNS name ---- */

/* Whether <sa> is an address of one of this host's interfaces. */
static int local_address(const struct sockaddr *sa)
{
    struct ifaddrs *ifs, *i;
    int found = 0;

    if (getifaddrs(&ifs) != 0)
        return 0;
    for (i = ifs; i != NULL && !found; i = i->ifa_next) {
        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != sa->sa_family)
            continue;
        if (sa->sa_family == AF_INET)
            found = ((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr.s_addr ==
                    ((const struct sockaddr_in *)(const void *)sa)->sin_addr.s_addr;
        else
            found = memcmp(&((struct sockaddr_in6 *)(void *)i->ifa_addr)->sin6_addr,
                           &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr,
                           16) == 0;
    }
    freeifaddrs(ifs);
    return found;
}

/* Whether <sa> is this instance's address. Several instances on one host
 * (each on an address of its own) must each find its own, not the first
 * of the host's: the address it listens on, when that is one; any of the
 * host's when it listens on a wildcard or a name. */
static int self_address(const pl_peers *p, const struct sockaddr *sa)
{
    struct sockaddr_in a4;
    struct sockaddr_in6 a6;

    if (uv_ip4_addr(p->self_host, 0, &a4) == 0 && a4.sin_addr.s_addr != htonl(INADDR_ANY))
        return sa->sa_family == AF_INET &&
               ((const struct sockaddr_in *)(const void *)sa)->sin_addr.s_addr ==
                   a4.sin_addr.s_addr;
    if (uv_ip6_addr(p->self_host, 0, &a6) == 0 && !IN6_IS_ADDR_UNSPECIFIED(&a6.sin6_addr))
        return sa->sa_family == AF_INET6 &&
               memcmp(&((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr,
                      &a6.sin6_addr, 16) == 0;
    return local_address(sa);
}

/* "a.b.c.d:port" or "[v6]:port" of <a>, into <name>; returns its length. */
static int name_of(const struct addrinfo *a, uint16_t port, char name[PL_RING_NAME_MAX])
{
    char ip[INET6_ADDRSTRLEN];
    const void *in = a->ai_family == AF_INET
                         ? (const void *)&((struct sockaddr_in *)(void *)a->ai_addr)->sin_addr
                         : (const void *)&((struct sockaddr_in6 *)(void *)a->ai_addr)->sin6_addr;

    if (inet_ntop(a->ai_family, in, ip, sizeof(ip)) == NULL)
        return -EINVAL;
    return snprintf(name, PL_RING_NAME_MAX, a->ai_family == AF_INET ? "%s:%u" : "[%s]:%u", ip,
                    (unsigned)port);
}

static void on_dns(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    pl_peers *p = req->data;
    int changed = 0;

    p->resolving = 0;
    if (p->stopping || status != 0) {
        /* A resolver that fails for a while keeps what was known: it must
         * not empty the ring. */
        if (status != 0 && status != UV_ECANCELED)
            PL_LOG(PL_LOG_WARN, "ring: DNS name not resolved",
                   "\"name\":\"%s\",\"error\":\"%s\"", p->dns_host, uv_strerror(status));
        uv_freeaddrinfo(res);
        return;
    }
    for (size_t i = 0; i < p->n; i++)
        p->c[i]->seen = 0;
    for (struct addrinfo *a = res; a != NULL; a = a->ai_next) {
        char name[PL_RING_NAME_MAX];
        int len;
        cand *c;

        if ((a->ai_family != AF_INET && a->ai_family != AF_INET6) ||
            (len = name_of(a, p->dns_port, name)) <= 0 || len >= PL_RING_NAME_MAX)
            continue;
        if (p->self[0] == '\0' && p->dns_port == p->o.self_port &&
            self_address(p, a->ai_addr)) {
            memcpy(p->self, name, (size_t)len + 1);
            changed = 1;
        }
        if ((c = find(p, name, (size_t)len)) == NULL && (c = add(p, name, (size_t)len)) != NULL) {
            changed = 1;
            c->self = strcmp(c->name, p->self) == 0;
            /* A new address is asked at once, not at the next tick: the
             * sooner it is a member here, the sooner the views agree. */
            if (!c->self)
                check_start(p, c, uv_now(p->loop));
        }
        if (c != NULL) {
            c->seen = 1;
            c->gone = 0;
            c->self = strcmp(c->name, p->self) == 0;
        }
    }
    uv_freeaddrinfo(res);
    if (p->self[0] == '\0' && !p->warned_self) {
        p->warned_self = 1;
        PL_LOG(PL_LOG_WARN, "ring: none of the name's addresses is this host's",
               "\"name\":\"%s\",\"port\":%u", p->dns_host, (unsigned)p->dns_port);
    }
    /* Gone from the name: no longer a candidate. */
    for (size_t i = p->n; i-- > 0;) {
        cand *c = p->c[i];
        if (c->seen || c->self || c->gone)
            continue;
        c->gone = 1;
        changed |= c->up;
        c->up = 0;
        if (!c->open && !c->resolving)
            drop(p, c);
        else
            close_conn(c);
    }
    if (changed)
        rebuild(p);
}

static void resolve(pl_peers *p)
{
    struct addrinfo hints;

    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    p->dns.data = p;
    if (uv_getaddrinfo(p->loop, &p->dns, on_dns, p->dns_host, NULL, &hints) == 0)
        p->resolving = 1;
}

/* ---- the timer ---- */

static void tick(uv_timer_t *t)
{
    pl_peers *p = t->data;
    uint64_t now = uv_now(p->loop);

    if (p->use_dns && !p->resolving &&
        (now - p->resolved_at >= p->o.resolve_ms ||
         (p->stale && now - p->resolved_at >= p->o.check_ms))) {
        p->stale = 0;
        p->resolved_at = now;
        resolve(p);
    }
    for (size_t i = 0; i < p->n; i++) {
        cand *c = p->c[i];
        if (c->self || c->gone)
            continue;
        if (!c->busy && !c->recheck && !(c->open && !c->ready)) {
            check_start(p, c, now);
        } else if (c->busy && now - c->started >= p->o.timeout_ms) {
            /* a lookup still running is let finish, and then ignored */
            c->given_up = c->resolving;
            unanswered(c, 0);
        }
    }
}

static void add_named(const char *s, size_t len, void *arg)
{
    pl_peers *p = arg;

    if (find(p, s, len) == NULL)
        add(p, s, len); /* checked already: fits, and one of few enough */
}

/* Fills <p>'s candidates and names from <o>. Returns 0, or -EINVAL with
 * a message in <err>. */
static int configure(pl_peers *p, const pl_peers_opts *o, char *err, size_t errlen)
{
    if (o->list[0] == '\0' && o->dns[0] == '\0') {
        snprintf(err, errlen, "no ring: neither ring_peers nor ring_dns is set");
        return -EINVAL;
    }
    if (pl_ring_check_config(o->list, o->dns, o->self, err, errlen) != 0)
        return -EINVAL;
    p->use_dns = o->dns[0] != '\0';
    snprintf(p->list, sizeof(p->list), "%s", o->list);
    snprintf(p->self, sizeof(p->self), "%s", o->self);
    snprintf(p->self_host, sizeof(p->self_host), "%s", o->self_host ? o->self_host : "");
    if (p->use_dns)
        pl_ring_split(o->dns, strlen(o->dns), p->dns_host, sizeof(p->dns_host), &p->dns_port);
    pl_ring_each_name(p->list, add_named, p);
    return 0;
}

pl_peers *pl_peers_start(uv_loop_t *loop, const pl_peers_opts *o, pl_peers_changed_fn changed,
                         void *arg, char *err, size_t errlen)
{
    pl_peers *p = pl_malloc(sizeof(*p));

    if (p == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    memset(p, 0, sizeof(*p));
    p->loop = loop;
    p->o = *o;
    p->changed = changed;
    p->arg = arg;
    p->self_index = -2; /* not yet told */
    if (configure(p, o, err, errlen) != 0) {
        pl_peers_free(p);
        return NULL;
    }
    for (size_t i = 0; i < p->n; i++)
        p->c[i]->self = strcmp(p->c[i]->name, p->self) == 0;
    uv_timer_init(loop, &p->timer);
    p->timer.data = p;
    uv_timer_start(&p->timer, tick, 0, o->check_ms);
    rebuild(p);
    return p;
}

size_t pl_peers_each(const pl_peers *p, void (*fn)(const pl_peer_info *info, void *arg),
                     void *arg)
{
    size_t n = 0;

    for (size_t i = 0; i < p->n; i++) {
        const cand *c = p->c[i];
        pl_peer_info info = {c->name, c->self, c->self ? !p->left : c->up, c->failed};

        if (c->gone)
            continue;
        fn(&info, arg);
        n++;
    }
    return n;
}

static void named(const char *s, size_t len, void *arg)
{
    pl_peers *p = arg;
    cand *c = find(p, s, len);

    if (c == NULL)
        c = add(p, s, len); /* checked already: fits, and one of few enough */
    if (c != NULL) {
        c->seen = 1;
        c->gone = 0;
    }
}

int pl_peers_reconfigure(pl_peers *p, const pl_peers_opts *o, char *err, size_t errlen)
{
    char dns_host[HOST_MAX];
    uint16_t dns_port = 0;
    int dns_changed;

    if (o->list[0] == '\0' && o->dns[0] == '\0') {
        snprintf(err, errlen, "no ring: neither ring_peers nor ring_dns is set");
        return -EINVAL;
    }
    if (pl_ring_check_config(o->list, o->dns, o->self, err, errlen) != 0)
        return -EINVAL;
    dns_host[0] = '\0';
    if (o->dns[0] != '\0')
        pl_ring_split(o->dns, strlen(o->dns), dns_host, sizeof(dns_host), &dns_port);
    dns_changed = strcmp(dns_host, p->use_dns ? p->dns_host : "") != 0 || dns_port != p->dns_port;
    p->o = *o;
    p->use_dns = o->dns[0] != '\0';
    snprintf(p->dns_host, sizeof(p->dns_host), "%s", dns_host);
    p->dns_port = dns_port;
    snprintf(p->list, sizeof(p->list), "%s", o->list);
    /* With a DNS name and no ring_self, this instance is the name's address
     * it listens on, found again under a new name. */
    if (o->self[0] != '\0' || dns_changed)
        snprintf(p->self, sizeof(p->self), "%s", o->self);
    snprintf(p->self_host, sizeof(p->self_host), "%s", o->self_host ? o->self_host : "");
    /* A list says who the candidates are now; a DNS name says it at its
     * next answer (asked at once), until which the known ones stay. */
    for (size_t i = 0; i < p->n; i++)
        p->c[i]->seen = p->use_dns;
    if (!p->use_dns)
        pl_ring_each_name(p->list, named, p);
    for (size_t i = p->n; i-- > 0;) {
        cand *c = p->c[i];
        c->self = strcmp(c->name, p->self) == 0;
        c->alias = c->warned = 0;
        if (c->seen || c->self || c->gone)
            continue;
        c->gone = 1;
        c->up = 0;
        if (!c->open && !c->resolving)
            drop(p, c);
        else
            close_conn(c);
    }
    if (p->use_dns) {
        p->stale = 1;
        p->resolved_at = 0; /* looked up at the next tick, now */
    }
    uv_timer_start(&p->timer, tick, 0, o->check_ms);
    rebuild(p);
    return 0;
}

void pl_peers_leave(pl_peers *p)
{
    if (p == NULL || p->left)
        return;
    p->left = 1;
    rebuild(p);
}

void pl_peers_stop(pl_peers *p)
{
    if (p == NULL || p->stopping)
        return;
    p->stopping = 1;
    uv_close((uv_handle_t *)&p->timer, NULL);
    if (p->resolving)
        uv_cancel((uv_req_t *)&p->dns);
    for (size_t i = 0; i < p->n; i++) {
        cand *c = p->c[i];
        if (c->resolving)
            uv_cancel((uv_req_t *)&c->resolve);
        close_conn(c);
    }
}

void pl_peers_free(pl_peers *p)
{
    if (p == NULL)
        return;
    for (size_t i = 0; i < p->n; i++)
        pl_free(p->c[i]);
    pl_free(p);
}
