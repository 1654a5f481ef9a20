/* poll.h -- what a controller's long-poll asks for: its key, read from the
 * x-trigger-* headers, with the deployment token verified when configured.
 * No sockets: the broker and the fuzzers call it alike. */
#ifndef PILOTLIGHT_POLL_H
#define PILOTLIGHT_POLL_H

#include "pilotlight/h1.h"
#include "pilotlight/key.h"
#include "pilotlight/token.h"

#define PL_POLL_CONTROLLER_ID_MAX 256

/* Fills <key> from the headers of <req>. <key>'s strings point into <req>
 * or <claims>. With a <verifier>, the deployment-id header is verified
 * (<now> in seconds since the epoch) and *token set to its pl_token_result;
 * otherwise *token is PL_TOKEN_UNCHECKED. A valid token names the deployment, and must be
 * for the version in the header. The controller id, the version and the
 * key's deployment (the header, or its token's claim) must be well-formed
 * UTF-8 without control characters, as any key a dispatch body can name.
 * Returns 0, or -EINVAL (malformed: answered 400, *err naming the header)
 * or -EACCES (<enforce> and the token is not valid: 401), with *err set,
 * possibly to <msg>. */
int pl_poll_key(const pl_request *req, pl_token_verifier *verifier, int enforce,
                double now, pl_key *key, pl_token_claims *claims, int *token,
                const char **err, char *msg, size_t msglen);

#endif
