/* test_conn.c -- the transport over loopback, with a real loop and plain
 * client sockets: answers in request order, an answer given later, a
 * connection held for its owner, the peer's end heard by the owner, the
 * limits, a request's bytes kept past its call, and ACK reports. Each
 * test ends with every connection closed and the loop empty. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <uv.h>

#include "pilotlight/buf.h"
#include "pilotlight/http.h"
#include "pilotlight/log.h"
#include "unit.h"

static uv_loop_t loop;

/* ---- the application side: what on_request does, by path ---- */

typedef struct {
    pl_conn *conn;      /* the last connection a request came on */
    pl_conn *pending;   /* one left unanswered (/park) */
    unsigned requests;
    unsigned closes;    /* owner told of a close */
    unsigned acked, data, ended; /* owner events */
    int last_status;
    pl_buf kept;        /* a request's bytes taken (/keep) */
    char kept_path[32];
    size_t kept_path_len;
} app_t;

static app_t app;

static void owner_closed(void *obj, pl_conn *c)
{
    (void)obj, (void)c;
    app.closes++;
    app.pending = NULL;
}

static int acked_with_request = -1;

static void owner_event(void *obj, pl_conn *c, int ev, int arg)
{
    (void)obj, (void)c;
    if (ev == PL_CONN_EV_ACKED)
        acked_with_request = arg;
    if (ev == PL_CONN_EV_ACKED)
        app.acked++;
    else if (ev == PL_CONN_EV_DATA)
        app.data++;
    else if (ev == PL_CONN_EV_END)
        app.ended++;
}

static pl_conn_owner owner = {owner_closed, owner_event, 0};

static int path_is(const pl_request *req, const char *p)
{
    return req->path_len == strlen(p) && memcmp(req->path, p, req->path_len) == 0;
}

static void on_request(void *a, pl_conn *c, const pl_request *req)
{
    char body[64];
    int n;

    (void)a;
    app.requests++;
    app.conn = c;
    if (path_is(req, "/park")) { /* answered later */
        app.pending = c;
        pl_conn_set_owner(c, &app, &owner);
        return;
    }
    if (path_is(req, "/keep")) { /* its bytes outlive the call */
        CHECK_EQ(pl_conn_take_request(c, &app.kept), 0);
        memcpy(app.kept_path, req->path, req->path_len);
        app.kept_path_len = req->path_len;
        app.pending = c;
        pl_conn_set_owner(c, &app, &owner);
        return;
    }
    n = snprintf(body, sizeof(body), "%.*s", (int)req->path_len, req->path);
    pl_conn_respond(c, 200, "text/plain", NULL, body, (size_t)n);
}

static void on_response(void *a, unsigned tag, int status)
{
    (void)a, (void)tag;
    app.last_status = status;
}

/* ---- the server and a client ---- */

static pl_http *server(uint16_t *port)
{
    pl_http_limits limits = {
        .max_connections = 100,
        .max_header_bytes = 1024,
        .max_url_bytes = 256,
        .max_body_bytes = 4096,
        .header_timeout_ms = 5000,
        .idle_timeout_ms = 5000,
    };
    pl_http_callbacks cb = {on_request, on_response};
    struct sockaddr_in a;
    pl_http *h = pl_http_new(&loop, &limits, &cb, &app);

    memset(&app, 0, sizeof(app));
    CHECK(h != NULL);
    uv_ip4_addr("127.0.0.1", 0, &a);
    CHECK_EQ(pl_http_listen(h, (struct sockaddr *)&a, 0, port), 0);
    return h;
}

/* Ends <h>: every connection closed, its handles closed, the loop empty. */
static void server_end(pl_http *h)
{
    pl_http_close_all(h);
    pl_http_stop(h);
    uv_run(&loop, UV_RUN_DEFAULT);
    pl_http_free(h);
    pl_buf_free(&app.kept);
    CHECK(!uv_loop_alive(&loop));
}

static int client(uint16_t port)
{
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    return fd;
}

static void send_all(int fd, const char *s)
{
    CHECK_EQ(send(fd, s, strlen(s), MSG_NOSIGNAL), (ssize_t)strlen(s));
}

/* What a client has read so far, and whether it saw the end. */
typedef struct {
    int fd;
    char buf[8192];
    size_t len;
    int eof;
} reader;

static reader rd;

static void read_some(void)
{
    ssize_t n = -1;

    while (!rd.eof && rd.len < sizeof(rd.buf) - 1 &&
           (n = recv(rd.fd, rd.buf + rd.len, sizeof(rd.buf) - 1 - rd.len, 0)) != 0) {
        if (n < 0) {
            if (errno != EAGAIN)
                rd.eof = 1; /* a reset */
            break;
        }
        rd.len += (size_t)n;
    }
    if (n == 0)
        rd.eof = 1;
    rd.buf[rd.len] = '\0';
}

