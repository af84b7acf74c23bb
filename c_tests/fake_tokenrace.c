/* A stand-in for libtokenrace.so that the loader of tokenrace.hpp must refuse: it reports ABI
 * version FAKE_ABI_VERSION (by default this header's; tests/c_abi.rs also builds it with 999)
 * and has no function but these two. */
#include "tokenrace.h"

#ifndef FAKE_ABI_VERSION
#define FAKE_ABI_VERSION TOKENRACE_ABI_VERSION
#endif

uint32_t tokenrace_abi_version(void) { return FAKE_ABI_VERSION; }

const char *tokenrace_version(void) { return "0.0.0-fake"; }
