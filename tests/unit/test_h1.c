/* test_h1.c -- the HTTP/1.x request parser (h1.h): the request it gives
 * back, the limits and the status each refusal answers, chunked bodies,
 * where pipelined requests end, HEAD and keep-alive. */
#include <stdlib.h>
#include <string.h>

#include "pilotlight/h1.h"
#include "pilotlight/mem.h"
#include "unit.h"

#define MAX_HEAD 1024
#define MAX_URL 64
#define MAX_BODY 100

static const pl_h1_limits limits = {MAX_HEAD, MAX_URL, MAX_BODY};

/* What the parser told its owner. */
static struct {
    int begins, headers, send_continue, refuse;
} seen;

static void on_begin(void *owner)
{
    (void)owner;
    seen.begins++;
}

static int on_headers(void *owner, int send_continue)
{
    (void)owner;
    seen.headers++;
    seen.send_continue = send_continue;
    return seen.refuse ? -1 : 0;
}

static const pl_h1_events events = {on_begin, on_headers};

static pl_h1 h;
static pl_request req;

static void fresh(void)
{
    memset(&seen, 0, sizeof(seen));
    pl_h1_release(&h);
    pl_h1_init(&h, &limits, &events, NULL);
}

/* Feeds <s> in one piece to a fresh parser; on a request, fills req. */
static pl_h1_result parse(const char *s, size_t *used)
{
    size_t u = 0;
    pl_h1_result r;

    fresh();
    r = pl_h1_execute(&h, s, strlen(s), &u);
    if (used)
        *used = u;
    if (r == PL_H1_REQUEST)
        pl_h1_request(&h, &req);
    return r;
}

/* The status a fresh parser answers <s> with (0 when it is a request). */
static int status_of(const char *s)
{
    pl_h1_result r = parse(s, NULL);

    if (r == PL_H1_REQUEST)
        return 0;
    return r == PL_H1_ERROR ? h.err_status : -1;
}

static int view_is(const char *p, size_t len, const char *want)
{
    return p != NULL && len == strlen(want) && memcmp(p, want, len) == 0;
}

#define CHECK_VIEW(p, len, want) CHECK(view_is((p), (len), (want)))
#define CHECK_HDR(id, want) CHECK_VIEW(req.header[id], req.header_len[id], want)

static void test_request_line_and_path(void)
{
    const char *s = "GET /warm-start?since=5&x=%2F HTTP/1.1\r\nHost: broker:8080\r\n\r\n";
    size_t used = 0;

    CHECK_EQ(parse(s, &used), PL_H1_REQUEST);
    CHECK_EQ(used, strlen(s));
    CHECK_EQ(req.method, HTTP_GET);
    CHECK_VIEW(req.path, req.path_len, "/warm-start"); /* the query is not the path */
    CHECK_HDR(PL_HDR_HOST, "broker:8080");
    CHECK_EQ(req.body_len, 0);
    CHECK_EQ(seen.begins, 1);
    CHECK_EQ(seen.headers, 1);
    CHECK_EQ(seen.send_continue, 0);

    CHECK_EQ(parse("POST /warm-start HTTP/1.1\r\nHost: b\r\nContent-Length: 0\r\n\r\n", NULL),
             PL_H1_REQUEST);
    CHECK_EQ(req.method, HTTP_POST);
    CHECK_VIEW(req.path, req.path_len, "/warm-start");

    /* absolute-form: scheme and authority are not the path */
    CHECK_EQ(parse("GET http://broker:8080/metrics?x HTTP/1.1\r\nHost: broker:8080\r\n\r\n",
                   NULL),
             PL_H1_REQUEST);
    CHECK_VIEW(req.path, req.path_len, "/metrics");

    /* a bare query and an empty-looking path stay what they are */
    CHECK_EQ(parse("GET /?a=b HTTP/1.1\r\nHost: b\r\n\r\n", NULL), PL_H1_REQUEST);
    CHECK_VIEW(req.path, req.path_len, "/");
}

