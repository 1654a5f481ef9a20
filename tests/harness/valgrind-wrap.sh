#!/usr/bin/env bash
# valgrind-wrap.sh -- runs pilotlight under valgrind memcheck, for the
# black-box suite (PILOTLIGHT_BIN points here, PL_VALGRIND_BIN at the real
# binary). Any memcheck error or definitely-lost byte makes the process exit
# 99, which the suite's teardown reports as a failure; the details go to
# $PL_VALGRIND_LOGS/vg.<pid>.log.
exec valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
    --show-leak-kinds=definite --track-fds=no \
    --log-file="${PL_VALGRIND_LOGS:-/tmp}/vg.%p.log" "${PL_VALGRIND_BIN:?}" "$@"
