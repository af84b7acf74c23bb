/* What the C test programs share: the CHECK macro, which counts a failed condition in `failures`
 * and reports it with the library's last error, without stopping, so one run shows every
 * failure; and the plain batch and output structs the draw tests start from. */
#ifndef TOKENRACE_TEST_CHECK_H
#define TOKENRACE_TEST_CHECK_H
#include "tokenrace.h"
#include <stdio.h>
#include <string.h>

static int failures = 0;
#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__,       \
              __LINE__, #cond, tokenrace_last_error());                              \
      failures++;                                                                    \
    }                                                                                \
  } while (0)

/* A draw batch of `rows` float32 rows of `vocab` logits, every other field 0 (off). */
static inline tokenrace_batch f32_batch(const float *logits, uint64_t rows, uint64_t vocab) {
  tokenrace_batch b;
  memset(&b, 0, sizeof b);
  b.struct_size = sizeof b;
  b.dtype = TOKENRACE_DTYPE_F32;
  b.logits = logits;
  b.rows = rows;
  b.vocab = vocab;
  return b;
}

/* A draw output writing `tokens` alone, every other field 0 (off). */
static inline tokenrace_output tokens_output(int32_t *tokens) {
  tokenrace_output o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.tokens = tokens;
  return o;
}

#endif
