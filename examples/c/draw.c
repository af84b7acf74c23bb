/* Draws one token per row of a batch: greedy, sampled, top-k/top-p, seeded, with logprobs.
 *
 * Build against an installed tokenrace (scripts/install.sh PREFIX):
 *   export PKG_CONFIG_PATH=PREFIX/lib/pkgconfig
 *   cc examples/c/draw.c -o draw $(pkg-config --cflags --libs tokenrace) \
 *      -Wl,-rpath,$(pkg-config --variable=libdir tokenrace) -lm
 *   ./draw
 * or against the build tree (cargo build --release):
 *   cc examples/c/draw.c -o draw -Iinclude -Ltarget/release -ltokenrace -Wl,-rpath,$PWD/target/release -lm
 *   ./draw
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "tokenrace.h"

enum { ROWS = 4, VOCAB = 32000 };

static int fail(const char *what) {
  fprintf(stderr, "%s: %s\n", what, tokenrace_last_error());
  return 1;
}

int main(void) {
  if (tokenrace_abi_version() != TOKENRACE_ABI_VERSION) {
    fprintf(stderr, "tokenrace.h is ABI %d, the library ABI %u\n", TOKENRACE_ABI_VERSION,
            (unsigned)tokenrace_abi_version());
    return 1;
  }

  /* Settings: the defaults, then any TOKENRACE_* variables, then ours. */
  tokenrace_config cfg = tokenrace_config_default();
  if (tokenrace_config_from_env(&cfg) != TOKENRACE_STATUS_OK) return fail("config");
  cfg.vocab_size = VOCAB;
  cfg.max_rows = 64;
  cfg.seed = 1; /* the stream of unseeded rows; seeded rows ignore it */
  cfg.has_seed = 1;
  tokenrace_sampler *sampler;
  if (tokenrace_sampler_new(&cfg, &sampler) != TOKENRACE_STATUS_OK) return fail("sampler");

  /* Logits as a runtime hands them over: rows x vocab f32 (bf16 and f16 work the same way). */
  float *logits = malloc(sizeof(float) * ROWS * VOCAB);
  if (!logits) return 1;
  for (int r = 0; r < ROWS; r++)
    for (int i = 0; i < VOCAB; i++) logits[r * VOCAB + i] = (float)(3.0 * sin(0.001 * i * (r + 1)));

  float temperature[ROWS] = {0.0f, 0.7f, 1.0f, 0.8f}; /* row 0 is greedy */
  int32_t top_k[ROWS] = {0, 50, 0, 40};               /* 0: off */
  float top_p[ROWS] = {1.0f, 0.9f, 1.0f, 0.95f};      /* 1: off */
  uint64_t seeds[ROWS] = {0, 0, 0, 1234};             /* row 3 is seeded */
  uint64_t offsets[ROWS] = {0, 0, 0, 17};             /* e.g. the token's position */
  uint8_t seeded[ROWS] = {0, 0, 0, 1};

  tokenrace_batch batch = {0};
  batch.struct_size = sizeof batch;
  batch.dtype = TOKENRACE_DTYPE_F32;
  batch.logits = logits;
  batch.rows = ROWS;
  batch.vocab = VOCAB;
  batch.temperature = temperature;
  batch.top_k = top_k;
  batch.top_p = top_p;
  batch.seeds = seeds;
  batch.offsets = offsets;
  batch.seeded = seeded;

  int32_t tokens[ROWS];
  uint32_t flags[ROWS];
  float logprobs[ROWS];
  tokenrace_output out = {0};
  out.struct_size = sizeof out;
  out.tokens = tokens;
  out.flags = flags;
  out.logprobs = logprobs; /* raw: log_softmax of the logits as given */

  if (tokenrace_draw(sampler, &batch, &out) != TOKENRACE_STATUS_OK) return fail("draw");
  printf("tokenrace %s, simd %s\n", tokenrace_version(), tokenrace_sampler_simd_level(sampler));
  for (int r = 0; r < ROWS; r++)
    printf("row %d: token %d, logprob %.4f%s\n", r, tokens[r], logprobs[r],
           (flags[r] & TOKENRACE_FLAG_GREEDY) ? " (greedy)" : "");

  /* A bad argument is refused with a message naming it, and nothing is written. */
  top_p[1] = 0.0f;
  if (tokenrace_draw(sampler, &batch, &out) == TOKENRACE_STATUS_INVALID_ARGUMENT)
    printf("refused: %s\n", tokenrace_last_error());

  tokenrace_sampler_free(sampler);
  free(logits);
  return 0;
}
