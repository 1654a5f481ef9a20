/* h1.h -- HTTP/1.x messages with llhttp, within limits, with no sockets:
 * one request at a time as a server reads it (a connection embeds one; the
 * fuzzers drive one directly), and one response as a client reads it (a
 * peer's answer to the key ring's check). */
#ifndef PILOTLIGHT_H1_H
#define PILOTLIGHT_H1_H

#include <stddef.h>
#include <stdint.h>

#include <llhttp.h>

#include "pilotlight/buf.h"

/* Request headers the application reads; all others are skipped unread. */
typedef enum {
    PL_HDR_CONTROLLER_ID = 0, /* x-trigger-workload-controller-id */
    PL_HDR_DEPLOYMENT_ID,     /* x-trigger-deployment-id */
    PL_HDR_DEPLOYMENT_VERSION,/* x-trigger-deployment-version */
    PL_HDR_MACHINE_CPU,       /* x-trigger-machine-cpu */
    PL_HDR_MACHINE_MEMORY,    /* x-trigger-machine-memory */
    PL_HDR_AUTHORIZATION,
    PL_HDR_RING,              /* x-pl-ring: a ring member's view, on its check */
    PL_HDR_HOST,              /* read by the parser itself */
    PL_HDR_EXPECT,            /* read by the parser itself */
    PL_HDR_TRANSFER_ENCODING, /* read by the parser itself; lines joined */
    PL_HDR__COUNT
} pl_header;

typedef struct {
    int method; /* llhttp_method_t */
    const char *path; /* without scheme, authority or query */
    size_t path_len;
    const char *query; /* after the '?', without it; NULL when none */
    size_t query_len;
    const char *header[PL_HDR__COUNT]; /* NULL when absent */
    size_t header_len[PL_HDR__COUNT];
    const char *body;
    size_t body_len;
} pl_request;

typedef struct {
    uint64_t max_header_bytes; /* request line and headers: 431 */
    uint64_t max_url_bytes;    /* request target: 414 */
    uint64_t max_body_bytes;   /* 413, from Content-Length before the body */
} pl_h1_limits;

/* What the parser tells its owner while it runs. */
typedef struct {
    void (*begin)(void *owner);   /* a request's first byte arrived */
    /* headers complete; <send_continue> when the client waits for a
     * 100 Continue before sending its body. Return 0, or a negative errno
     * to stop. */
    int (*headers)(void *owner, int send_continue);
} pl_h1_events;

typedef struct {
    llhttp_t parser;
    const pl_h1_limits *limits;
    const pl_h1_events *events;
    void *owner;
    pl_buf arena; /* this request's url, wanted header values, body */
    uint32_t url_off, url_len, body_off, body_len;
    uint32_t hdr_off[PL_HDR__COUNT], hdr_len[PL_HDR__COUNT];
    uint32_t seen;       /* bit per pl_header */
    uint32_t head_bytes;
    uint16_t nheaders;
    uint16_t err_status; /* after PL_H1_ERROR: the answer, 0 = just close */
    const char *err_msg;
    uint8_t cur_hdr, hname_len;
    char hname[40];
    unsigned in_msg : 1, keep_alive : 1, head : 1, failed : 1;
    uint8_t line; /* how far the request line's spaces were checked */
} pl_h1;

typedef enum {
    PL_H1_AGAIN = 0, /* every byte used; no complete request yet */
    PL_H1_REQUEST,   /* a complete request: read it with pl_h1_request() */
    PL_H1_ERROR,     /* malformed or over a limit: err_status, err_msg */
} pl_h1_result;

void pl_h1_init(pl_h1 *h, const pl_h1_limits *limits, const pl_h1_events *events,
                void *owner);

/* Parses up to <len> bytes; sets *used to how many it consumed (up to the
 * end of a complete request, so pipelined requests come one at a time). */
pl_h1_result pl_h1_execute(pl_h1 *h, const char *data, size_t len, size_t *used);

/* Fills <req> with views of the last complete request, valid until the next
 * pl_h1_execute() or pl_h1_release(). */
void pl_h1_request(const pl_h1 *h, pl_request *req);

/* Frees the request arena (a parked poll keeps no request bytes). */
void pl_h1_release(pl_h1 *h);

/* Hands the request arena, which the views of pl_h1_request() point into,
 * over to <out> (freed with pl_buf_free()); <h> keeps none. Returns 0, or
 * -ENOENT (nothing handed) when it is empty. */
int pl_h1_take_arena(pl_h1 *h, pl_buf *out);

/* ---- one response ---- */

/* Longest value kept of the header a response reader asks for. */
#define PL_H1_VALUE_MAX 128

/* One HTTP/1.x response to a GET, as strict as the requests: a status of
 * three digits, a Content-Length that fits (llhttp refuses the rest), at
 * most max_bytes in all. Of its headers, the one named <want> is kept. */
typedef struct {
    llhttp_t parser;
    uint32_t bytes, max_bytes;
    const char *want;    /* a header name, lower case, or NULL */
    uint8_t want_len, name_len, value_len;
    unsigned status : 10;
    unsigned complete : 1, keep_alive : 1, in_want : 1, has_value : 1, name_long : 1;
    char name[40];
    char value[PL_H1_VALUE_MAX];
} pl_h1_response;

/* Readies <r> for one response of at most <max_bytes> (head and body),
 * keeping the value of the header named <want> (lower case; NULL for
 * none; a name of 40 bytes at most). */
void pl_h1_response_init(pl_h1_response *r, uint32_t max_bytes, const char *want);

/* Reads <len> more bytes of the response. Returns 1 when it is complete:
 * r->status, r->keep_alive (0 when the peer closes after it, or when more
 * bytes came behind it than were asked for) and, when the header came,
 * r->value (r->value_len bytes, not NUL-terminated; has_value set); 0 when
 * more is to come; -EPROTO when the bytes are not a response within the
 * bounds. */
int pl_h1_response_execute(pl_h1_response *r, const char *data, size_t len);

/* The peer closed before the response said where it ends: returns 1 when
 * that end completes it (a body that runs to the close), else -EPROTO. */
int pl_h1_response_eof(pl_h1_response *r);

#endif
