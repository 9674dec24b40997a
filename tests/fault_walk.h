/*
 * fault_walk.h - walking the failure points of a run (src/core/fault.h):
 * one clean run counts the calls of a kind (allocations, file reads,
 * streamed writes); then for N = 1, 2, ... the Nth call fails, once, and the
 * run must end either with a correct result (the failure was recovered) or
 * with a clean error: a status, a message, for an allocation
 * EMBER_ERR_NOMEM and for a read EMBER_ERR_IO; never with an error when
 * nothing failed. The run function itself checks what "correct" and "as it
 * was" mean for its surface, and that nothing half-built is handed out.
 *
 * Bounded: every N up to a cap (400 by default, 150 under the sanitizers),
 * then a number of points spread evenly over the rest (60, or 40), the last
 * call among them; a slow surface asks for fewer (fault_walk_n). The environment raises the
 * bounds: EMBER_FAULT_ALL=1000000000 walks every point.
 * EMBER_FAULT_ONLY=N walks the single point N (to debug one).
 * Under AddressSanitizer each walk ends with a leak check, so a leak is
 * pinned to its walk (the run at exit catches it anyway).
 */
#ifndef EMBER_TEST_FAULT_WALK_H
#define EMBER_TEST_FAULT_WALK_H

#include "core/fault.h"
#include "core/util.h"
#include "test.h"

#if defined(__SANITIZE_ADDRESS__)
#define FAULT_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FAULT_LSAN 1
#endif
#endif
#ifdef FAULT_LSAN
#include <sanitizer/lsan_interface.h>
#define FAULT_SANITIZED 1
#else
#define FAULT_SANITIZED 0
#endif

typedef int (*fault_run_fn)(void *user, ember_error *err);

static long g_fault_points, g_fault_failed, g_fault_recovered;
/* true: any status is a clean error (a surface that cannot tell its causes
   apart, e.g. a stream cut by a failure); the run still must fail only when
   a failure was injected */
static bool g_fault_any_status;
static long g_fault_n; /* the point being walked (0: the clean run), for messages */

static long fault_env(const char *name, long dflt) {
    const char *v = getenv(name);
    return v && *v ? atol(v) : dflt;
}

/* Walks run's failure points of kind: every one up to all, then sampled
   more (the environment's EMBER_FAULT_ALL / EMBER_FAULT_SAMPLED win when
   larger). Returns the calls the clean run made. */
static long fault_walk_n(const char *name, ember_fault_kind kind, fault_run_fn run, void *user, long all, long sampled) {
    static const char *const kinds[] = {"alloc", "read", "write"};
    if (fault_env("EMBER_FAULT_ALL", 0) > all) all = fault_env("EMBER_FAULT_ALL", 0);
    if (fault_env("EMBER_FAULT_SAMPLED", 0) > sampled) sampled = fault_env("EMBER_FAULT_SAMPLED", 0);
    double t0 = ember_now();
    ember_error err = {0};
    ember_fault_arm(kind, 0, false);
    int rc = run(user, &err);
    long calls = ember_fault_calls(kind);
    ember_fault_reset();
    CHECKF(rc == EMBER_OK, "%s: the run without failures: %s", name, err.msg);
    if (rc) return 0;
    CHECKF(calls > 0, "%s: no %s calls to fail", name, kinds[kind]);
    long points = 0, failed = 0, recovered = 0;
    long upto = calls < all ? calls : all;
    long extra = calls > upto ? (sampled < calls - upto ? sampled : calls - upto) : 0;
    for (long i = 0; i < upto + extra; i++) {
        long n = i < upto ? i + 1 : upto + (calls - upto) * (i - upto + 1) / extra;
        if (fault_env("EMBER_FAULT_ONLY", 0) && n != fault_env("EMBER_FAULT_ONLY", 0)) continue;
        ember_err_clear(&err);
        g_fault_n = n;
        ember_fault_arm(kind, n, false);
        rc = run(user, &err);
        long injected = ember_fault_injected(kind);
        ember_fault_reset();
        g_fault_n = 0;
        points++;
        if (rc == EMBER_OK) {
            recovered++;
            continue;
        }
        failed++;
        CHECKF(injected > 0, "%s: %s %ld: an error with no failure injected: %s", name, kinds[kind], n, err.msg);
        CHECKF(err.msg[0] != 0, "%s: %s %ld: status %d without a message", name, kinds[kind], n, rc);
        int want = kind == EMBER_FAULT_ALLOC ? EMBER_ERR_NOMEM : kind == EMBER_FAULT_READ ? EMBER_ERR_IO : rc;
        if (!g_fault_any_status)
            CHECKF(rc == want, "%s: %s %ld failed: status %s, want %s: %s", name, kinds[kind], n, ember_status_str(rc),
               ember_status_str(want), err.msg);
    }
#ifdef FAULT_LSAN
    CHECKF(__lsan_do_recoverable_leak_check() == 0, "%s: leaks after the walk (above)", name);
#endif
    fprintf(stderr, "fault walk %-34s %-5s %7ld calls, %4ld points: %4ld clean errors, %4ld recovered (%.1f s)\n",
            name, kinds[kind], calls, points, failed, recovered, ember_now() - t0);
    g_fault_points += points;
    g_fault_failed += failed;
    g_fault_recovered += recovered;
    return calls;
}

/* The default bounds: every point up to 400, then 60 more; under the
   sanitizers (each run several times slower) up to 150, then 40. */
static long fault_walk(const char *name, ember_fault_kind kind, fault_run_fn run, void *user) {
    return fault_walk_n(name, kind, run, user, FAULT_SANITIZED ? 150 : 400, FAULT_SANITIZED ? 40 : 60);
}

#endif
