/* cidr.h -- address ranges: a list of IPv4 and IPv6 prefixes ("10.0.0.0/8,
 * fd00::/8, 192.168.1.7"), parsed once and matched against a peer's
 * address. No I/O. */
#ifndef PILOTLIGHT_CIDR_H
#define PILOTLIGHT_CIDR_H

#include <stddef.h>
#include <stdint.h>

#include <sys/socket.h>

/* Most ranges one list holds. */
#define PL_CIDR_MAX 32

typedef struct {
    uint8_t addr[16]; /* IPv4 as IPv4-mapped IPv6 (::ffff:a.b.c.d) */
    uint8_t bits;     /* prefix length over those 128 bits */
} pl_cidr;

typedef struct {
    pl_cidr r[PL_CIDR_MAX];
    unsigned n; /* 0: the list is empty (matches nobody; callers decide) */
} pl_cidr_list;

/* Parses <text>: ranges separated by commas (spaces around them allowed),
 * each an address with an optional "/bits" (IPv4 0-32, IPv6 0-128; none
 * is the one address). Bits set past the prefix are refused: "10.0.0.1/8"
 * is a typo for 10.0.0.0/8 or for 10.0.0.1, and the list must not guess.
 * Returns 0, or -EINVAL with the offending range named in <err>. */
int pl_cidr_parse(const char *text, pl_cidr_list *out, char *err, size_t errlen);

/* Whether <sa> (AF_INET or AF_INET6; an IPv4-mapped IPv6 address counts as
 * its IPv4 one) lies in a range of <l>. */
int pl_cidr_match(const pl_cidr_list *l, const struct sockaddr *sa);

#endif
