/* test_peers.c -- the key ring's members over loopback, with a real loop:
 * peers that answer their check ready, draining, with bytes that are no
 * answer, in pieces, or not at all, and one whose listener goes away. Each
 * test ends with the loop empty. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <uv.h>

#include "pilotlight/log.h"
#include "pilotlight/peers.h"
#include "unit.h"

/* What a fake peer answers each check with. */
enum {
    READY = 0,  /* 200, kept */
    DRAINING,   /* 503 */
    GARBAGE,    /* bytes that are no HTTP answer */
    BAD_STATUS, /* a status of four digits */
    HUGE_LENGTH,/* a Content-Length that overflows */
    PIECES,     /* 200, a few bytes per write */
    CLOSING,    /* 200 with Connection: close, then closes */
    SILENT,     /* reads the check and says nothing */
};

#define PEERS_MAX 4

typedef struct peer peer;

typedef struct {
    uv_tcp_t tcp;
    peer *p;
    size_t got;
    char buf[1024];
    int open;
} fake_conn;

struct peer {
    uv_tcp_t server;
    uint16_t port;
    int mode;
    int listening;
    unsigned checks; /* checks answered (or heard, when SILENT) */
    fake_conn conns[8];
    int with_view;   /* READY answers carry X-PL-Ring: view, clock, name */
    uint64_t view;
    char name[64];   /* the name it answers by ("": its own) */
    char heard[160]; /* the X-PL-Ring of the last check it got */
};

static uv_loop_t loop;
static peer peers[PEERS_MAX];
static int64_t skew_ms = -1; /* what pl_peers keeps of the peers' clocks */
static pl_ring last_ring;
static int last_self = -3, last_agreed = -1;
static unsigned changes;

static void on_changed(void *arg, const pl_ring *ring, int self, int agreed)
{
    (void)arg;
    last_ring = *ring;
    last_self = self;
    last_agreed = agreed;
    changes++;
}

static int member(int i)
{
    char name[32];
    int n = snprintf(name, sizeof(name), "127.0.0.1:%u", (unsigned)peers[i].port);

    return pl_ring_find(&last_ring, name, (size_t)n) >= 0;
}

/* ---- the fake peers ---- */

static void conn_closed(uv_handle_t *h)
{
    ((fake_conn *)h->data)->open = 0;
}

static void conn_close(fake_conn *fc)
{
    if (fc->open && !uv_is_closing((uv_handle_t *)&fc->tcp))
        uv_close((uv_handle_t *)&fc->tcp, conn_closed);
}

static void written(uv_write_t *w, int status)
{
    (void)status;
    free(w);
}

static void send_text(fake_conn *fc, const char *text, size_t len)
{
    uv_write_t *w = malloc(sizeof(*w) + len);
    uv_buf_t b;

    memcpy((char *)(w + 1), text, len);
    b = uv_buf_init((char *)(w + 1), (unsigned)len);
    if (uv_write(w, (uv_stream_t *)&fc->tcp, &b, 1, written) != 0)
        free(w);
}

