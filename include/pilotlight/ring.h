/* ring.h -- which instance owns a key: rendezvous hashing over the
 * instances that are up.
 *
 * Pure: no sockets, no clock. Every instance computes the same owner from
 * the same members: a member is named by the address its peers reach it
 * at ("10.0.0.7:8080"), a key by its canonical encoding (key.h), and both
 * are hashed with a fixed function (no per-process secret, unlike hash.h),
 * which instances of every version must share. A key moves only when its
 * owner leaves, or when a member joins that outranks the owner for it:
 * about 1/N of the keys when the N-th member joins. */
#ifndef PILOTLIGHT_RING_H
#define PILOTLIGHT_RING_H

#include <stddef.h>
#include <stdint.h>

#include "pilotlight/key.h"

#define PL_RING_MEMBERS_MAX 64
#define PL_RING_NAME_MAX 64 /* "host:port" with its NUL; an IPv6 host in [] */

typedef struct {
    char name[PL_RING_NAME_MAX];
    uint64_t seed; /* the name's hash */
} pl_ring_member;

/* The members, sorted by name. */
typedef struct {
    pl_ring_member m[PL_RING_MEMBERS_MAX];
    size_t n;
} pl_ring;

/* Empties <r>. */
void pl_ring_init(pl_ring *r);

/* Adds the member <name> (<len> bytes; once: adding it again changes
 * nothing). Returns 0, -ENOSPC when the ring is full, or -EINVAL when the
 * name is too long or empty. */
int pl_ring_add(pl_ring *r, const char *name, size_t len);

/* The index of member <name>, or -ENOENT. */
int pl_ring_find(const pl_ring *r, const char *name, size_t len);

/* Whether <a> and <b> have the same members. */
int pl_ring_same(const pl_ring *a, const pl_ring *b);

/* A fixed hash of <r>'s members (the same on every instance for the same
 * members, 0 for none): how members compare their views in a word. */
uint64_t pl_ring_digest(const pl_ring *r);

/* A member's word on its view, as the X-PL-Ring header carries it: "<the
 * view's digest, 16 lowercase hex digits> <name>" on a check, "<digest>
 * <its wall clock, epoch ms> <name>" on an answer (with_clock). */
typedef struct {
    uint64_t digest;
    uint64_t ms;      /* with_clock only */
    char name[PL_RING_NAME_MAX];
} pl_ring_view;

/* Reads <v> (<len> bytes) as a view, strictly: fields one space apart,
 * the clock 1 to 13 digits, the name 1 to PL_RING_NAME_MAX - 1 bytes of
 * printable ASCII but the space. Returns 0, or -EINVAL. */
int pl_ring_view_read(const char *v, size_t len, int with_clock, pl_ring_view *out);

/* The fixed hash of a key (its canonical encoding), for pl_ring_owner. */
uint64_t pl_ring_key_hash(const pl_key *k);

/* The index of the member that owns the key whose hash is <kh>: the one
 * that ranks it highest. <r> must have a member. */
size_t pl_ring_owner(const pl_ring *r, uint64_t kh);

/* The owner of that key were member <skip> not there (the owner before it
 * joined); r->n when it is the only member. */
size_t pl_ring_owner_but(const pl_ring *r, uint64_t kh, size_t skip);

/* Splits a member's name "host:port" (an IPv6 host in [], <len> bytes)
 * into <host> (NUL-terminated, without brackets, <cap> bytes) and *port.
 * The host may be a DNS name; it becomes part of a URL, so it holds no
 * space, control byte, '/', '?', '#' or '@'. Returns 0, or -EINVAL. */
int pl_ring_split(const char *s, size_t len, char *host, size_t cap, uint16_t *port);

/* Calls <fn> for each name of <list> (names separated by commas or
 * spaces), with its length. Returns how many. */
size_t pl_ring_each_name(const char *list, void (*fn)(const char *s, size_t len, void *arg),
                         void *arg);

/* Checks the ring's settings: <peers> (a list of names) or <dns> ("name:
 * port"), not both, and <self> ("host:port"), which must be one of <peers>
 * when they are given. All empty: no ring. Returns 0, or -EINVAL with a
 * message naming the setting in <err>. */
int pl_ring_check_config(const char *peers, const char *dns, const char *self, char *err,
                         size_t errlen);

#endif
