/*
 * text_int.h - internals of the text API (src/api/text.c) for the tests
 * only; not part of include/ember.h.
 */
#ifndef EMBER_API_TEXT_INT_H
#define EMBER_API_TEXT_INT_H

#include "core/error.h"
#include "ember.h"

/* TESTS ONLY: later generate calls on t see the tokens of text (tokenized
   without added specials) in place of the ones the model samples, and end
   with it, as the server's ember_test_output does; NULL clears it. Not
   thread-safe: set it while no call runs on t. */
int ember_text_script(ember_text *t, const char *text, ember_error *err);

#endif
