/* message.h -- the dispatch body: {"dequeuedMessage": {...}}.
 *
 * One strict pass (json.h) validates the whole body, reads the key and finds
 * the dequeuedMessage value's bytes, which are what the controller receives:
 * exactly the bytes that were validated. A body is accepted only when it is
 * RFC 8259 JSON that JavaScript's JSON.parse (the controller) reads the same
 * way: UTF-8 without a BOM, the four JSON whitespace bytes, no duplicate
 * member name in any object (decoded names compared), nothing after the
 * document, and no key string that decodes to a NUL or a lone surrogate. */
#ifndef PILOTLIGHT_MESSAGE_H
#define PILOTLIGHT_MESSAGE_H

#include <errno.h>
#include <stddef.h>

#include "pilotlight/json.h"
#include "pilotlight/key.h"

typedef struct {
    pl_key key;           /* strings point into the body, or into <owned> */
    const char *payload;  /* the dequeuedMessage value's bytes, in the body */
    size_t payload_len;
    char *owned;          /* key strings that had escapes, decoded */
} pl_message;

#define PL_MESSAGE_EINVAL (-EINVAL)
#define PL_MESSAGE_ENOMEM (-ENOMEM)

/* Deepest nesting of arrays and objects accepted. */
#define PL_MESSAGE_MAX_DEPTH PL_JSON_MAX_DEPTH

/* Parses <body> (<len> bytes, must outlive <m>). Returns 0 and fills <m>;
 * PL_MESSAGE_EINVAL with *err set to a message naming what is wrong (JSON
 * string content, static or in a buffer valid until the next call);
 * PL_MESSAGE_ENOMEM when a very large body needed scratch memory that could
 * not be had. On error <m> needs no release. */
int pl_message_parse(const char *body, size_t len, pl_message *m,
                     const char **err);

/* Frees what pl_message_parse() allocated (decoded key strings, rarely). */
void pl_message_release(pl_message *m);

#endif
