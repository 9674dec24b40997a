/*
 * fault.h - simulated failures, for tests (as SQLite's malloc and I/O fault
 * injection): the Nth allocation, file read or streamed write from now on
 * fails, so that the paths that handle out-of-memory and I/O errors run.
 *
 * Where the hooks are:
 *   EMBER_FAULT_ALLOC  every ember_malloc / ember_calloc / ember_realloc /
 *                      ember_aligned_alloc (alloc.h), so ember_strdup and
 *                      friends too: the call returns NULL.
 *   EMBER_FAULT_READ   every open, map and read of a file through
 *                      core/mapfile.c (weights, GGUF files, tokenizer and
 *                      config JSON, templates): the call fails with EIO.
 *                      (The 4-byte magic sniffing and the KV disk cache read
 *                      with stdio, outside the hook.)
 *   EMBER_FAULT_WRITE  every chunk the server hands to a streaming response
 *                      (src/serve): the stream ends as when the socket write
 *                      fails (a client gone mid-stream).
 * ember_fault_short_reads(k) also makes every read() of a whole file return
 * at most k bytes (a short read is not an error; the result must not change).
 *
 * Armed kinds count their calls from every thread; a walk over the failure
 * points of a run is: count the calls of a clean run (nth 0), then for
 * N = 1, 2, ... arm N, run, check the error is clean, reset. tests/fault.h
 * has that loop.
 *
 * The state is process-wide: the one exception to "no global mutable state",
 * because what it simulates (the allocator, the file system) is process-wide
 * too. Off (the default), a hook costs one relaxed atomic load.
 */
#ifndef EMBER_CORE_FAULT_H
#define EMBER_CORE_FAULT_H

#include <stdbool.h>

typedef enum ember_fault_kind {
    EMBER_FAULT_ALLOC,
    EMBER_FAULT_READ,
    EMBER_FAULT_WRITE,
    EMBER_FAULT_NKINDS
} ember_fault_kind;

/* Arms kind and restarts its count: the nth call from now (1-based) fails;
   sticky: that call and every later one. nth 0 only counts. */
void ember_fault_arm(ember_fault_kind kind, long nth, bool sticky);
/* Disarms every kind (counts and failures made stay readable) and turns
   short reads off. */
void ember_fault_reset(void);
/* Calls of kind counted since it was armed. */
long ember_fault_calls(ember_fault_kind kind);
/* Failures made since it was armed. */
long ember_fault_injected(ember_fault_kind kind);
/* The hook: counts a call of kind; true when this call must fail. */
bool ember_fault_hit(ember_fault_kind kind);

/* While held, the hooks neither count nor fail (a test inspecting state
   between the steps of a walked run). */
void ember_fault_hold(bool on);

/* Every read() of a whole file returns at most max_bytes (0: off). */
void ember_fault_short_reads(int max_bytes);
/* The cap a reader applies to a read of n bytes (n when off). */
unsigned long ember_fault_read_cap(unsigned long n);

#endif
