/* confirm_rule.c -- delivery = confirm's rule: what TCP's facts about a
 * payload written to a controller allow the broker to do. */
#include "pilotlight/confirm_rule.h"

uint64_t pl_confirm_rule_wait_ms(const pl_confirm_facts *f, uint64_t max_ms)
{
    /* Unknown values are taken as Linux's first RTO (1 s), no round trip. */
    uint64_t rt = (uint64_t)f->rtt_us + 4 * (uint64_t)f->rttvar_us;
    uint64_t rto = f->rto_us != 0 ? f->rto_us : 1000000;
    uint64_t ms = (3 * (rt + rto) + 999) / 1000 + 2 * PL_CONFIRM_DELACK_MS;

    return ms < max_ms ? ms : max_ms;
}

pl_confirm_action pl_confirm_rule_decide(const pl_confirm_facts *f, const pl_confirm_times *t,
                                         uint64_t now, uint64_t *until, pl_confirm_outcome *why)
{
    uint64_t end;

    if (f->acked) {
        *why = PL_CONFIRM_ACKED;
        return PL_CONFIRM_DELIVERED;
    }
    if (f->unsent) {
        /* Its HTTP client cannot act on part of a response: taking the run
         * back (a reset drops the rest) is safe, and worth it once the
         * controller is gone, the budget spent, or another poll waits. */
        if (f->fin || f->reset || f->gave_up || now >= t->deadline ||
            (t->others && now >= t->late_at)) {
            *why = PL_CONFIRM_UNSENT;
            return PL_CONFIRM_RETRY;
        }
        *until = t->others && t->late_at < t->deadline ? t->late_at : t->deadline;
        return PL_CONFIRM_WAIT;
    }
    if (f->reset && f->fin) {
        /* Its FIN, sent as it closed, did not acknowledge the run, and the
         * rest of the run met a closed socket: no reader had it whole. */
        *why = PL_CONFIRM_CLOSED_UNREAD;
        return PL_CONFIRM_RETRY;
    }
    if (f->reset) {
        /* A reset carries an ACK that Linux does not read: whether the run
         * was taken cannot be known. A reader that took it closes with a FIN
         * that acknowledges it; one that closes with the run unread resets.
         * Not offered again, as it may have been read; false, as a false
         * costs a cold start where a wrong true costs the run's time. */
        *why = PL_CONFIRM_RESET_AFTER_SEND;
        return PL_CONFIRM_UNDECIDED;
    }
    end = f->left_at + pl_confirm_rule_wait_ms(f, t->wait_max_ms);
    if (now >= end) {
        *why = PL_CONFIRM_UNACKNOWLEDGED;
        return PL_CONFIRM_RETRY;
    }
    *until = end;
    return PL_CONFIRM_WAIT;
}
