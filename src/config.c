/* config.c -- the settings table and its four sources. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/stat.h>

#include "pilotlight/config.h"
#include "pilotlight/log.h"
#include "pilotlight/mem.h"
#include "pilotlight/ring.h"

/* T_HEADER: a string sent or compared in an HTTP header, so no control
 * byte (a secret: never printed); T_CIDRS: address ranges (cidr.h), kept
 * as written and parsed. */
typedef enum { T_U64, T_LISTEN, T_CHOICE, T_STRING, T_SECRET, T_HEADER, T_CIDRS } setting_type;

typedef struct {
    const char *name; /* file name; env is PILOTLIGHT_<NAME>, flag --na-me */
    setting_type type;
    size_t offset;
    uint64_t min, max;
    const char *def;
    const char *help;
    const char *const *choices; /* T_CHOICE: names of values 0, 1, ... */
} setting;

#define U64(field, lo, hi, d, h) \
    {#field, T_U64, offsetof(pl_config, field), lo, hi, d, h, NULL}
#define CHOICE(field, names, d, h) \
    {#field, T_CHOICE, offsetof(pl_config, field), 0, 0, d, h, names}
#define STRING(field, type, d, h) \
    {#field, type, offsetof(pl_config, field), 0, 0, d, h, NULL}
#define LISTEN(field, d, h) \
    {#field, T_LISTEN, offsetof(pl_config, field), 0, 0, d, h, NULL}

static const char *const order_names[] = {"fifo", "lifo", NULL};
static const char *const level_names[] = {"error", "warn", "info", "debug", NULL};
static const char *const delivery_names[] = {"written", "confirm", NULL};
static const char *const token_mode_names[] = {"disabled", "log", "enforce", NULL};
static const char *const on_off_names[] = {"on", "off", NULL};
#define DAY_MS 86400000ULL

static const setting settings[] = {
    LISTEN(listen, "0.0.0.0:8080",
           "address for controllers (and dispatchers, unless dispatch_listen is set), "
           "HOST:PORT (port 0 picks one); a host name is resolved at start and every "
           "address it names is listened on"),
    LISTEN(dispatch_listen, "",
           "separate address for dispatch, /metrics and /debug/waiters; when set, "
           "the controllers' address refuses those (empty = off)"),
    STRING(dispatch_token, T_HEADER, "",
           "bearer token required on dispatch and /debug/*; a stock supervisor cannot "
           "send one: only behind a proxy that adds it (empty = none)"),
    STRING(dispatch_allow, T_CIDRS, "",
           "who may dispatch and read /metrics, /status and /debug/*: addresses or "
           "ADDRESS/BITS, comma-separated; others get 403 (empty = anyone)"),
    U64(dispatch_max_connections, 16, 100000000, "1024",
        "with dispatch_listen: connections the dispatch listener keeps for itself "
        "(dispatches, /metrics, the ring's checks), out of reach of the controllers'"),
    CHOICE(warm_starts, on_off_names, "on",
           "off: /connect answers 0 (each controller exits at its next /connect) and "
           "dispatches are answered false at once: the fleet-wide switch"),
    CHOICE(token_mode, token_mode_names, "disabled",
           "signed deployment tokens: disabled, log (verify and count, allow all) "
           "or enforce (401 unless valid)"),
    STRING(token_secret, T_SECRET, "",
           "the tokens' HMAC secret (prefer the environment or token_secret_file)"),
    STRING(token_secret_file, T_STRING, "",
           "file holding the tokens' secret (one trailing newline ignored)"),
    STRING(token_secret_previous, T_SECRET, "",
           "during a rotation, the secret being retired: tokens signed with it "
           "still verify (empty = none)"),
    STRING(token_secret_previous_file, T_STRING, "",
           "file holding token_secret_previous (one trailing newline ignored)"),
    U64(connection_timeout_ms, 1, DAY_MS, "30000",
        "connectionTimeoutMs served by /connect: how long a controller holds a poll"),
    U64(keepalive_ms, 1, 30 * DAY_MS, "300000",
        "keepaliveMs served by /connect: how long a controller keeps polling"),
    U64(park_timeout_ms, 0, DAY_MS, "0",
        "server-side poll timeout (204); 0 = connection_timeout_ms + 5000"),
    CHOICE(match_order, order_names, "fifo",
           "which parked poll of a key gets a run: fifo (oldest) or lifo (newest)"),
    CHOICE(delivery, delivery_names, "confirm",
           "when a dispatch is true: confirm (the controller's TCP stack "
           "acknowledged the payload) or written (a live socket took it)"),
    U64(confirm_timeout_ms, 1, 60000, "2000",
        "delivery = confirm: how long a run may be offered to one poll after "
        "another, and wait for bytes that have not left (docs/delivery.md)"),
    U64(confirm_wait_max_ms, 100, 60000, "3000",
        "delivery = confirm: the most a controller that has the whole run in "
        "flight is given to acknowledge it (docs/delivery.md)"),
    U64(tcp_keepalive_idle_s, 0, 86400, "10",
        "parked connections: idle seconds before TCP keepalive probes (0 = system)"),
    U64(tcp_keepalive_interval_s, 0, 86400, "5",
        "parked connections: seconds between keepalive probes (0 = system)"),
    U64(tcp_keepalive_count, 0, 100, "3",
        "parked connections: unanswered probes before the peer is dead (0 = system)"),
    U64(tcp_user_timeout_ms, 0, 3600000, "25000",
        "parked connections: TCP_USER_TIMEOUT, longest time sent data may stay "
        "unacknowledged (0 = system)"),
    U64(max_waiters, 1, 100000000, "100000", "parked polls allowed in all (503 beyond)"),
    U64(max_waiters_per_key, 1, 100000000, "10000",
        "parked polls allowed per key (503 beyond)"),
    U64(max_connections, 1, 100000000, "100000",
        "open connections allowed (clamped below the file-descriptor limit)"),
    U64(max_header_bytes, 256, 1048576, "16384", "request line and headers (431 beyond)"),
    U64(max_url_bytes, 16, 1048576, "4096", "request target (414 beyond)"),
    U64(max_body_bytes, 0, 1073741824, "1048576", "request body (413 beyond)"),
    U64(header_timeout_ms, 1, DAY_MS, "10000",
        "time to receive a request's headers, and again its body (408)"),
    U64(idle_timeout_ms, 1, DAY_MS, "120000", "idle keep-alive connection lifetime"),
    U64(shutdown_timeout_ms, 1, DAY_MS, "10000",
        "on SIGTERM, longest wait for in-flight requests before exit"),
    U64(drain_delay_ms, 0, DAY_MS, "0",
        "on SIGTERM, how long /readyz answers 503 before the listener closes"),
    STRING(ring_peers, T_STRING, "",
           "scale-out: the instances of a key ring, host:port as they reach each "
           "other, separated by commas; each key is served by one (empty = no ring)"),
    STRING(ring_dns, T_STRING, "",
           "scale-out: a DNS name:port whose addresses are the ring's instances "
           "(a Kubernetes headless Service), resolved again every ring_resolve_ms"),
    STRING(ring_self, T_STRING, "",
           "this instance as its peers reach it, host:port (one of ring_peers; "
           "with ring_dns, empty = the name's address that is this host's)"),
    U64(ring_check_ms, 50, 60000, "500", "how often each peer's /readyz is asked"),
    U64(ring_check_timeout_ms, 10, 60000, "1000",
        "a peer that leaves two checks in a row unanswered this long leaves the ring"),
    U64(ring_resolve_ms, 100, 3600000, "5000", "how often ring_dns is resolved again"),
    CHOICE(log_level, level_names, "info", "error, warn, info or debug"),
    STRING(upgrade_binary, T_STRING, "",
           "SIGUSR2 starts this program to take over the sockets (empty = this "
           "binary's own path, as resolved at start)"),
    U64(upgrade_step_timeout_ms, 100, 600000, "5000",
        "binary upgrade: longest wait for each step of the new process (HELLO, "
        "taking the state in, READY); serving goes on meanwhile, then it is killed"),
};

#define NSETTINGS (sizeof(settings) / sizeof(settings[0]))

/* What the real clients allow (refuse_senseless): undici's default
 * headersTimeout, and the smallest requests they send. */
#define CONTROLLER_HEADERS_TIMEOUT_MS 300000ULL
#define POLL_HEADERS_MIN 1024
#define DISPATCH_BODY_MIN 1024

static const setting *find_setting(const char *name, size_t len)
{
    for (size_t i = 0; i < NSETTINGS; i++)
        if (strlen(settings[i].name) == len && memcmp(settings[i].name, name, len) == 0)
            return &settings[i];
    return NULL;
}

/* 1 when <h> can be a DNS or hosts-file name. It is resolved when the
 * server starts, not here: --check-config stays an offline check. */
static int is_host_name(const char *h)
{
    int letters = 0;

    if (!isalnum((unsigned char)h[0]))
        return 0;
    for (; *h != '\0'; h++) {
        if (!isalnum((unsigned char)*h) && *h != '-' && *h != '.' && *h != '_')
            return 0;
        letters |= !isdigit((unsigned char)*h) && *h != '.';
    }
    return letters; /* "10.1" is no name, and the resolver would take it for 10.0.0.1 */
}

static int parse_listen(pl_listen_addr *out, const char *v)
{
    const char *colon = strrchr(v, ':');
    char host[PL_CONFIG_HOST_MAX];
    unsigned char addr[16];
    size_t hlen;
    char *end;
    unsigned long port;
    int bracketed = 0;

    if (colon == NULL || colon[1] == '\0')
        return -EINVAL;
    hlen = (size_t)(colon - v);
    if (hlen >= 2 && v[0] == '[' && v[hlen - 1] == ']') {
        v++; /* [::1]:8080 */
        hlen -= 2;
        bracketed = 1;
    }
    if (hlen == 0 || hlen >= sizeof(host))
        return -EINVAL;
    memcpy(host, v, hlen);
    host[hlen] = '\0';
    if (inet_pton(AF_INET, host, addr) != 1 && inet_pton(AF_INET6, host, addr) != 1 &&
        (bracketed || !is_host_name(host)))
        return -EINVAL;
    errno = 0;
    port = strtoul(colon + 1, &end, 10);
    if (*end != '\0' || errno != 0 || port > 65535 || !isdigit((unsigned char)colon[1]))
        return -EINVAL;
    memcpy(out->host, host, hlen + 1);
    out->port = (uint16_t)port;
    return 0;
}

/* Whether <v> holds a byte below 0x20 or DEL. */
static int has_control(const char *v)
{
    for (; *v != '\0'; v++)
        if ((unsigned char)*v < 0x20 || *v == 0x7f)
            return 1;
    return 0;
}

/* <v> as a message may show it: at most 64 bytes, control bytes as \xNN,
 * so that a CR or LF inside a value cannot break the message's line. */
static const char *shown(const char *v, char out[272])
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0, i;

    for (i = 0; v[i] != '\0' && i < 64; i++) {
        unsigned char ch = (unsigned char)v[i];
        if (ch < 0x20 || ch == 0x7f) {
            out[o++] = '\\';
            out[o++] = 'x';
            out[o++] = hex[ch >> 4];
            out[o++] = hex[ch & 15];
        } else {
            out[o++] = (char)ch;
        }
    }
    if (v[i] != '\0') {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = '\0';
    return out;
}

static int apply(pl_config *cfg, const setting *s, const char *v, char *err,
                 size_t errlen)
{
    char *base = (char *)cfg + s->offset, *end, show[272], msg[160];
    unsigned long long n;

    switch (s->type) {
    case T_LISTEN:
        if (*v == '\0' && s->def[0] == '\0') {
            memset(base, 0, sizeof(pl_listen_addr));
            return 0;
        }
        if (parse_listen((pl_listen_addr *)(void *)base, v) == 0)
            return 0;
        snprintf(err, errlen, "%s: '%s' is not HOST:PORT (HOST: an IPv4 address, "
                 "[IPv6] or a host name)", s->name, shown(v, show));
        return -EINVAL;
    case T_STRING:
    case T_SECRET:
    case T_HEADER:
    case T_CIDRS:
        if (strlen(v) >= PL_CONFIG_STRING_MAX) {
            snprintf(err, errlen, "%s: longer than %d bytes", s->name, PL_CONFIG_STRING_MAX - 1);
            return -EINVAL;
        }
        if (s->type == T_HEADER && has_control(v)) {
            /* the value itself is not echoed: it is a secret */
            snprintf(err, errlen, "%s: holds a control character (CR, LF, TAB ...), which "
                     "no HTTP header can carry", s->name);
            return -EINVAL;
        }
        if (s->type == T_CIDRS &&
            pl_cidr_parse(v, &cfg->dispatch_allow_nets, msg, sizeof(msg)) != 0) {
            snprintf(err, errlen, "%s: %s", s->name, msg);
            return -EINVAL;
        }
        memcpy(base, v, strlen(v) + 1);
        return 0;
    case T_CHOICE:
        for (int i = 0; s->choices[i]; i++) {
            if (strcmp(v, s->choices[i]) == 0) {
                memcpy(base, &i, sizeof(int));
                return 0;
            }
        }
        n = (unsigned long long)snprintf(err, errlen, "%s: '%s' is not one of", s->name,
                                         shown(v, show));
        for (int i = 0; s->choices[i] && n < errlen; i++)
            n += (unsigned long long)snprintf(err + n, errlen - n, " %s", s->choices[i]);
        return -EINVAL;
    case T_U64:
        errno = 0;
        n = strtoull(v, &end, 10);
        if (!isdigit((unsigned char)v[0]) || *end != '\0' || errno != 0 ||
            n < s->min || n > s->max) {
            snprintf(err, errlen, "%s: '%s' is not a whole number from %llu to %llu",
                     s->name, shown(v, show), (unsigned long long)s->min,
                     (unsigned long long)s->max);
            return -EINVAL;
        }
        memcpy(base, &(uint64_t){n}, sizeof(uint64_t));
        return 0;
    }
    return -EINVAL;
}

/* Edits (insert, delete, change, swap two neighbours) from a[0..al) to
 * b[0..bl), case aside; names are short. */
static unsigned distance(const char *a, size_t al, const char *b, size_t bl)
{
    unsigned d[65][65];

    if (al > 64 || bl > 64)
        return 99;
    for (size_t i = 0; i <= al; i++)
        d[i][0] = (unsigned)i;
    for (size_t j = 0; j <= bl; j++)
        d[0][j] = (unsigned)j;
    for (size_t i = 1; i <= al; i++) {
        for (size_t j = 1; j <= bl; j++) {
            int ai = tolower((unsigned char)a[i - 1]), bj = tolower((unsigned char)b[j - 1]);
            unsigned best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + (ai != bj) < best)
                best = d[i - 1][j - 1] + (ai != bj);
            if (i > 1 && j > 1 && ai == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == bj && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    }
    return d[al][bl];
}

/* The setting whose name is within two edits of <name>, or NULL: more is
 * another name, not a typo. */
static const char *nearest_setting(const char *name, size_t len)
{
    const char *best = NULL;
    unsigned best_d = 3;

    for (size_t i = 0; i < NSETTINGS; i++) {
        unsigned d = distance(name, len, settings[i].name, strlen(settings[i].name));
        if (d < best_d) {
            best_d = d;
            best = settings[i].name;
        }
    }
    return best;
}

int pl_config_set(pl_config *cfg, const char *name, const char *value,
                  char *err, size_t errlen)
{
    const setting *s = find_setting(name, strlen(name));

    if (s == NULL) {
        char show[272];
        const char *near = nearest_setting(name, strlen(name));
        snprintf(err, errlen, "unknown setting '%s'%s%s%s", shown(name, show),
                 near ? " (did you mean " : "", near ? near : "", near ? "?)" : "");
        return -EINVAL;
    }
    return apply(cfg, s, value, err, errlen);
}

static char *trim(char *s)
{
    char *e;

    while (isspace((unsigned char)*s))
        s++;
    e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

static const char *file_kind(mode_t mode)
{
    return S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a FIFO"
           : S_ISCHR(mode) ? "a character device" : S_ISBLK(mode) ? "a block device"
           : S_ISSOCK(mode) ? "a socket" : "not a regular file";
}

/* Reads the file <path> whole into *out (pl_malloc'd, NUL-terminated; free
 * with pl_free) and returns its length, or a negative errno with a message naming
 * <what> and <path> in <err> (-EINVAL: not a regular file; -EFBIG: too
 * long). Only a regular file is read, a symlink followed to
 * one (a Kubernetes ConfigMap's files are symlinks); anything else is
 * refused without waiting for it: opened non-blocking, a FIFO with no
 * writer cannot hold the open, and it is refused before any read. More
 * than <limit> bytes, read or announced, is refused too. */
static long read_file(const char *what, const char *path, size_t limit, char **out,
                      char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    struct stat st;
    char *buf = NULL, *grown;
    size_t len = 0, cap;
    ssize_t n;
    int rc;

    *out = NULL;
    if (fd < 0) {
        rc = -errno;
        snprintf(err, errlen, "%s %s: %s", what, path, strerror(-rc));
        return rc;
    }
    if (fstat(fd, &st) != 0) {
        rc = -errno;
        snprintf(err, errlen, "%s %s: %s", what, path, strerror(-rc));
        goto fail;
    }
    rc = -EINVAL;
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s %s: %s, not a regular file", what, path,
                 file_kind(st.st_mode));
        goto fail;
    }
    rc = -EFBIG;
    if ((uint64_t)st.st_size > limit) {
        snprintf(err, errlen, "%s %s: more than %zu bytes", what, path, limit);
        goto fail;
    }
    /* Room for what it announces and one byte more, to see it grew (a
     * file under /proc announces 0); never past limit + 1. */
    cap = (size_t)st.st_size < limit ? (size_t)st.st_size + 1 : limit + 1;
    if (cap < 4096)
        cap = limit + 1 < 4096 ? limit + 1 : 4096;
    if ((buf = pl_malloc(cap + 1)) == NULL)
        goto oom;
    for (;;) {
        if (len == cap) {
            size_t next = cap * 2 < limit + 1 ? cap * 2 : limit + 1;
            if (next == cap)
                break; /* limit + 1 bytes: too long */
            if ((grown = pl_realloc(buf, next + 1)) == NULL)
                goto oom;
            buf = grown;
            cap = next;
        }
        n = read(fd, buf + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = -errno;
            snprintf(err, errlen, "%s %s: %s", what, path, strerror(-rc));
            goto fail;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    if (len > limit) {
        snprintf(err, errlen, "%s %s: more than %zu bytes", what, path, limit);
        goto fail;
    }
    close(fd);
    buf[len] = '\0';
    *out = buf;
    return (long)len;
oom:
    rc = -ENOMEM;
    snprintf(err, errlen, "%s %s: out of memory", what, path);
fail:
    close(fd);
    pl_free(buf);
    return rc;
}

/* Sets what the lines of <text> (<len> bytes, NUL after them; changed in
 * place) say. Every line is taken whole, or refused with its number. */
static int parse_text(pl_config *cfg, const char *path, char *text, size_t len,
                      char *err, size_t errlen)
{
    char *p = text, *end = text + len, msg[512];
    int lineno = 0;

    /* A byte-order mark, as some Windows editors write: not part of the
     * first setting's name. */
    if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0)
        p += 3;

    while (p < end) {
        char *line = p, *nl = memchr(p, '\n', (size_t)(end - p)), *hash, *eq, *s;
        size_t n = (size_t)((nl != NULL ? nl : end) - p);

        lineno++;
        p = nl != NULL ? nl + 1 : end;
        if (n - (n > 0 && line[n - 1] == '\r') > PL_CONFIG_LINE_MAX) { /* CRLF: the CR aside */
            snprintf(err, errlen, "%s:%d: line longer than %d bytes", path, lineno,
                     PL_CONFIG_LINE_MAX);
            return -EINVAL;
        }
        if (memchr(line, '\0', n) != NULL) {
            snprintf(err, errlen, "%s:%d: a NUL byte", path, lineno);
            return -EINVAL;
        }
        line[n] = '\0';
        if ((hash = strchr(line, '#')) != NULL)
            *hash = '\0';
        s = trim(line);
        if (*s == '\0')
            continue;
        eq = strchr(s, '=');
        if (eq == NULL) {
            snprintf(err, errlen, "%s:%d: expected 'name = value'", path, lineno);
            return -EINVAL;
        }
        *eq = '\0';
        if (pl_config_set(cfg, trim(s), trim(eq + 1), msg, sizeof(msg)) != 0) {
            snprintf(err, errlen, "%s:%d: %s", path, lineno, msg);
            return -EINVAL;
        }
    }
    return 0;
}

static int load_file(pl_config *cfg, const char *path, char *err, size_t errlen)
{
    char *text;
    long len = read_file("config file", path, PL_CONFIG_FILE_MAX, &text, err, errlen);
    int rc;

    if (len < 0)
        return (int)len;
    rc = parse_text(cfg, path, text, (size_t)len, err, errlen);
    pl_free(text);
    return rc;
}

#define ENV_PREFIX "PILOTLIGHT_"

/* Matches "PILOTLIGHT_<NAME>=" against setting names; returns the setting. */
static const setting *env_setting(const char *var, const char **value)
{
    const char *eq = strchr(var, '=');
    char name[64];
    size_t len;

    if (eq == NULL || strncmp(var, ENV_PREFIX, sizeof(ENV_PREFIX) - 1) != 0)
        return NULL;
    var += sizeof(ENV_PREFIX) - 1;
    len = (size_t)(eq - var);
    if (len >= sizeof(name))
        return NULL;
    for (size_t i = 0; i < len; i++)
        name[i] = (char)tolower((unsigned char)var[i]);
    *value = eq + 1;
    return find_setting(name, len);
}

/* Whether "PILOTLIGHT_<name>" is a variable that is not a setting by
 * design: the two pilotlight reads itself, and those Kubernetes puts in
 * every pod for each Service of its namespace (a Service
 * "pilotlight-dispatch" gives PILOTLIGHT_DISPATCH_SERVICE_HOST, ..._PORT,
 * ..._PORT_8081_TCP_ADDR, ...). <name> is upper case, as set. */
static int env_not_a_setting(const char *name)
{
    size_t len = strlen(name);

    return strcmp(name, "CONFIG") == 0 || strcmp(name, "UPGRADE_FD") == 0 ||
           strstr(name, "_SERVICE_HOST") != NULL || strstr(name, "_SERVICE_PORT") != NULL ||
           (len >= 5 && strcmp(name + len - 5, "_PORT") == 0) || strstr(name, "_PORT_") != NULL;
}

/* The environment variable <var>, PILOTLIGHT_<name>=..., names no
 * setting: one a couple of edits from a setting is a misspelling, refused
 * as a file's would be; another is noted (cfg->notes), for the log.
 * Returns 0, or -EINVAL with the message in <err>. */
static int env_unknown(pl_config *cfg, const char *var, char *err, size_t errlen)
{
    const char *rest = var + sizeof(ENV_PREFIX) - 1, *eq, *near;
    size_t len, used = strlen(cfg->notes);
    char name[72], lower[72], show[272], upper[72];

    /* the prefix first: a shorter variable has no <rest> to read */
    if (strncmp(var, ENV_PREFIX, sizeof(ENV_PREFIX) - 1) != 0)
        return 0;
    eq = strchr(rest, '=');
    len = eq != NULL ? (size_t)(eq - rest) : strlen(rest);
    snprintf(name, sizeof(name), "%.*s", (int)(len < 64 ? len : 64), rest);
    if (env_not_a_setting(name))
        return 0;
    for (size_t i = 0; i <= strlen(name); i++)
        lower[i] = (char)tolower((unsigned char)name[i]);
    if ((near = nearest_setting(lower, strlen(lower))) != NULL) {
        for (size_t i = 0; i <= strlen(near) && i < sizeof(upper); i++)
            upper[i] = (char)toupper((unsigned char)near[i]);
        snprintf(err, errlen, "environment " ENV_PREFIX "%s: no such setting (did you mean "
                 ENV_PREFIX "%s?)", shown(name, show), upper);
        return -EINVAL;
    }
    if (used + 128 < sizeof(cfg->notes))
        snprintf(cfg->notes + used, sizeof(cfg->notes) - used,
                 "environment " ENV_PREFIX "%s names no setting: ignored\n", shown(name, show));
    return 0;
}

/* Matches "--na-me" or "--na-me=value"; returns the setting. */
static const setting *flag_setting(const char *arg, const char **inline_value)
{
    const char *eq = strchr(arg, '=');
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    char name[64];

    *inline_value = eq ? eq + 1 : NULL;
    if (len < 3 || len - 2 >= sizeof(name) || strncmp(arg, "--", 2) != 0)
        return NULL;
    for (size_t i = 2; i < len; i++)
        name[i - 2] = arg[i] == '-' ? '_' : arg[i];
    return find_setting(name, len - 2);
}

static const char *config_path(int argc, char **argv, char **envp)
{
    const char *path = NULL;

    for (int i = 0; envp && envp[i]; i++)
        if (strncmp(envp[i], "PILOTLIGHT_CONFIG=", 18) == 0)
            path = envp[i] + 18;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
            path = argv[++i];
        else if (strncmp(argv[i], "--config=", 9) == 0)
            path = argv[i] + 9;
    }
    return path;
}

static int load_flags(pl_config *cfg, int argc, char **argv,
                      pl_config_action *action, char *err, size_t errlen)
{
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *v;
        const setting *s;

        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            *action = PL_CONFIG_HELP;
        } else if (strcmp(arg, "--version") == 0) {
            *action = PL_CONFIG_VERSION;
        } else if (strcmp(arg, "--check-config") == 0) {
            *action = PL_CONFIG_CHECK;
        } else if (strcmp(arg, "--config") == 0) {
            i++; /* read first, by config_path() */
        } else if (strncmp(arg, "--config=", 9) == 0) {
            continue;
        } else if ((s = flag_setting(arg, &v)) != NULL) {
            if (v == NULL && i + 1 >= argc) {
                snprintf(err, errlen, "%s needs a value", arg);
                return -EINVAL;
            }
            if (apply(cfg, s, v ? v : argv[++i], err, errlen) != 0)
                return -EINVAL;
        } else {
            /* the name only: a mistyped --token-secret=... must not echo */
            snprintf(err, errlen, "unknown option '%.*s' (see --help)",
                     (int)strcspn(arg, "="), arg);
            return -EINVAL;
        }
    }
    return 0;
}

/* Reads the file <path> (the setting <name>) into <secret>, without one
 * trailing newline (LF or CRLF). */
static int read_secret(const char *name, const char *path, char *secret,
                       char *err, size_t errlen)
{
    char *buf;
    long n = read_file(name, path, PL_CONFIG_STRING_MAX + 1, &buf, err, errlen);

    if (n < 0)
        return (int)n;
    if (n > 0 && buf[n - 1] == '\n')
        n--;
    if (n > 0 && buf[n - 1] == '\r')
        n--;
    if (n >= PL_CONFIG_STRING_MAX || memchr(buf, '\0', (size_t)n) != NULL) {
        /* a NUL would end the HMAC key early, silently */
        snprintf(err, errlen, n >= PL_CONFIG_STRING_MAX ? "%s %s: longer than %d bytes"
                                                        : "%s %s: holds a NUL byte",
                 name, path, PL_CONFIG_STRING_MAX - 1);
        pl_free(buf);
        return -EINVAL;
    }
    memcpy(secret, buf, (size_t)n);
    secret[n] = '\0';
    pl_free(buf);
    return 0;
}

/* The port of ring_dns (checked already). */
static unsigned dns_port(const pl_config *c)
{
    char host[PL_CONFIG_STRING_MAX];
    uint16_t port = 0;

    pl_ring_split(c->ring_dns, strlen(c->ring_dns), host, sizeof(host), &port);
    return port;
}

/* Settings each valid alone that together cannot work: every one of these
 * would quietly end warm starts (docs/protocol.md). Returns 0, or -EINVAL
 * with the reason in <err>. */
static int refuse_senseless(const pl_config *c, char *err, size_t errlen)
{
    const unsigned long long park = c->park_timeout_ms, conn = c->connection_timeout_ms;

    if (park != 0 && park <= conn)
        snprintf(err, errlen, "park_timeout_ms = %llu is not above connection_timeout_ms = %llu: "
                 "a controller aborts its poll at connection_timeout_ms, while a 204 before "
                 "that is an error to it, after which it backs off longer each time; warm "
                 "starts would quietly stop (0 = connection_timeout_ms + 5000)", park, conn);
    else if (conn >= CONTROLLER_HEADERS_TIMEOUT_MS)
        snprintf(err, errlen, "connection_timeout_ms = %llu is not below %llu: a controller's "
                 "fetch (Node's undici) fails a request whose response headers take %llu ms, "
                 "an error after which it backs off longer each time instead of polling again",
                 conn, CONTROLLER_HEADERS_TIMEOUT_MS, CONTROLLER_HEADERS_TIMEOUT_MS);
    else if (c->max_header_bytes < POLL_HEADERS_MIN)
        snprintf(err, errlen, "max_header_bytes = %llu is below %d: a controller's poll "
                 "carries about 480 bytes of headers, 900 with a signed deployment token "
                 "(Node's fetch), and one answered 431 gives up warm starts",
                 (unsigned long long)c->max_header_bytes, POLL_HEADERS_MIN);
    else if (c->max_body_bytes < DISPATCH_BODY_MIN)
        snprintf(err, errlen, "max_body_bytes = %llu is below %d: a dispatch carries the "
                 "run's whole DequeuedMessage (a small run's is about 1,250 bytes), so "
                 "every one would be refused 413 and its run cold-started",
                 (unsigned long long)c->max_body_bytes, DISPATCH_BODY_MIN);
    else if (pl_ring_check_config(c->ring_peers, c->ring_dns, c->ring_self, err, errlen) != 0)
        return -EINVAL;
    else if (c->ring_dns[0] != '\0' && c->ring_self[0] == '\0' &&
             dns_port(c) != c->listen.port)
        snprintf(err, errlen, "ring_dns: its port is not listen's (%u), so this instance "
                 "cannot find itself among the name's addresses: set ring_self",
                 (unsigned)c->listen.port);
    else
        return 0;
    return -EINVAL;
}

int pl_config_load(pl_config *cfg, int argc, char **argv, char **envp,
                   pl_config_action *action, char *err, size_t errlen)
{
    const char *path = config_path(argc, argv, envp);
    char msg[512];
    int rc;

    memset(cfg, 0, sizeof(*cfg));
    *action = PL_CONFIG_RUN;
    for (size_t i = 0; i < NSETTINGS; i++)
        if (apply(cfg, &settings[i], settings[i].def, err, errlen) != 0)
            return -EINVAL;
    if (path != NULL && (rc = load_file(cfg, path, err, errlen)) != 0)
        return rc;
    for (int i = 0; envp && envp[i]; i++) {
        const char *v;
        const setting *s = env_setting(envp[i], &v);
        if (s == NULL && env_unknown(cfg, envp[i], err, errlen) != 0)
            return -EINVAL;
        if (s != NULL && apply(cfg, s, v, msg, sizeof(msg)) != 0) {
            snprintf(err, errlen, "environment %.*s", (int)(strchr(envp[i], '=') - envp[i]), envp[i]);
            snprintf(err + strlen(err), errlen - strlen(err), ": %s", msg);
            return -EINVAL;
        }
    }
    if (load_flags(cfg, argc, argv, action, err, errlen) != 0)
        return -EINVAL;
    if (cfg->token_secret_file[0] != '\0' &&
        (rc = read_secret("token_secret_file", cfg->token_secret_file, cfg->token_secret,
                          err, errlen)) != 0)
        return rc;
    if (cfg->token_secret_previous_file[0] != '\0' &&
        (rc = read_secret("token_secret_previous_file", cfg->token_secret_previous_file,
                          cfg->token_secret_previous, err, errlen)) != 0)
        return rc;
    if (cfg->token_mode != PL_TOKEN_MODE_DISABLED && cfg->token_secret[0] == '\0') {
        snprintf(err, errlen, "token_mode: %s needs token_secret or token_secret_file",
                 token_mode_names[cfg->token_mode]);
        return -EINVAL;
    }
    if (refuse_senseless(cfg, err, errlen) != 0)
        return -EINVAL;
    if (cfg->park_timeout_ms == 0)
        cfg->park_timeout_ms = cfg->connection_timeout_ms + 5000;
    return 0;
}

static void print_value(const pl_config *cfg, const setting *s, FILE *out)
{
    const char *base = (const char *)cfg + s->offset;

    switch (s->type) {
    case T_LISTEN: {
        const pl_listen_addr *a = (const pl_listen_addr *)(const void *)base;
        if (a->host[0] != '\0')
            fprintf(out, strchr(a->host, ':') ? "[%s]:%u" : "%s:%u", a->host, a->port);
        break;
    }
    case T_STRING:
    case T_CIDRS:
        fputs(base, out);
        break;
    case T_SECRET:
    case T_HEADER: /* dispatch_token: a secret too */
        fputs(*base ? "(set)" : "", out);
        break;
    case T_CHOICE: {
        int i;
        memcpy(&i, base, sizeof(int));
        fputs(s->choices[i], out);
        break;
    }
    case T_U64: {
        uint64_t v;
        memcpy(&v, base, sizeof(v));
        fprintf(out, "%llu", (unsigned long long)v);
        break;
    }
    }
}

void pl_config_print(const pl_config *cfg, FILE *out)
{
    for (size_t i = 0; i < NSETTINGS; i++) {
        fprintf(out, "%s = ", settings[i].name);
        print_value(cfg, &settings[i], out);
        fputc('\n', out);
    }
}

void pl_config_usage(FILE *out)
{
    fputs("usage: pilotlight [options]\n\n"
          "  --config FILE      read settings from FILE (also PILOTLIGHT_CONFIG)\n"
          "  --check-config     validate, print the effective configuration, exit\n"
          "  --help, --version\n\n"
          "settings (flag, environment variable, default):\n", out);
    for (size_t i = 0; i < NSETTINGS; i++) {
        char flag[64], env[64];
        size_t n = strlen(settings[i].name);

        for (size_t j = 0; j <= n; j++) {
            char c = settings[i].name[j];
            flag[j] = c == '_' ? '-' : c;
            env[j] = (char)toupper((unsigned char)c);
        }
        fprintf(out, "  --%-22s PILOTLIGHT_%-22s %s\n      %s\n", flag, env,
                settings[i].def, settings[i].help);
    }
}

void pl_config_diff(const pl_config *old, const pl_config *cfg,
                    void (*fn)(const char *name, const char *value, void *arg), void *arg)
{
    for (size_t i = 0; i < NSETTINGS; i++) {
        const setting *s = &settings[i];
        size_t size = s->type == T_U64 ? sizeof(uint64_t)
                      : s->type == T_CHOICE ? sizeof(int)
                      : s->type == T_LISTEN ? sizeof(pl_listen_addr) : PL_CONFIG_STRING_MAX;
        char value[PL_CONFIG_STRING_MAX + 8];
        FILE *f;

        if (memcmp((const char *)old + s->offset, (const char *)cfg + s->offset, size) == 0)
            continue;
        f = fmemopen(value, sizeof(value), "w");
        if (f == NULL)
            continue;
        print_value(cfg, s, f);
        fputc('\0', f);
        fclose(f);
        fn(s->name, value, arg);
    }
}

uint64_t pl_config_fit_nofile(pl_config *cfg, uint64_t nofile, pl_config_fds *fds)
{
    /* The process's own: listeners, the loop's, logs, the spare given up
     * to refuse, the connections being answered 503 over a limit. */
    const uint64_t own = 64;
    int split = cfg->dispatch_listen.host[0] != '\0';
    uint64_t ring = cfg->ring_peers[0] != '\0' || cfg->ring_dns[0] != '\0' ? PL_RING_MEMBERS_MAX : 0;
    uint64_t dispatch = split ? cfg->dispatch_max_connections : 0;
    /* A limit that small is a test's: half of it for connections. */
    uint64_t left = nofile > 2 * own + ring ? nofile - own - ring : nofile / 2, used;

    /* A limit too small for both: the dispatch plane keeps a quarter. */
    if (split && dispatch + cfg->max_connections > left && dispatch > left / 4)
        dispatch = left / 4;
    if (split)
        cfg->dispatch_max_connections = dispatch;
    if (cfg->max_connections > left - dispatch)
        cfg->max_connections = left - dispatch;
    if (fds != NULL) {
        used = cfg->max_connections + dispatch + ring;
        fds->nofile = nofile;
        fds->controllers = cfg->max_connections;
        fds->dispatch = dispatch;
        fds->ring = ring;
        fds->own = nofile > used ? nofile - used : 0;
    }
    return cfg->max_connections;
}

void pl_config_log_notes(const pl_config *cfg)
{
    const char *note = cfg->notes, *nl;
    char esc[sizeof(cfg->notes) * 6];

    for (; (nl = strchr(note, '\n')) != NULL; note = nl + 1) {
        pl_log_escape(esc, sizeof(esc), note, (size_t)(nl - note));
        PL_LOG(PL_LOG_WARN, "configuration", "\"note\":\"%s\"", esc);
    }
}
