/*
 * alloc.h - the library's allocator: every allocation under src/ (the
 * command line aside) goes through these, so that a test can make the Nth
 * one fail (fault.h). They behave as malloc, calloc, realloc, aligned_alloc,
 * and memory they return is released with free(). A failed ember_realloc
 * leaves the old block as it was, as realloc does.
 *
 * tests/check_rules.sh keeps the bare calls out of src/.
 */
#ifndef EMBER_CORE_ALLOC_H
#define EMBER_CORE_ALLOC_H

#include <stddef.h>

void *ember_malloc(size_t n);
void *ember_calloc(size_t count, size_t size);
void *ember_realloc(void *p, size_t n);
/* align a power of two; n is rounded up to a multiple of align here. */
void *ember_aligned_alloc(size_t align, size_t n);

#endif
