/* handover.h -- the binary upgrade's state hand-over: the wire format that
 * carries listening sockets, parked polls and idle connections from an old
 * process to a new one over a Unix SOCK_SEQPACKET socket (descriptors as
 * SCM_RIGHTS).
 *
 * One message = a 12-byte header (magic "PLHO", version, record count, body
 * length, all little-endian) and at most PL_HANDOVER_BATCH records, each a
 * 2-byte length, a 1-byte type and its fields; every record of a type that
 * carries a socket has exactly one descriptor, in record order. Nothing is
 * trusted: lengths, counts and descriptors are checked before use.
 * docs/handover.md describes each record's fields. */
#ifndef PILOTLIGHT_HANDOVER_H
#define PILOTLIGHT_HANDOVER_H

#include <stddef.h>
#include <stdint.h>

#include "pilotlight/key.h"

#define PL_HANDOVER_VERSION 1
#define PL_HANDOVER_BATCH 32       /* records (and descriptors) per message */
#define PL_HANDOVER_MSG_MAX 32768  /* bytes per message */
#define PL_HANDOVER_ID_MAX 256     /* controller id bytes */

/* The variable that tells a new process which descriptor to read. */
#define PL_HANDOVER_ENV "PILOTLIGHT_UPGRADE_FD"

typedef enum {
    PL_HO_HELLO = 1, /* new -> old: ready to receive; count = its pid */
    PL_HO_LISTENER,  /* old -> new: a listening socket (fd) */
    PL_HO_PARKED,    /* old -> new: a parked poll (fd) and its waiter */
    PL_HO_IDLE,      /* old -> new: an idle keep-alive connection (fd) */
    PL_HO_END,       /* old -> new: no more; count = records sent before */
    PL_HO_READY,     /* new -> old: everything adopted; count = its pid */
    PL_HO_FAIL,      /* new -> old: adoption failed; id = why */
    PL_HO__COUNT
} pl_handover_type;

typedef struct {
    uint8_t type;        /* pl_handover_type */
    uint8_t serves;      /* LISTENER, PARKED, IDLE: PL_SERVE_* of its listener */
    uint8_t keep_alive;  /* PARKED: the poll's request allows keep-alive */
    uint64_t count;      /* HELLO, READY: pid; END: records before it */
    uint64_t age_ms;     /* PARKED: how long it has been parked */
    uint32_t ka_idle_s, ka_interval_s, ka_count, user_timeout_ms; /* PARKED */
    pl_key key;          /* PARKED; strings point into the message buffer */
    const char *id;      /* PARKED: controller id; FAIL: reason */
    size_t id_len;
    int fd;              /* LISTENER, PARKED, IDLE; -1 otherwise */
} pl_handover_rec;

/* Whether records of <type> carry a descriptor. */
int pl_handover_has_fd(unsigned type);

/* Encodes <n> records (n <= PL_HANDOVER_BATCH) into <buf> (<cap> bytes).
 * Returns the length, or 0 when they do not fit or a field is too long. */
size_t pl_handover_encode(const pl_handover_rec *recs, size_t n, char *buf, size_t cap);

/* Decodes the message <buf> (<len> bytes) into <recs> (room for
 * PL_HANDOVER_BATCH); strings point into <buf>; fds are set to -1. Returns
 * the record count, or -EPROTO when the message is malformed, of another
 * version, or names an unknown type. */
int pl_handover_decode(const char *buf, size_t len, pl_handover_rec *recs);

/* Sends <n> records and their descriptors on <sock>. Returns 0 or -errno. */
int pl_handover_send(int sock, const pl_handover_rec *recs, size_t n);

/* Receives one message into <recs> (room for PL_HANDOVER_BATCH), decoding
 * into <buf> (PL_HANDOVER_MSG_MAX bytes), and gives each record that
 * carries a descriptor its own. Returns the record count, 0 at end of file,
 * or -errno (-EPROTO when malformed); on error every descriptor received is
 * closed. */
int pl_handover_recv(int sock, pl_handover_rec *recs, char *buf);

#endif
