/* h1.c -- parsing one HTTP/1.x request at a time, within limits. */
#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <strings.h>

#include "pilotlight/buf.h"
#include "pilotlight/h1.h"
#include "pilotlight/mem.h"

#define MAX_HEADERS 100
#define H_OTHER 255

/* The headers kept, by the length of their names: no two have the same, so
 * the length picks the one name to compare (a repeated length would be an
 * overridden initializer, which the build refuses). */
#define KNOWN(s, id) [sizeof(s) - 1] = {s, id}
static const struct {
    const char *name;
    uint8_t id;
} known_headers[sizeof(((pl_h1 *)0)->hname) + 1] = {
    KNOWN("x-trigger-workload-controller-id", PL_HDR_CONTROLLER_ID),
    KNOWN("x-trigger-deployment-id", PL_HDR_DEPLOYMENT_ID),
    KNOWN("x-trigger-deployment-version", PL_HDR_DEPLOYMENT_VERSION),
    KNOWN("x-trigger-machine-cpu", PL_HDR_MACHINE_CPU),
    KNOWN("x-trigger-machine-memory", PL_HDR_MACHINE_MEMORY),
    KNOWN("authorization", PL_HDR_AUTHORIZATION),
    KNOWN("x-pl-ring", PL_HDR_RING),
    KNOWN("host", PL_HDR_HOST),
    KNOWN("expect", PL_HDR_EXPECT),
    KNOWN("transfer-encoding", PL_HDR_TRANSFER_ENCODING),
};
#undef KNOWN

static pl_h1 *parser_h1(llhttp_t *p)
{
    return container_of(p, pl_h1, parser);
}

/* Returns -1, what llhttp takes from a callback as an error. */
static int fail(pl_h1 *h, int status, const char *msg)
{
    h->failed = 1;
    h->err_status = (uint16_t)status;
    h->err_msg = msg;
    return -1;
}

static int arena_put(pl_h1 *h, const char *at, size_t len)
{
    return pl_buf_append(&h->arena, at, len) == 0 ? 0 : fail(h, 503, "out of memory");
}

static int count_head(pl_h1 *h, size_t len)
{
    h->head_bytes += (uint32_t)len;
    if (h->head_bytes > h->limits->max_header_bytes)
        return fail(h, 431, "request headers too large");
    return 0;
}

static int on_message_begin(llhttp_t *p)
{
    pl_h1 *h = parser_h1(p);

    h->in_msg = 1;
    h->head = 0;
    h->arena.len = h->url_off = h->url_len = h->body_off = h->body_len = 0;
    h->seen = h->head_bytes = h->nheaders = 0;
    h->cur_hdr = H_OTHER;
    h->hname_len = 0;
    if (h->events && h->events->begin)
        h->events->begin(h->owner);
    return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t len)
{
    pl_h1 *h = parser_h1(p);

    if (h->url_len + len > h->limits->max_url_bytes)
        return fail(h, 414, "request target too long");
    if (count_head(h, len) != 0)
        return -1;
    h->url_len += (uint32_t)len;
    return arena_put(h, at, len);
}

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
    pl_h1 *h = parser_h1(p);

    if (count_head(h, len + 4) != 0) /* ": " and CRLF */
        return -1;
    if (h->hname_len + len > sizeof(h->hname)) {
        h->hname_len = sizeof(h->hname) + 1; /* too long to be one of ours */
        return 0;
    }
    memcpy(h->hname + h->hname_len, at, len);
    h->hname_len += (uint8_t)len;
    return 0;
}

static int on_header_field_complete(llhttp_t *p)
{
    pl_h1 *h = parser_h1(p);

    h->cur_hdr = H_OTHER;
    if (h->hname_len == 0)
        return fail(h, 400, "empty header name");
    if (++h->nheaders > MAX_HEADERS)
        return fail(h, 431, "too many request headers");
    if (h->hname_len < sizeof(known_headers) / sizeof(known_headers[0]) &&
        known_headers[h->hname_len].name != NULL &&
        strncasecmp(known_headers[h->hname_len].name, h->hname, h->hname_len) == 0) {
        uint8_t id = known_headers[h->hname_len].id;
        if (id == PL_HDR_TRANSFER_ENCODING && (h->seen & (1u << id))) {
            /* a list may span lines: keep one value, comma-joined (so
             * the lines must be adjacent among the headers we keep) */
            if (h->hdr_off[id] + h->hdr_len[id] != h->arena.len)
                return fail(h, 501, "unsupported transfer coding");
            h->cur_hdr = id;
            h->hname_len = 0;
            h->hdr_len[id] += 1;
            return arena_put(h, ",", 1);
        }
        if (h->seen & (1u << id))
            return fail(h, 400, "duplicate header");
        h->seen |= 1u << id;
        h->cur_hdr = id;
        h->hdr_off[id] = h->arena.len;
        h->hdr_len[id] = 0;
    }
    h->hname_len = 0;
    return 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
    pl_h1 *h = parser_h1(p);

    if (count_head(h, len) != 0)
        return -1;
    if (h->cur_hdr == H_OTHER)
        return 0;
    h->hdr_len[h->cur_hdr] += (uint32_t)len;
    return arena_put(h, at, len);
}

