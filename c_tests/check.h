/* The CHECK macro of the C test programs: counts a failed condition in `failures` and reports
 * it with the library's last error, without stopping, so one run shows every failure. */
#ifndef TOKENRACE_TEST_CHECK_H
#define TOKENRACE_TEST_CHECK_H
#include "tokenrace.h"
#include <stdio.h>

static int failures = 0;
#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__,       \
              __LINE__, #cond, tokenrace_last_error());                              \
      failures++;                                                                    \
    }                                                                                \
  } while (0)

#endif