static void test_headers_kept(void)
{
    const char *s = "GET /warm-start HTTP/1.1\r\n"
                    "Host: b\r\n"
                    "X-Trigger-Workload-Controller-Id: ctl-1\r\n"
                    "x-trigger-deployment-id:  deployment_abc \t\r\n"
                    "X-TRIGGER-DEPLOYMENT-VERSION: 20250101.1\r\n"
                    "x-trigger-machine-cpu: 0.5\r\n"
                    "x-trigger-machine-memory: 1\r\n"
                    "Authorization: Bearer s3cret\r\n"
                    "x-trigger-deployment: not ours\r\n"
                    "x-trigger-workload-controller-ids: not ours either\r\n"
                    "User-Agent: test\r\n"
                    "\r\n";

    CHECK_EQ(parse(s, NULL), PL_H1_REQUEST);
    CHECK_HDR(PL_HDR_CONTROLLER_ID, "ctl-1");
    /* leading and trailing white space are not the value */
    CHECK_HDR(PL_HDR_DEPLOYMENT_ID, "deployment_abc");
    CHECK_HDR(PL_HDR_DEPLOYMENT_VERSION, "20250101.1");
    CHECK_HDR(PL_HDR_MACHINE_CPU, "0.5");
    CHECK_HDR(PL_HDR_MACHINE_MEMORY, "1");
    CHECK_HDR(PL_HDR_AUTHORIZATION, "Bearer s3cret");
    CHECK(req.header[PL_HDR_EXPECT] == NULL);
    CHECK(req.header[PL_HDR_TRANSFER_ENCODING] == NULL);

    /* present and empty is not absent */
    CHECK_EQ(parse("GET / HTTP/1.1\r\nHost: b\r\nx-trigger-machine-cpu:\r\n\r\n", NULL),
             PL_H1_REQUEST);
    CHECK(req.header[PL_HDR_MACHINE_CPU] != NULL);
    CHECK_EQ(req.header_len[PL_HDR_MACHINE_CPU], 0);
    CHECK(req.header[PL_HDR_CONTROLLER_ID] == NULL);

    /* one of ours twice: which one counts would be a guess */
    CHECK_EQ(status_of("GET / HTTP/1.1\r\nHost: b\r\nx-trigger-machine-cpu: 1\r\n"
                       "X-Trigger-Machine-Cpu: 2\r\n\r\n"),
             400);
    CHECK_STR(h.err_msg, "duplicate header");
    CHECK_EQ(status_of("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), 400);
    /* someone else's twice: not ours to judge */
    CHECK_EQ(status_of("GET / HTTP/1.1\r\nHost: b\r\nAccept: a\r\nAccept: b\r\n\r\n"), 0);
}

static void test_host_rules(void)
{
    CHECK_EQ(status_of("GET / HTTP/1.1\r\n\r\n"), 400);
    CHECK_STR(h.err_msg, "missing Host header");
    CHECK_EQ(status_of("GET / HTTP/1.0\r\n\r\n"), 0); /* 1.0 need not name one */
    CHECK_EQ(status_of("GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n"), 0);
    CHECK_EQ(status_of("GET / HTTP/1.1\r\nHost: a, b\r\n\r\n"), 400);
    CHECK_STR(h.err_msg, "invalid Host header");
    CHECK_EQ(status_of("GET / HTTP/1.1\r\nHost: a,b\r\n\r\n"), 400);
    CHECK_EQ(status_of("GET / HTTP/1.1\r\nHost: a/b\r\n\r\n"), 400);
    CHECK_EQ(status_of("GET / HTTP/1.1\r\nHost: user@a\r\n\r\n"), 400);
    CHECK_EQ(status_of("GET / HTTP/1.1\r\nHost: a\xc3\xa9\r\n\r\n"), 400);
}

static void test_malformed_is_400_unknown_method_501(void)
{
    CHECK_EQ(status_of("GET /\r\n\r\n"), 400); /* HTTP/0.9 */
    CHECK_EQ(status_of("GET  / HTTP/1.1\r\nHost: b\r\n\r\n"), 400);
    CHECK_STR(h.err_msg, "malformed request line");
    CHECK_EQ(status_of("GET / HTTP/1.1 \r\nHost: b\r\n\r\n"), 400);
    CHECK_EQ(status_of("GET / HTTP/2.0\r\nHost: b\r\n\r\n"), 400);
    CHECK_EQ(status_of("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"), 400); /* TLS */
    CHECK_EQ(status_of("GET / HTTP/1.1\r\nHost : b\r\n\r\n"), 400); /* space before ':' */
    CHECK_EQ(status_of("GET / HTTP/1.1\r\nHost: b\r\nBad\rHeader: x\r\n\r\n"), 400);
    CHECK_EQ(status_of("GET / HTTP/1.1\r\nHost: b\r\n: no name\r\n\r\n"), 400);
    CHECK_EQ(status_of("BREW /pot HTTP/1.1\r\nHost: b\r\n\r\n"), 501);
    CHECK_STR(h.err_msg, "method not implemented");
    CHECK_EQ(status_of("B(EW /pot HTTP/1.1\r\nHost: b\r\n\r\n"), 400); /* not a token */
    /* blank lines before a request are skipped, not a request line */
    CHECK_EQ(status_of("\r\n\r\nGET / HTTP/1.1\r\nHost: b\r\n\r\n"), 0);
}

/* A request of <n> bytes of target "/aaa...". */
static char *with_target(size_t n, const char *tail)
{
    static char buf[512];

    strcpy(buf, "GET /");
    memset(buf + 5, 'a', n - 1);
    strcpy(buf + 4 + n, tail);
    return buf;
}

static void test_url_limit_414(void)
{
    const char *tail = " HTTP/1.1\r\nHost: b\r\n\r\n";

    CHECK_EQ(status_of(with_target(MAX_URL, tail)), 0);
    CHECK_EQ(req.path_len, MAX_URL);
    CHECK_EQ(status_of(with_target(MAX_URL + 1, tail)), 414);
    CHECK_STR(h.err_msg, "request target too long");
}

static void test_header_limits_431(void)
{
    char buf[4096];
    size_t n;

    /* one long header: every byte of the head counts */
    n = (size_t)snprintf(buf, sizeof(buf), "GET / HTTP/1.1\r\nHost: b\r\nX-Pad: ");
    memset(buf + n, 'p', MAX_HEAD);
    strcpy(buf + n + MAX_HEAD, "\r\n\r\n");
    CHECK_EQ(status_of(buf), 431);
    CHECK_STR(h.err_msg, "request headers too large");

    /* just under the limit passes: the same head with a shorter value */
    n = (size_t)snprintf(buf, sizeof(buf), "GET / HTTP/1.1\r\nHost: b\r\nX-Pad: ");
    memset(buf + n, 'p', MAX_HEAD - 64);
    strcpy(buf + n + MAX_HEAD - 64, "\r\n\r\n");
    CHECK_EQ(status_of(buf), 0);

    /* 101 short headers: too many, though small */
    n = (size_t)snprintf(buf, sizeof(buf), "GET / HTTP/1.1\r\nHost: b\r\n");
    for (int i = 0; i < 100; i++)
        n += (size_t)snprintf(buf + n, sizeof(buf) - n, "a:\r\n");
    strcpy(buf + n, "\r\n");
    {
        static const pl_h1_limits roomy = {1 << 20, MAX_URL, MAX_BODY};
        size_t used;
        fresh();
        h.limits = &roomy;
        CHECK_EQ(pl_h1_execute(&h, buf, strlen(buf), &used), PL_H1_ERROR);
        CHECK_EQ(h.err_status, 431);
        CHECK_STR(h.err_msg, "too many request headers");
        /* 100 of them pass */
        fresh();
        h.limits = &roomy;
        memmove(buf + n - 4, buf + n, 3); /* one "a:\r\n" fewer */
        CHECK_EQ(pl_h1_execute(&h, buf, strlen(buf), &used), PL_H1_REQUEST);
        h.limits = &limits;
    }
}

static void test_body_limit_413(void)
{
    char buf[512];

    snprintf(buf, sizeof(buf),
             "POST /warm-start HTTP/1.1\r\nHost: b\r\nContent-Length: %d\r\n\r\n", MAX_BODY + 1);
    /* refused from the header, before a byte of the body */
    CHECK_EQ(status_of(buf), 413);
    CHECK_EQ(seen.headers, 0);
    CHECK_STR(h.err_msg, "request body too large");

    snprintf(buf, sizeof(buf), "POST / HTTP/1.1\r\nHost: b\r\nContent-Length: %d\r\n\r\n%0*d",
             MAX_BODY, MAX_BODY, 7);
    CHECK_EQ(status_of(buf), 0);
    CHECK_EQ(req.body_len, MAX_BODY);
    CHECK(req.body[MAX_BODY - 1] == '7' && req.body[0] == '0');

    /* chunked: a chunk announced past the limit, before its data */
    CHECK_EQ(status_of("POST / HTTP/1.1\r\nHost: b\r\nTransfer-Encoding: chunked\r\n\r\n"
                       "65\r\n"),
             413);
    /* chunks each within it, together over it */
    snprintf(buf, sizeof(buf),
             "POST / HTTP/1.1\r\nHost: b\r\nTransfer-Encoding: chunked\r\n\r\n"
             "32\r\n%050d\r\n32\r\n%050d\r\n1\r\nx\r\n0\r\n\r\n", 1, 2);
    CHECK_EQ(status_of(buf), 413);
}

static void test_expect(void)
{
    CHECK_EQ(status_of("POST / HTTP/1.1\r\nHost: b\r\nExpect: 100-continue\r\n"
                       "Content-Length: 5\r\n\r\n"),
             -1); /* waits for the body */
    CHECK_EQ(seen.headers, 1);
    CHECK_EQ(seen.send_continue, 1);

    /* no body to wait for: nothing to continue */
    CHECK_EQ(status_of("GET / HTTP/1.1\r\nHost: b\r\nExpect: 100-Continue\r\n\r\n"), 0);
    CHECK_EQ(seen.send_continue, 0);

    CHECK_EQ(status_of("POST / HTTP/1.1\r\nHost: b\r\nExpect: 100-continue-please\r\n"
                       "Content-Length: 5\r\n\r\nhello"),
             417);
    CHECK_EQ(status_of("POST / HTTP/1.1\r\nHost: b\r\nExpect: 102-processing\r\n"
                       "Content-Length: 5\r\n\r\nhello"),
             417);
    CHECK_STR(h.err_msg, "unsupported Expect header");
    CHECK_EQ(seen.headers, 0);
}

static void test_transfer_codings(void)
{
    const char *head = "POST / HTTP/1.1\r\nHost: b\r\n";
    char buf[512];

    snprintf(buf, sizeof(buf), "%sTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", head);
    CHECK_EQ(status_of(buf), 501);
    CHECK_STR(h.err_msg, "unsupported transfer coding");
    snprintf(buf, sizeof(buf), "%sTransfer-Encoding: chunked, gzip\r\n\r\n", head);
    CHECK_EQ(status_of(buf), 400); /* the length is unknown */
    /* a list on two adjacent lines is one list */
    snprintf(buf, sizeof(buf),
             "%sTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", head);
    CHECK_EQ(status_of(buf), 501);
    /* ... and apart, with one of ours between, is refused too */
    snprintf(buf, sizeof(buf),
             "%sTransfer-Encoding: chunked\r\nx-trigger-machine-cpu: 1\r\n"
             "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", head);
    CHECK_EQ(status_of(buf), 501);
    snprintf(buf, sizeof(buf), "%sTransfer-Encoding: ChunKed \r\n\r\n0\r\n\r\n", head);
    CHECK_EQ(status_of(buf), 0);
    CHECK_EQ(req.body_len, 0);
    /* a length and chunked together: a smuggling shape, refused */
    snprintf(buf, sizeof(buf),
             "%sContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", head);
    CHECK_EQ(status_of(buf), 400);
}

static void test_chunked_body(void)
{
    const char *s = "POST /warm-start HTTP/1.1\r\nHost: b\r\nTransfer-Encoding: chunked\r\n\r\n"
                    "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nTrailer: t\r\n\r\n"
                    "GET / HTTP/1.1\r\nHost: b\r\n\r\n";
    size_t first = strlen(s) - strlen("GET / HTTP/1.1\r\nHost: b\r\n\r\n"), used = 0;

    CHECK_EQ(parse(s, &used), PL_H1_REQUEST);
    CHECK_EQ(used, first); /* ends after the trailer, not before */
    CHECK_VIEW(req.body, req.body_len, "hello world");

    /* the same bytes one at a time */
    fresh();
    {
        pl_h1_result r = PL_H1_AGAIN;
        size_t i = 0;
        while (i < first && r == PL_H1_AGAIN) {
            r = pl_h1_execute(&h, s + i, 1, &used);
            CHECK_EQ(used, 1);
            i++;
        }
        CHECK_EQ(r, PL_H1_REQUEST);
        CHECK_EQ(i, first);
        pl_h1_request(&h, &req);
        CHECK_VIEW(req.body, req.body_len, "hello world");
        CHECK_VIEW(req.path, req.path_len, "/warm-start");
    }

    CHECK_EQ(status_of("POST / HTTP/1.1\r\nHost: b\r\nTransfer-Encoding: chunked\r\n\r\n"
                       "zz\r\nhello\r\n0\r\n\r\n"),
             400); /* not a chunk size */
}

/* Feeds <s> to one parser, request by request, recording each one's path and
 * body ("path|body") and the bytes each took. Returns how many it found. */
static int pipeline(const char *s, char out[][64], size_t *took, int max)
{
    size_t off = 0, len = strlen(s), used;
    int n = 0;

    fresh();
    while (off < len && n < max) {
        pl_h1_result r = pl_h1_execute(&h, s + off, len - off, &used);
        CHECK(used > 0 && used <= len - off);
        if (r != PL_H1_REQUEST)
            return -1;
        pl_h1_request(&h, &req);
        snprintf(out[n], 64, "%.*s|%.*s", (int)req.path_len, req.path, (int)req.body_len,
                 req.body);
        took[n++] = used;
        off += used;
    }
    return n;
}

static void test_pipelining_boundaries(void)
{
    const char *a = "POST /a HTTP/1.1\r\nHost: b\r\nContent-Length: 9\r\n\r\nGET /x HT";
    const char *b = "GET /b HTTP/1.1\r\nHost: b\r\n\r\n";
    const char *c = "POST /c HTTP/1.1\r\nHost: b\r\nTransfer-Encoding: chunked\r\n\r\n"
                    "2\r\nhi\r\n0\r\n\r\n";
    char all[512], got[4][64];
    size_t took[4];

    snprintf(all, sizeof(all), "%s%s%s", a, b, c);
    CHECK_EQ(pipeline(all, got, took, 4), 3);
    /* a body that looks like a request is a body */
    CHECK_STR(got[0], "/a|GET /x HT");
    CHECK_STR(got[1], "/b|");
    CHECK_STR(got[2], "/c|hi");
    CHECK_EQ(took[0], strlen(a));
    CHECK_EQ(took[1], strlen(b));
    CHECK_EQ(took[2], strlen(c));
    CHECK_EQ(seen.begins, 3);

    /* the second request's first bytes, alone: it waits for the rest */
    {
        size_t used;
        fresh();
        CHECK_EQ(pl_h1_execute(&h, all, strlen(a) + 5, &used), PL_H1_REQUEST);
        CHECK_EQ(used, strlen(a));
        CHECK_EQ(pl_h1_execute(&h, all + used, 5, &used), PL_H1_AGAIN);
        CHECK_EQ(used, 5);
        CHECK_EQ(pl_h1_execute(&h, all + strlen(a) + 5, strlen(b) - 5, &used), PL_H1_REQUEST);
        pl_h1_request(&h, &req);
        CHECK_VIEW(req.path, req.path_len, "/b");
        CHECK_EQ(req.body_len, 0); /* nothing of /a's body is left */
        CHECK(req.header[PL_HDR_TRANSFER_ENCODING] == NULL);
    }

    /* an error after a good request does not undo it */
    snprintf(all, sizeof(all), "%sGET  /bad HTTP/1.1\r\n\r\n", b);
    CHECK_EQ(pipeline(all, got, took, 4), -1);
    CHECK_EQ(h.err_status, 400);
}

static void test_head_and_keep_alive(void)
{
    CHECK_EQ(status_of("HEAD /healthz HTTP/1.1\r\nHost: b\r\n\r\n"), 0);
    CHECK_EQ(req.method, HTTP_HEAD);
    CHECK(h.head);
    CHECK(h.keep_alive);
    CHECK_EQ(status_of("GET /healthz HTTP/1.1\r\nHost: b\r\n\r\n"), 0);
    CHECK(!h.head);

    CHECK_EQ(status_of("GET / HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n"), 0);
    CHECK(!h.keep_alive);
    CHECK_EQ(status_of("GET / HTTP/1.1\r\nHost: b\r\nConnection: Keep-Alive\r\n\r\n"), 0);
    CHECK(h.keep_alive);
    CHECK_EQ(status_of("GET / HTTP/1.0\r\n\r\n"), 0);
    CHECK(!h.keep_alive);
    CHECK_EQ(status_of("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"), 0);
    CHECK(h.keep_alive);
    /* an upgrade is answered as HTTP/1.1, then the connection ends */
    CHECK_EQ(status_of("GET / HTTP/1.1\r\nHost: b\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"),
             0);
    CHECK(!h.keep_alive);

    /* a HEAD's answer has no body, so the next request starts at once */
    {
        char got[2][64];
        size_t took[2];
        CHECK_EQ(pipeline("HEAD / HTTP/1.1\r\nHost: b\r\n\r\nGET /n HTTP/1.1\r\nHost: b\r\n\r\n",
                          got, took, 2),
                 2);
        CHECK_STR(got[1], "/n|");
        CHECK(!h.head);
    }
}

static void test_owner_may_refuse(void)
{
    fresh();
    seen.refuse = 1;
    {
        const char *s = "POST / HTTP/1.1\r\nHost: b\r\nContent-Length: 2\r\n\r\nhi";
        size_t used;
        CHECK_EQ(pl_h1_execute(&h, s, strlen(s), &used), PL_H1_ERROR);
        CHECK_EQ(h.err_status, 0); /* just close */
        CHECK_EQ(seen.headers, 1);
    }
    seen.refuse = 0;
}

static void test_arena_and_out_of_memory(void)
{
    pl_buf out = {0};

    CHECK_EQ(status_of("POST / HTTP/1.1\r\nHost: b\r\nContent-Length: 4\r\n\r\nbody"), 0);
    CHECK_EQ(pl_h1_take_arena(&h, &out), 0);
    CHECK(out.data != NULL);
    /* the views stay valid in the arena handed over */
    CHECK(req.body >= out.data && req.body + req.body_len <= out.data + out.len);
    CHECK_VIEW(req.body, req.body_len, "body");
    pl_buf_free(&out);
    CHECK_EQ(pl_h1_take_arena(&h, &out), -ENOENT); /* nothing left */

    fresh();
    CHECK_EQ(pl_h1_take_arena(&h, &out), -ENOENT);

    /* an arena that cannot grow: 503, not a crash */
    fresh();
    pl_mem_fail_after(1, 1);
    {
        const char *s = "GET /warm-start HTTP/1.1\r\nHost: b\r\n\r\n";
        size_t used;
        CHECK_EQ(pl_h1_execute(&h, s, strlen(s), &used), PL_H1_ERROR);
        CHECK_EQ(h.err_status, 503);
    }
    pl_mem_fail_after(0, 0);
}

/* ---- one response, as the ring's check reads a peer's answer ---- */

/* Reads <text> as one response, cut into pieces of <step> bytes (0: whole),
 * with an EOF after when <eof>. Returns what the last call returned. */
static int read_response(pl_h1_response *r, const char *text, size_t step, int eof,
                         const char *want)
{
    size_t len = strlen(text), off = 0;
    int rc = 0;

    pl_h1_response_init(r, 4096, want);
    while (off < len && rc == 0) {
        size_t n = step == 0 || len - off < step ? len - off : step;
        rc = pl_h1_response_execute(r, text + off, n);
        off += n;
    }
    if (rc == 0 && eof)
        rc = pl_h1_response_eof(r);
    return rc;
}

static void test_response_split_anywhere(void)
{
    static const char *ok =
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Pilotlight-View: 3:ab12\r\n"
        "Content-Length: 18\r\n\r\n{\"status\":\"ready\"}";
    pl_h1_response r;

    for (size_t step = 0; step <= strlen(ok); step++) {
        CHECK_EQ(read_response(&r, ok, step, 0, "x-pilotlight-view"), 1);
        CHECK_EQ(r.status, 200);
        CHECK(r.keep_alive && r.has_value);
        CHECK(r.value_len == 6 && memcmp(r.value, "3:ab12", 6) == 0);
    }
    /* another header asked for, or none: no value */
    CHECK_EQ(read_response(&r, ok, 0, 0, "x-other"), 1);
    CHECK(!r.has_value);
    CHECK_EQ(read_response(&r, ok, 0, 0, NULL), 1);
    CHECK(!r.has_value);
    /* a draining peer's 503, and one that closes after its answer */
    CHECK_EQ(read_response(&r, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",
                           3, 0, NULL), 1);
    CHECK(r.status == 503 && r.keep_alive);
    CHECK_EQ(read_response(&r, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n"
                               "\r\nok", 0, 0, NULL), 1);
    CHECK(r.status == 200 && !r.keep_alive);
    /* a body that runs to the close: complete at the EOF, not before */
    CHECK_EQ(read_response(&r, "HTTP/1.0 200 OK\r\n\r\nready", 0, 0, NULL), 0);
    CHECK_EQ(pl_h1_response_eof(&r), 1);
    CHECK(r.status == 200 && !r.keep_alive);
    /* cut short: no answer */
    CHECK_EQ(read_response(&r, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", 0, 1, NULL),
             -EPROTO);
    CHECK_EQ(read_response(&r, "HTTP/1.1 200 O", 0, 1, NULL), -EPROTO);
    /* chunked */
    CHECK_EQ(read_response(&r, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                               "2\r\nok\r\n0\r\n\r\n", 1, 0, NULL), 1);
    CHECK(r.status == 200 && r.keep_alive);
}

static void test_response_refuses_what_does_not_parse(void)
{
    static const char *bad[] = {
        "HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n",
        "HTTP/1.1 20 OK\r\nContent-Length: 0\r\n\r\n",
        "HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551615\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551616\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx",
        "HTTP/1.1 200 OK\r\nContent-Length: 0x10\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "HTTP/2 200\r\n\r\n",
        "GET /readyz HTTP/1.1\r\n\r\n",
        "garbage\r\n\r\n",
        "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
        "HTTP/1.1 200 OK\nContent-Length: 0\n\rX\r\n\r\n",
    };
    pl_h1_response r;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = read_response(&r, bad[i], 0, 1, NULL);
        if (rc != -EPROTO)
            fprintf(stderr, "  accepted response %zu (status %u)\n", i, (unsigned)r.status);
        CHECK_EQ(rc, -EPROTO);
    }
    /* a folded header line (obs-fold) is no answer a peer of ours sends:
     * refused, or read with the fold as part of the value; never a crash */
    int rc = read_response(&r, "HTTP/1.1 200 OK\r\nX-Pilotlight-View: 1\r\n 2\r\n"
                               "Content-Length: 0\r\n\r\n", 1, 1, "x-pilotlight-view");
    CHECK(rc == -EPROTO || (rc == 1 && r.status == 200));
}

static void test_response_bounds(void)
{
    char big[8192];
    pl_h1_response r;
    int n;

    /* over the reader's bound: refused, whether the bytes are head or body */
    n = snprintf(big, sizeof(big), "HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n");
    memset(big + n, 'x', 5000);
    big[n + 5000] = '\0';
    CHECK_EQ(read_response(&r, big, 512, 0, NULL), -EPROTO);
    n = snprintf(big, sizeof(big), "HTTP/1.1 200 OK\r\nX-Long: ");
    memset(big + n, 'y', 5000);
    strcpy(big + n + 5000, "\r\nContent-Length: 0\r\n\r\n");
    CHECK_EQ(read_response(&r, big, 0, 0, NULL), -EPROTO);
    /* a wanted value longer than PL_H1_VALUE_MAX: refused, not cut */
    n = snprintf(big, sizeof(big), "HTTP/1.1 200 OK\r\nX-Pilotlight-View: ");
    memset(big + n, 'z', PL_H1_VALUE_MAX + 1);
    strcpy(big + n + PL_H1_VALUE_MAX + 1, "\r\nContent-Length: 0\r\n\r\n");
    CHECK_EQ(read_response(&r, big, 7, 0, "x-pilotlight-view"), -EPROTO);
    /* bytes behind the answer: complete, but the connection is not kept */
    CHECK_EQ(read_response(&r, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nHTTP/1.1 200 OK\r\n",
                           0, 0, NULL), 1);
    CHECK(r.status == 200 && !r.keep_alive);
    CHECK_EQ(pl_h1_response_execute(&r, "more", 4), 1);
    CHECK(!r.keep_alive);
}

int main(void)
{
    RUN(test_request_line_and_path);
    RUN(test_headers_kept);
    RUN(test_host_rules);
    RUN(test_malformed_is_400_unknown_method_501);
    RUN(test_url_limit_414);
    RUN(test_header_limits_431);
    RUN(test_body_limit_413);
    RUN(test_expect);
    RUN(test_transfer_codings);
    RUN(test_chunked_body);
    RUN(test_pipelining_boundaries);
    RUN(test_head_and_keep_alive);
    RUN(test_owner_may_refuse);
    RUN(test_arena_and_out_of_memory);
    RUN(test_response_split_anywhere);
    RUN(test_response_refuses_what_does_not_parse);
    RUN(test_response_bounds);
    pl_h1_release(&h);
    return unit_finish();
}