static int on_header_value_complete(llhttp_t *p)
{
    pl_h1 *h = parser_h1(p);

    if (h->cur_hdr != H_OTHER) {
        uint32_t *len = &h->hdr_len[h->cur_hdr];
        const char *v = h->arena.data + h->hdr_off[h->cur_hdr];
        while (*len > 0 && (v[*len - 1] == ' ' || v[*len - 1] == '\t'))
            (*len)--;
    }
    h->cur_hdr = H_OTHER;
    return 0;
}

/* Checks the Transfer-Encoding list (RFC 9112 6.1, 6.3): chunked must be
 * the last coding (else the body's length is unknown: 400), and it is the
 * only one we implement (else 501). Returns 0 or that status. */
static int check_codings(const pl_h1 *h)
{
    const char *v = h->arena.data + h->hdr_off[PL_HDR_TRANSFER_ENCODING];
    size_t len = h->hdr_len[PL_HDR_TRANSFER_ENCODING], i = 0;
    int other = 0, last_chunked = 0;

    while (i < len) {
        size_t start, end;
        while (i < len && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            i++;
        start = i;
        while (i < len && v[i] != ',')
            i++;
        end = i;
        while (end > start && (v[end - 1] == ' ' || v[end - 1] == '\t'))
            end--;
        if (end == start)
            continue;
        last_chunked = end - start == 7 && strncasecmp(v + start, "chunked", 7) == 0;
        other |= !last_chunked;
    }
    return !last_chunked ? 400 : other ? 501 : 0;
}

/* A Host value: reg-name or IP literal, optional port; no lists, no spaces. */
static int host_valid(const pl_h1 *h)
{
    const char *v = h->arena.data + h->hdr_off[PL_HDR_HOST];

    for (uint32_t i = 0; i < h->hdr_len[PL_HDR_HOST]; i++) {
        /* a switch, not strchr() per byte: Host is read on every request */
        switch (v[i]) {
        case ',': case '/': case '?': case '#': case '@': case '\\': case '"':
        case '<': case '>': case '{': case '}': case '|': case '^': case '`':
            return 0;
        default:
            if ((unsigned char)v[i] < 0x21 || (unsigned char)v[i] > 0x7e)
                return 0; /* also space and tab */
        }
    }
    return 1;
}

static int on_headers_complete(llhttp_t *p)
{
    pl_h1 *h = parser_h1(p);
    int body = (p->flags & F_CHUNKED) || p->content_length > 0, cont = 0;

    h->keep_alive = llhttp_should_keep_alive(p) && !p->upgrade;
    h->head = p->method == HTTP_HEAD;
    if (p->http_major != 1) /* "GET /path" alone is HTTP/0.9 to llhttp */
        return fail(h, 400, "request line without HTTP/1.x version");
    if (p->http_minor >= 1 && !(h->seen & (1u << PL_HDR_HOST)))
        return fail(h, 400, "missing Host header");
    if ((h->seen & (1u << PL_HDR_HOST)) && !host_valid(h))
        return fail(h, 400, "invalid Host header");
    if (h->seen & (1u << PL_HDR_TRANSFER_ENCODING)) {
        int status = check_codings(h);
        if (status != 0)
            return fail(h, status, status == 400 ? "chunked must be the last transfer coding"
                                                 : "unsupported transfer coding");
    }
    if ((p->flags & F_CONTENT_LENGTH) && p->content_length > h->limits->max_body_bytes)
        return fail(h, 413, "request body too large");
    if (h->seen & (1u << PL_HDR_EXPECT)) {
        if (h->hdr_len[PL_HDR_EXPECT] != 12 ||
            strncasecmp(h->arena.data + h->hdr_off[PL_HDR_EXPECT], "100-continue", 12) != 0)
            return fail(h, 417, "unsupported Expect header");
        cont = body;
    }
    h->body_off = h->arena.len;
    /* A body of announced length is copied into one block, not doubled
     * into it. */
    if ((p->flags & F_CONTENT_LENGTH) && p->content_length > 0 &&
        pl_buf_reserve(&h->arena, h->arena.len + p->content_length) != 0)
        return fail(h, 503, "out of memory");
    if (h->events && h->events->headers && h->events->headers(h->owner, cont) != 0)
        return fail(h, 0, NULL);
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
    pl_h1 *h = parser_h1(p);

    if (h->body_len + len > h->limits->max_body_bytes)
        return fail(h, 413, "request body too large");
    h->body_len += (uint32_t)len;
    return arena_put(h, at, len);
}

/* A chunk announced past the body limit is refused before its data. */
static int on_chunk_header(llhttp_t *p)
{
    pl_h1 *h = parser_h1(p);

    if (p->content_length > h->limits->max_body_bytes - h->body_len)
        return fail(h, 413, "request body too large");
    return 0;
}

static int on_message_complete(llhttp_t *p)
{
    parser_h1(p)->in_msg = 0;
    return HPE_PAUSED; /* one request at a time */
}

static const llhttp_settings_t settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_field_complete = on_header_field_complete,
    .on_header_value = on_header_value,
    .on_header_value_complete = on_header_value_complete,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_chunk_header = on_chunk_header,
    .on_message_complete = on_message_complete,
};