/* Pumps the loop (and the client's reads) until <cond>() holds or 5 s
 * pass. Returns whether it held. */
static int pump(int (*cond)(void))
{
    uint64_t end = uv_hrtime() + 5000000000ULL;

    while (!cond() && uv_hrtime() < end) {
        uv_run(&loop, UV_RUN_NOWAIT);
        if (rd.fd > 0)
            read_some();
        if (!cond()) {
            struct pollfd p = {uv_backend_fd(&loop), POLLIN, 0};
            poll(&p, 1, 2);
        }
    }
    return cond();
}

static unsigned want_n;
static const char *want_text;

static int has_text(void)
{
    return strstr(rd.buf, want_text) != NULL;
}

static int n_requests(void)
{
    return app.requests >= want_n;
}

static int client_eof(void)
{
    return rd.eof;
}

static int n_closes(void)
{
    return app.closes >= want_n;
}

static int data_seen(void)
{
    return app.data > 0;
}

static int end_seen(void)
{
    return app.ended > 0;
}

static void open_client(uint16_t port)
{
    memset(&rd, 0, sizeof(rd));
    rd.fd = client(port);
}

static void close_client(void)
{
    close(rd.fd);
    rd.fd = 0;
}

/* ---- tests ---- */

/* Three requests in one write: three answers, in order, one connection. */
static void test_pipelined_answers_in_order(void)
{
    uint16_t port;
    pl_http *h = server(&port);
    const char *a, *b, *c;

    open_client(port);
    send_all(rd.fd, "GET /one HTTP/1.1\r\nHost: x\r\n\r\nGET /two HTTP/1.1\r\nHost: x\r\n\r\n"
                    "GET /three HTTP/1.1\r\nHost: x\r\n\r\n");
    want_text = "/three";
    CHECK(pump(has_text));
    a = strstr(rd.buf, "/one");
    b = strstr(rd.buf, "/two");
    c = strstr(rd.buf, "/three");
    CHECK(a != NULL && b != NULL && c != NULL && a < b && b < c);
    CHECK_EQ(app.requests, 3);
    CHECK_EQ(pl_http_connections(h), 1);
    close_client();
    server_end(h);
}

/* An answer given later: the pipelined request behind it waits, then is
 * answered after it, in order. */
static void test_an_answer_given_later(void)
{
    uint16_t port;
    pl_http *h = server(&port);

    open_client(port);
    send_all(rd.fd, "GET /park HTTP/1.1\r\nHost: x\r\n\r\nGET /after HTTP/1.1\r\nHost: x\r\n\r\n");
    want_n = 1;
    CHECK(pump(n_requests));
    CHECK(app.pending != NULL);
    pump(n_requests);
    CHECK_EQ(app.requests, 1); /* the second waits behind the first */
    CHECK_EQ(rd.len, 0);
    pl_conn_set_owner(app.pending, NULL, NULL);
    CHECK_EQ(pl_conn_respond(app.pending, 200, "text/plain", NULL, "later", 5), 0);
    want_text = "/after";
    CHECK(pump(has_text));
    CHECK(strstr(rd.buf, "later") < strstr(rd.buf, "/after"));
    close_client();
    server_end(h);
}

/* A client that goes away while its answer waits: the owner hears of the
 * close, once. */
static void test_owner_hears_the_close(void)
{
    uint16_t port;
    pl_http *h = server(&port);

    open_client(port);
    send_all(rd.fd, "GET /park HTTP/1.1\r\nHost: x\r\n\r\n");
    want_n = 1;
    CHECK(pump(n_requests));
    close_client();
    want_n = 1;
    CHECK(pump(n_closes));
    CHECK_EQ(app.closes, 1);
    CHECK(app.pending == NULL);
    server_end(h);
}

/* Held for its owner: a request arriving is kept (EV_DATA), not read,
 * until the release; the peer's end is told (EV_END) and the connection
 * stays open until closed. */