static void answer(fake_conn *fc)
{
    static const char ready[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                "Content-Length: 18\r\n\r\n{\"status\":\"ready\"}";
    peer *p = fc->p;

    p->checks++;
    switch (p->mode) {
    case READY:
        if (p->with_view) {
            char text[512];
            int n = snprintf(text, sizeof(text),
                             "HTTP/1.1 200 OK\r\nX-PL-Ring: %016llx %llu %s\r\n"
                             "Content-Length: 18\r\n\r\n{\"status\":\"ready\"}",
                             (unsigned long long)p->view,
                             (unsigned long long)time(NULL) * 1000ULL + 250, p->name);
            send_text(fc, text, (size_t)n);
            break;
        }
        send_text(fc, ready, sizeof(ready) - 1);
        break;
    case DRAINING:
        send_text(fc, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n", 55);
        break;
    case GARBAGE:
        send_text(fc, "SSH-2.0-OpenSSH_9.2\r\n\r\n", 23);
        break;
    case BAD_STATUS:
        send_text(fc, "HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n", 39);
        break;
    case HUGE_LENGTH:
        send_text(fc, "HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551615\r\n\r\n", 57);
        break;
    case PIECES:
        for (size_t off = 0; off < sizeof(ready) - 1; off += 5)
            send_text(fc, ready + off, sizeof(ready) - 1 - off < 5 ? sizeof(ready) - 1 - off : 5);
        break;
    case CLOSING: {
        static const char bye[] = "HTTP/1.1 200 OK\r\nConnection: close\r\n"
                                  "Content-Length: 2\r\n\r\nok";
        send_text(fc, bye, sizeof(bye) - 1);
        conn_close(fc);
        break;
    }
    case SILENT:
        break;
    }
}

static void alloc_cb(uv_handle_t *h, size_t size, uv_buf_t *buf)
{
    fake_conn *fc = h->data;

    (void)size;
    *buf = uv_buf_init(fc->buf + fc->got, (unsigned)(sizeof(fc->buf) - fc->got - 1));
}

static void read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    fake_conn *fc = s->data;
    char *end;

    (void)buf;
    if (n < 0) {
        conn_close(fc);
        return;
    }
    fc->got += (size_t)n;
    fc->buf[fc->got] = '\0';
    while ((end = strstr(fc->buf, "\r\n\r\n")) != NULL) {
        size_t used = (size_t)(end + 4 - fc->buf);
        const char *ring = strstr(fc->buf, "X-PL-Ring: ");
        CHECK(strncmp(fc->buf, "GET /readyz HTTP/1.1\r\n", 22) == 0);
        if (ring != NULL && ring < end) {
            const char *eol = strstr(ring, "\r\n");
            snprintf(fc->p->heard, sizeof(fc->p->heard), "%.*s", (int)(eol - ring - 11), ring + 11);
        }
        memmove(fc->buf, fc->buf + used, fc->got - used + 1);
        fc->got -= used;
        answer(fc);
    }
}

static void accept_cb(uv_stream_t *server, int status)
{
    peer *p = server->data;
    fake_conn *fc = NULL;

    if (status < 0)
        return;
    for (int i = 0; i < 8; i++)
        if (!p->conns[i].open)
            fc = &p->conns[i];
    CHECK(fc != NULL);
    if (fc == NULL)
        return;
    memset(fc, 0, sizeof(*fc));
    uv_tcp_init(&loop, &fc->tcp);
    fc->tcp.data = fc;
    fc->p = p;
    fc->open = 1;
    if (uv_accept(server, (uv_stream_t *)&fc->tcp) == 0)
        uv_read_start((uv_stream_t *)&fc->tcp, alloc_cb, read_cb);
    else
        conn_close(fc);
}

static void peer_start(peer *p, int mode)
{
    struct sockaddr_in a;
    struct sockaddr_storage bound;
    int len = sizeof(bound);

    memset(p, 0, sizeof(*p));
    p->mode = mode;
    uv_tcp_init(&loop, &p->server);
    p->server.data = p;
    uv_ip4_addr("127.0.0.1", 0, &a);
    CHECK_EQ(uv_tcp_bind(&p->server, (struct sockaddr *)&a, 0), 0);
    CHECK_EQ(uv_listen((uv_stream_t *)&p->server, 16, accept_cb), 0);
    uv_tcp_getsockname(&p->server, (struct sockaddr *)&bound, &len);
    p->port = ntohs(((struct sockaddr_in *)&bound)->sin_port);
    p->listening = 1;
}

/* Its listener and every connection go: the process died. */
static void peer_stop(peer *p)
{
    if (p->listening)
        uv_close((uv_handle_t *)&p->server, NULL);
    p->listening = 0;
    for (int i = 0; i < 8; i++)
        conn_close(&p->conns[i]);
}

/* ---- running the loop ---- */

static int stop_flag;

static void deadline_cb(uv_timer_t *t)
{
    (void)t;
    stop_flag = 1;
}

/* Runs the loop until <cond>() holds or <ms> pass. Returns whether it held. */
static int run_until(int (*cond)(void), uint64_t ms)
{
    uv_timer_t t;

    stop_flag = 0;
    uv_timer_init(&loop, &t);
    uv_timer_start(&t, deadline_cb, ms, 0);
    while (!stop_flag && !cond())
        uv_run(&loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(&loop, UV_RUN_NOWAIT);
    return cond();
}

/* Every peer has been checked <checks_wanted> more times since mark(). */
static unsigned checks_wanted, checks_at[PEERS_MAX];
static int npeers;

static void mark(int n, unsigned more)
{
    npeers = n;
    checks_wanted = more;
    for (int i = 0; i < n; i++)
        checks_at[i] = peers[i].checks;
}

static int checked_again(void)
{
    for (int i = 0; i < npeers; i++)
        if (peers[i].checks < checks_at[i] + checks_wanted)
            return 0;
    return 1;
}

static uint64_t check_ms = 30;

/* Starts pl_peers over <n> fake peers and this instance (at port 1, never
 * asked), checks every check_ms (30 ms), a check's timeout 60 ms. */
static pl_peers *start(int n)
{
    char list[256], err[128];
    size_t off = 0;
    pl_peers_opts o;
    pl_peers *ps;

    for (int i = 0; i < n; i++)
        off += (size_t)snprintf(list + off, sizeof(list) - off, "127.0.0.1:%u,",
                                (unsigned)peers[i].port);
    snprintf(list + off, sizeof(list) - off, "127.0.0.1:1");
    memset(&o, 0, sizeof(o));
    o.list = list;
    o.dns = "";
    o.self = "127.0.0.1:1";
    o.self_host = "127.0.0.1";
    o.self_port = 1;
    o.check_ms = check_ms;
    o.timeout_ms = 60;
    o.resolve_ms = 1000;
    o.skew_ms = &skew_ms;
    changes = 0;
    last_self = -3;
    last_agreed = -1;
    pl_ring_init(&last_ring);
    ps = pl_peers_start(&loop, &o, on_changed, NULL, err, sizeof(err));
    CHECK(ps != NULL);
    return ps;
}

/* Stops everything and checks that nothing is left on the loop. */
static void finish(pl_peers *ps, int n)
{
    pl_peers_stop(ps);
    for (int i = 0; i < n; i++)
        peer_stop(&peers[i]);
    uv_run(&loop, UV_RUN_DEFAULT);
    pl_peers_free(ps);
    CHECK(!uv_loop_alive(&loop));
}

/* ---- tests ---- */

static int three_members(void)
{
    return last_ring.n == 3;
}

static int only_self(void)
{
    return last_ring.n == 1;
}

/* Ready peers are members, a draining one and ones whose answer does not
 * parse (no HTTP, a status of four digits, a length that overflows) are
 * not; an answer that comes in pieces is an answer. */
static void test_who_is_a_member(void)
{
    pl_peers *ps;

    peer_start(&peers[0], READY);
    peer_start(&peers[1], PIECES);
    peer_start(&peers[2], DRAINING);
    peer_start(&peers[3], GARBAGE);
    ps = start(4);
    CHECK(last_self >= 0 && last_ring.n == 1); /* alone, to begin with */
    CHECK(run_until(three_members, 5000));
    CHECK(member(0) && member(1) && !member(2) && !member(3));
    /* many checks later, the same */
    mark(4, 4);
    CHECK(run_until(checked_again, 5000));
    CHECK(last_ring.n == 3 && member(0) && member(1));
    /* the others' answers that do not parse */
    peers[0].mode = BAD_STATUS;
    peers[1].mode = HUGE_LENGTH;
    CHECK(run_until(only_self, 5000));
    mark(4, 3);
    CHECK(run_until(checked_again, 5000));
    CHECK(last_ring.n == 1 && !member(0) && !member(1));
    finish(ps, 4);
}

static int two_members(void)
{
    return last_ring.n == 2;
}

/* A member that starts draining leaves at its next check; one whose
 * process goes leaves as soon as its kept connection ends, well before
 * two checks time out; one that answers and closes each time stays. */
static void test_leaving(void)
{
    pl_peers *ps;
    unsigned before;

    peer_start(&peers[0], READY);
    peer_start(&peers[1], CLOSING);
    ps = start(2);
    CHECK(run_until(three_members, 5000));
    mark(2, 4);
    CHECK(run_until(checked_again, 5000));
    CHECK(last_ring.n == 3);
    peers[1].mode = DRAINING;
    CHECK(run_until(two_members, 1000));
    CHECK(member(0) && !member(1));
    before = changes;
    peer_stop(&peers[0]);
    CHECK(run_until(only_self, 1000));
    CHECK(changes == before + 1);
    finish(ps, 2);
}

/* A peer that reads its check and says nothing leaves after two checks
 * unanswered; one that says nothing from the start never joins. */
static void test_silence(void)
{
    pl_peers *ps;

    peer_start(&peers[0], READY);
    peer_start(&peers[1], SILENT);
    ps = start(2);
    CHECK(run_until(two_members, 3000));
    CHECK(member(0) && !member(1));
    peers[0].mode = SILENT;
    CHECK(run_until(only_self, 2000));
    CHECK(peers[0].checks >= 2 && peers[1].checks >= 2);
    finish(ps, 2);
}

/* Leaving the ring tells at once; the checks of the others go on. */
static void test_leave(void)
{
    pl_peers *ps;

    peer_start(&peers[0], READY);
    ps = start(1);
    CHECK(run_until(two_members, 3000));
    pl_peers_leave(ps);
    CHECK(last_self == -1 && last_ring.n == 1 && member(0));
    finish(ps, 1);
}

static char self_name[] = "127.0.0.1:1";

/* The ring a peer would have with <n> fake peers and this instance. */
static uint64_t full_view(int n)
{
    pl_ring r;
    char name[32];

    pl_ring_init(&r);
    for (int i = 0; i < n; i++) {
        int len = snprintf(name, sizeof(name), "127.0.0.1:%u", (unsigned)peers[i].port);
        pl_ring_add(&r, name, (size_t)len);
    }
    pl_ring_add(&r, self_name, strlen(self_name));
    return pl_ring_digest(&r);
}

static int agreed_three(void)
{
    return last_ring.n == 3 && last_agreed == 1;
}

static int disagreed(void)
{
    return last_agreed == 0;
}

/* Each check says the checker's view and name; each answer says the
 * member's: the views agree when every member up reports this one's, and
 * not while one reports another. The largest clock difference is kept. */
static void test_views_agree(void)
{
    pl_peers *ps;

    for (int i = 0; i < 2; i++) {
        peer_start(&peers[i], READY);
        peers[i].with_view = 1;
        snprintf(peers[i].name, sizeof(peers[i].name), "127.0.0.1:%u", (unsigned)peers[i].port);
    }
    peers[0].view = peers[1].view = full_view(2);
    ps = start(2);
    CHECK(run_until(agreed_three, 5000));
    /* a check carries "<this instance's view> <its name>" */
    char want[64];
    snprintf(want, sizeof(want), "%016llx %s", (unsigned long long)full_view(2), self_name);
    mark(2, 1);
    CHECK(run_until(checked_again, 5000));
    CHECK_STR(peers[0].heard, want);
    /* their clocks run 250 ms ahead (to the second, as time() gives them) */
    CHECK(skew_ms >= 0 && skew_ms < 1300);
    peers[1].view = 12345; /* sees another ring */
    CHECK(run_until(disagreed, 5000));
    CHECK_EQ(last_ring.n, 3);
    peers[1].view = full_view(2);
    CHECK(run_until(agreed_three, 5000));
    finish(ps, 2);
}

static unsigned checks_of_1;

static int peer_1_checked(void)
{
    return peers[1].checks > checks_of_1;
}

/* A peer's check telling a view other than its last answer did makes it
 * be checked at once, not at the next tick: "agreed" follows its change
 * within a round trip. One that tells the same view asks for nothing. */
static void test_a_view_heard_is_checked_at_once(void)
{
    char name[32];
    pl_peers *ps;
    int n;

    for (int i = 0; i < 2; i++) {
        peer_start(&peers[i], READY);
        peers[i].with_view = 1;
        snprintf(peers[i].name, sizeof(peers[i].name), "127.0.0.1:%u", (unsigned)peers[i].port);
    }
    peers[0].view = peers[1].view = full_view(2);
    check_ms = 60000; /* the tick: the first, at start, only */
    ps = start(2);
    CHECK(run_until(agreed_three, 5000));
    n = snprintf(name, sizeof(name), "127.0.0.1:%u", (unsigned)peers[1].port);
    checks_of_1 = peers[1].checks;
    pl_peers_heard(ps, full_view(2), name, (size_t)n); /* what it said before */
    CHECK(!run_until(peer_1_checked, 300));
    peers[1].view = 777;
    pl_peers_heard(ps, 777, name, (size_t)n);
    CHECK(run_until(disagreed, 2000));
    peers[1].view = full_view(2);
    pl_peers_heard(ps, full_view(2), name, (size_t)n);
    CHECK(run_until(agreed_three, 2000));
    pl_peers_heard(ps, 5, "127.0.0.1:2", 11); /* no member by that name */
    check_ms = 30;
    finish(ps, 2);
}

static int two_and_agreed(void)
{
    return last_ring.n == 2 && last_agreed == 1;
}

/* A member that answers by this instance's own name is this instance under
 * a second name: never counted as another member. */
static void test_alias_of_self(void)
{
    pl_peers *ps;

    peer_start(&peers[0], READY);
    peer_start(&peers[1], READY);
    peers[0].with_view = peers[1].with_view = 1;
    snprintf(peers[0].name, sizeof(peers[0].name), "127.0.0.1:%u", (unsigned)peers[0].port);
    snprintf(peers[1].name, sizeof(peers[1].name), "%s", self_name); /* "me" */
    ps = start(2);
    mark(2, 3);
    CHECK(run_until(checked_again, 5000));
    CHECK(last_ring.n == 2 && member(0) && !member(1));
    finish(ps, 2);
}

/* A reload that changes the list: a new member is checked at once and
 * joins, one no longer named leaves, those kept stay up throughout. */
static void test_reconfigure(void)
{
    char list[128], err[128];
    pl_peers_opts o;
    pl_peers *ps;

    peer_start(&peers[0], READY);
    peer_start(&peers[1], READY);
    ps = start(1); /* peers[0] only */
    CHECK(run_until(two_members, 5000));
    CHECK(member(0) && !member(1));
    memset(&o, 0, sizeof(o));
    snprintf(list, sizeof(list), "127.0.0.1:%u,127.0.0.1:%u,127.0.0.1:1",
             (unsigned)peers[0].port, (unsigned)peers[1].port);
    o.list = list;
    o.dns = "";
    o.self = "127.0.0.1:1";
    o.self_host = "127.0.0.1";
    o.self_port = 1;
    o.check_ms = 30;
    o.timeout_ms = 60;
    o.resolve_ms = 1000;
    CHECK_EQ(pl_peers_reconfigure(ps, &o, err, sizeof(err)), 0);
    CHECK(run_until(three_members, 5000));
    CHECK(member(0) && member(1));
    snprintf(list, sizeof(list), "127.0.0.1:%u,127.0.0.1:1", (unsigned)peers[1].port);
    CHECK_EQ(pl_peers_reconfigure(ps, &o, err, sizeof(err)), 0);
    CHECK(last_ring.n == 2 && !member(0) && member(1));
    /* a list without this instance is refused, and changes nothing */
    snprintf(list, sizeof(list), "127.0.0.1:%u", (unsigned)peers[1].port);
    CHECK_EQ(pl_peers_reconfigure(ps, &o, err, sizeof(err)), -EINVAL);
    CHECK(strstr(err, "ring_self") != NULL);
    CHECK(run_until(two_and_agreed, 5000));
    finish(ps, 2);
}

int main(void)
{
    pl_log_threshold = PL_LOG_ERROR;
    CHECK_EQ(uv_loop_init(&loop), 0);
    RUN(test_who_is_a_member);
    RUN(test_leaving);
    RUN(test_silence);
    RUN(test_leave);
    RUN(test_views_agree);
    RUN(test_a_view_heard_is_checked_at_once);
    RUN(test_alias_of_self);
    RUN(test_reconfigure);
    CHECK_EQ(uv_loop_close(&loop), 0);
    return unit_finish();
}