void pl_h1_init(pl_h1 *h, const pl_h1_limits *limits, const pl_h1_events *events,
                void *owner)
{
    memset(h, 0, sizeof(*h));
    llhttp_init(&h->parser, HTTP_REQUEST, &settings);
    h->limits = limits;
    h->events = events;
    h->owner = owner;
}

/* Whether <data> starts with a method-shaped token (RFC 9110 tchars) and a
 * space: a method we do not know (501), rather than bytes that are not HTTP
 * at all (400). */
static int is_token_method(const char *data, size_t len)
{
    size_t i = 0;

    while (i < len && data[i] > 0x20 && data[i] < 0x7f &&
           strchr("\"(),/:;<=>?@[\\]{}", data[i]) == NULL)
        i++;
    return i > 0 && i < len && data[i] == ' ';
}

/* llhttp takes runs of spaces between the parts of a request line, which
 * RFC 9112 section 3 separates by exactly one (a proxy may split a line with
 * two otherwise). <h->line> carries the scan across reads; blank lines
 * before a request are skipped, as llhttp skips them. Returns 0, or -EINVAL
 * at a space that is not the one separator. */
enum { LINE_START, LINE_TEXT, LINE_SPACE, LINE_DONE };

static int request_line_ok(pl_h1 *h, const char *data, size_t len)
{
    if (!h->in_msg)
        h->line = LINE_START;
    for (size_t i = 0; i < len && h->line != LINE_DONE; i++) {
        if (data[i] == ' ') {
            if (h->line != LINE_TEXT)
                return -EINVAL;
            h->line = LINE_SPACE;
        } else if (data[i] == '\n') {
            if (h->line != LINE_START)
                h->line = LINE_DONE;
        } else if (data[i] != '\r' || h->line != LINE_START) {
            h->line = LINE_TEXT;
        }
    }
    return 0;
}

pl_h1_result pl_h1_execute(pl_h1 *h, const char *data, size_t len, size_t *used)
{
    llhttp_errno_t err;

    if (request_line_ok(h, data, len) != 0) {
        *used = len;
        h->failed = 1;
        h->err_status = 400;
        h->err_msg = "malformed request line";
        return PL_H1_ERROR;
    }
    err = llhttp_execute(&h->parser, data, len);

    if (err == HPE_OK) {
        *used = len;
        return PL_H1_AGAIN;
    }
    if (err == HPE_PAUSED) {
        *used = (size_t)(llhttp_get_error_pos(&h->parser) - data);
        llhttp_resume(&h->parser);
        return PL_H1_REQUEST;
    }
    *used = len;
    if (!h->failed && err == HPE_INVALID_METHOD && is_token_method(data, len)) {
        h->err_status = 501;
        h->err_msg = "method not implemented";
    } else if (!h->failed) {
        h->err_status = 400; /* llhttp's own verdict: malformed */
        h->err_msg = "malformed HTTP request";
    }
    return PL_H1_ERROR;
}

void pl_h1_request(const pl_h1 *h, pl_request *req)
{
    const char *q;

    memset(req, 0, sizeof(*req));
    req->method = h->parser.method;
    req->path = h->arena.data + h->url_off;
    req->path_len = h->url_len;
    if (req->path_len > 0 && req->path[0] != '/') {
        /* absolute-form (RFC 9112 3.2.2): skip scheme and authority */
        const char *auth = memmem(req->path, req->path_len, "://", 3);
        const char *slash = auth ? memchr(auth + 3, '/', req->path_len - (size_t)(auth + 3 - req->path))
                                 : NULL;
        size_t skip = slash ? (size_t)(slash - req->path) : 0;
        req->path += skip;
        req->path_len -= skip;
    }
    q = memchr(req->path, '?', req->path_len);
    if (q) {
        req->query = q + 1;
        req->query_len = req->path_len - (size_t)(q + 1 - req->path);
        req->path_len = (size_t)(q - req->path);
    }
    for (int i = 0; i < PL_HDR__COUNT; i++) {
        if (h->seen & (1u << i)) {
            req->header[i] = h->arena.data + h->hdr_off[i];
            req->header_len[i] = h->hdr_len[i];
        }
    }
    req->body = h->arena.data + h->body_off;
    req->body_len = h->body_len;
}

