/* fault.c - see fault.h; and the allocator of alloc.h. */
#include "fault.h"

#include <stdatomic.h>
#include <stdlib.h>

#include "alloc.h"

typedef struct fault_state {
    atomic_bool armed, sticky;
    atomic_long nth, calls, injected;
} fault_state;

static atomic_int g_any; /* some kind armed, or short reads on */
static atomic_int g_short;
static atomic_bool g_hold;
static fault_state g_kind[EMBER_FAULT_NKINDS];

void ember_fault_arm(ember_fault_kind kind, long nth, bool sticky) {
    if ((unsigned)kind >= EMBER_FAULT_NKINDS) return;
    fault_state *f = &g_kind[kind];
    atomic_store(&f->armed, false);
    atomic_store(&f->calls, 0);
    atomic_store(&f->injected, 0);
    atomic_store(&f->nth, nth < 0 ? 0 : nth);
    atomic_store(&f->sticky, sticky);
    atomic_store(&f->armed, true);
    atomic_store(&g_any, 1);
}

void ember_fault_reset(void) {
    atomic_store(&g_any, 0);
    atomic_store(&g_short, 0);
    atomic_store(&g_hold, false);
    for (int k = 0; k < EMBER_FAULT_NKINDS; k++) atomic_store(&g_kind[k].armed, false);
}

long ember_fault_calls(ember_fault_kind kind) {
    return (unsigned)kind < EMBER_FAULT_NKINDS ? atomic_load(&g_kind[kind].calls) : 0;
}

long ember_fault_injected(ember_fault_kind kind) {
    return (unsigned)kind < EMBER_FAULT_NKINDS ? atomic_load(&g_kind[kind].injected) : 0;
}

bool ember_fault_hit(ember_fault_kind kind) {
    if (!atomic_load_explicit(&g_any, memory_order_relaxed)) return false;
    if ((unsigned)kind >= EMBER_FAULT_NKINDS || atomic_load(&g_hold)) return false;
    fault_state *f = &g_kind[kind];
    if (!atomic_load(&f->armed)) return false;
    long c = atomic_fetch_add(&f->calls, 1) + 1, n = atomic_load(&f->nth);
    if (n <= 0 || c < n || (c > n && !atomic_load(&f->sticky))) return false;
    atomic_fetch_add(&f->injected, 1);
    return true;
}

void ember_fault_hold(bool on) {
    atomic_store(&g_hold, on);
}

void ember_fault_short_reads(int max_bytes) {
    atomic_store(&g_short, max_bytes > 0 ? max_bytes : 0);
    if (max_bytes > 0) atomic_store(&g_any, 1);
}

unsigned long ember_fault_read_cap(unsigned long n) {
    if (!atomic_load_explicit(&g_any, memory_order_relaxed)) return n;
    unsigned long cap = (unsigned long)atomic_load(&g_short);
    return cap && cap < n ? cap : n;
}

void *ember_malloc(size_t n) {
    return ember_fault_hit(EMBER_FAULT_ALLOC) ? NULL : malloc(n);
}

void *ember_calloc(size_t count, size_t size) {
    return ember_fault_hit(EMBER_FAULT_ALLOC) ? NULL : calloc(count, size);
}

void *ember_realloc(void *p, size_t n) {
    return ember_fault_hit(EMBER_FAULT_ALLOC) ? NULL : realloc(p, n);
}

void *ember_aligned_alloc(size_t align, size_t n) {
    if (ember_fault_hit(EMBER_FAULT_ALLOC)) return NULL;
    size_t r = (n + align - 1) & ~(align - 1);
    if (r < n) return NULL;
    return aligned_alloc(align, r ? r : align);
}