static void test_held_for_its_owner(void)
{
    uint16_t port;
    pl_http *h = server(&port);
    pl_conn *c;

    open_client(port);
    send_all(rd.fd, "GET /park HTTP/1.1\r\nHost: x\r\n\r\n");
    want_n = 1;
    CHECK(pump(n_requests));
    c = app.pending;
    pl_conn_respond(c, 200, "text/plain", NULL, "run", 3);
    pl_conn_set_owner(c, &app, &owner);
    pl_conn_hold(c);
    send_all(rd.fd, "GET /next HTTP/1.1\r\nHost: x\r\n\r\n");
    want_text = "run";
    CHECK(pump(has_text));
    CHECK(pump(data_seen));
    CHECK_EQ(app.data, 1);
    CHECK_EQ(app.requests, 1); /* kept, not read */
    pl_conn_release(c);
    want_text = "/next";
    CHECK(pump(has_text));
    CHECK_EQ(app.requests, 2);
    /* held again, then the client half-closes: told, still open */
    send_all(rd.fd, "GET /park HTTP/1.1\r\nHost: x\r\n\r\n");
    want_n = 3;
    CHECK(pump(n_requests));
    c = app.pending;
    pl_conn_hold(c);
    shutdown(rd.fd, SHUT_WR);
    CHECK(pump(end_seen));
    CHECK_EQ(app.ended, 1);
    CHECK_EQ(pl_conn_ended(c), PL_CONN_END_EOF);
    CHECK_EQ(app.closes, 0);
    pl_conn_close(c);
    want_n = 1;
    CHECK(pump(n_closes));
    close_client();
    server_end(h);
}

/* Over the header limit: 431, then the connection closes. */
static void test_limits(void)
{
    uint16_t port;
    pl_http *h = server(&port);
    char big[2048];

    open_client(port);
    snprintf(big, sizeof(big), "GET /x HTTP/1.1\r\nHost: x\r\nX-Pad: %01500d\r\n\r\n", 0);
    send_all(rd.fd, big);
    CHECK(pump(client_eof));
    CHECK(strncmp(rd.buf, "HTTP/1.1 431 ", 13) == 0);
    CHECK_EQ(app.requests, 0);
    CHECK_EQ(app.last_status, 431);
    close_client();
    server_end(h);
}

/* A request's bytes taken during its call stay valid after it: the
 * views into them still read the request. */
static void test_request_bytes_kept(void)
{
    uint16_t port;
    pl_http *h = server(&port);

    open_client(port);
    send_all(rd.fd, "POST /keep HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
    want_n = 1;
    CHECK(pump(n_requests));
    CHECK(app.kept.data != NULL && app.kept.len > 0);
    CHECK(memmem(app.kept.data, app.kept.len, "hello", 5) != NULL);
    pl_conn_set_owner(app.pending, NULL, NULL);
    pl_conn_respond(app.pending, 204, NULL, NULL, NULL, 0);
    want_text = "204";
    CHECK(pump(has_text));
    close_client();
    server_end(h);
}

static int acked_once(void)
{
    return app.acked >= 1;
}

/* ACK reports: with the owner's switch on, an answer written whole asks
 * for a report, due until the client's kernel has it, then told once as an
 * event; with it at any other value, no write asks. */
static void test_ack_report(void)
{
    uint16_t port;
    pl_http *h = server(&port);
    pl_conn *c;

    open_client(port);
    send_all(rd.fd, "GET /park HTTP/1.1\r\nHost: x\r\n\r\n");
    want_n = 1;
    CHECK(pump(n_requests));
    c = app.pending;
    CHECK_EQ(pl_conn_reports(c), 0);
    if (pl_conn_set_reports(c, PL_CONN_REPORTS_ON) != 0) {
        fprintf(stderr, "  (ACK reports refused here: not checked)\n");
        CHECK(pl_conn_reports(c) & PL_CONN_REPORTS_REFUSED);
    } else {
        pl_conn_respond(c, 200, "text/plain", NULL, "run", 3);
        pl_conn_hold(c);
        CHECK(pl_conn_reports(c) & PL_CONN_REPORT_DUE);
        CHECK(pump(acked_once));
        CHECK_EQ(app.acked, 1);
        CHECK_EQ(acked_with_request, 0); /* no request came with it */
        CHECK(!(pl_conn_reports(c) & PL_CONN_REPORT_DUE));
        CHECK_EQ(pl_conn_acknowledged(c), 0);
        pl_conn_release(c);
        /* the switch at another value: the next answer asks for none */
        send_all(rd.fd, "GET /park HTTP/1.1\r\nHost: x\r\n\r\n");
        want_n = 2;
        CHECK(pump(n_requests));
        c = app.pending;
        CHECK_EQ(pl_conn_set_reports(c, 2), 0);
        pl_conn_set_owner(c, NULL, NULL);
        pl_conn_respond(c, 200, "text/plain", NULL, "run", 3);
        CHECK_EQ(pl_conn_reports(c), 2);
    }
    close_client();
    server_end(h);
}

int main(void)
{
    pl_log_threshold = PL_LOG_ERROR;
    CHECK_EQ(uv_loop_init(&loop), 0);
    RUN(test_pipelined_answers_in_order);
    RUN(test_an_answer_given_later);
    RUN(test_owner_hears_the_close);
    RUN(test_held_for_its_owner);
    RUN(test_limits);
    RUN(test_request_bytes_kept);
    RUN(test_ack_report);
    CHECK_EQ(uv_loop_close(&loop), 0);
    return unit_finish();
}