void pl_h1_release(pl_h1 *h)
{
    pl_buf_free(&h->arena);
}

int pl_h1_take_arena(pl_h1 *h, pl_buf *out)
{
    if (h->arena.data == NULL)
        return -ENOENT;
    *out = h->arena;
    memset(&h->arena, 0, sizeof(h->arena));
    return 0;
}

/* ---- one response ---- */

static pl_h1_response *parser_response(llhttp_t *p)
{
    return container_of(p, pl_h1_response, parser);
}

static int resp_header_field(llhttp_t *p, const char *at, size_t len)
{
    pl_h1_response *r = parser_response(p);

    if (r->name_len + len > sizeof(r->name))
        r->name_long = 1;
    else
        memcpy(r->name + r->name_len, at, len);
    r->name_len = (uint8_t)(r->name_len + (r->name_long ? 0 : len));
    return 0;
}

static int resp_header_field_complete(llhttp_t *p)
{
    pl_h1_response *r = parser_response(p);

    r->in_want = r->want != NULL && !r->name_long && r->name_len == r->want_len &&
                 strncasecmp(r->name, r->want, r->want_len) == 0;
    r->name_len = 0;
    r->name_long = 0;
    if (r->in_want)
        r->value_len = 0; /* the last of a repeated header counts */
    return 0;
}

static int resp_header_value(llhttp_t *p, const char *at, size_t len)
{
    pl_h1_response *r = parser_response(p);

    if (!r->in_want)
        return 0;
    if (r->value_len + len > sizeof(r->value))
        return -1; /* longer than any value asked for can be */
    memcpy(r->value + r->value_len, at, len);
    r->value_len = (uint8_t)(r->value_len + len);
    return 0;
}

static int resp_header_value_complete(llhttp_t *p)
{
    pl_h1_response *r = parser_response(p);

    r->has_value |= r->in_want;
    r->in_want = 0;
    return 0;
}

/* A status of three digits, as RFC 9112 has it: llhttp takes fewer. */
static int resp_headers_complete(llhttp_t *p)
{
    return p->status_code >= 100 && p->status_code <= 999 ? 0 : -1;
}

static int resp_message_complete(llhttp_t *p)
{
    pl_h1_response *r = parser_response(p);

    r->complete = 1;
    r->status = p->status_code;
    r->keep_alive = llhttp_should_keep_alive(p) != 0;
    return HPE_PAUSED; /* one response: what follows was not asked for */
}

static const llhttp_settings_t response_settings = {
    .on_header_field = resp_header_field,
    .on_header_field_complete = resp_header_field_complete,
    .on_header_value = resp_header_value,
    .on_header_value_complete = resp_header_value_complete,
    .on_headers_complete = resp_headers_complete,
    .on_message_complete = resp_message_complete,
};

void pl_h1_response_init(pl_h1_response *r, uint32_t max_bytes, const char *want)
{
    memset(r, 0, sizeof(*r));
    llhttp_init(&r->parser, HTTP_RESPONSE, &response_settings);
    r->max_bytes = max_bytes;
    r->want = want;
    r->want_len = want != NULL ? (uint8_t)strlen(want) : 0;
}

int pl_h1_response_execute(pl_h1_response *r, const char *data, size_t len)
{
    llhttp_errno_t rc;

    if (r->complete) {
        r->keep_alive = 0; /* bytes nobody asked for: not kept */
        return 1;
    }
    if (len > r->max_bytes - r->bytes)
        return -EPROTO;
    r->bytes += (uint32_t)len;
    rc = llhttp_execute(&r->parser, data, len);
    if (rc == HPE_PAUSED) {
        /* Stopped at the response's end: anything behind it in this read
         * is more than was asked for. */
        if (llhttp_get_error_pos(&r->parser) != data + len)
            r->keep_alive = 0;
        return 1;
    }
    /* llhttp checks the status (three digits) and the framing: a length
     * that overflows or is not a number, two lengths, a bad chunk. */
    if (rc != HPE_OK)
        return -EPROTO;
    return 0;
}

int pl_h1_response_eof(pl_h1_response *r)
{
    if (r->complete)
        return 1;
    if (llhttp_finish(&r->parser) != HPE_OK && !r->complete)
        return -EPROTO;
    if (r->complete)
        r->keep_alive = 0;
    return r->complete ? 1 : -EPROTO;
}
