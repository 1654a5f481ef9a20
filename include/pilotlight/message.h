/* message.h -- the dispatch body: {"dequeuedMessage": {...}}.
 *
 * Parsed once with cJSON to validate it and read the key; the payload handed
 * to the controller is the original bytes of the dequeuedMessage value, not a
 * re-serialisation. */
#ifndef PILOTLIGHT_MESSAGE_H
#define PILOTLIGHT_MESSAGE_H

#include <stddef.h>

#include "pilotlight/key.h"

typedef struct {
    pl_key key;           /* strings point into <root> */
    const char *payload;  /* the dequeuedMessage value's bytes */
    size_t payload_len;
    char *owned;          /* set when the payload had to be re-serialised */
    void *root;           /* the parsed document (cJSON *) */
} pl_message;

#define PL_MESSAGE_EINVAL (-1)
#define PL_MESSAGE_ENOMEM (-2)

/* Routes cJSON's allocations through pl_malloc/pl_free. Call once. */
void pl_message_init(void);

/* Parses <body> (<len> bytes, must outlive <m>). Returns 0 and fills <m>;
 * PL_MESSAGE_EINVAL with *err set to a static message naming the offending
 * field; PL_MESSAGE_ENOMEM. On error <m> needs no release. */
int pl_message_parse(const char *body, size_t len, pl_message *m,
                     const char **err);

/* Frees what pl_message_parse() allocated. */
void pl_message_release(pl_message *m);

#endif
