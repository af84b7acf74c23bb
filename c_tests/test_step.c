/* The whole sampling step through the C ABI (since 0.2): CSR histories, the three penalties,
 * logit bias, a grammar bitmask and full-vocabulary output, checked against a plain draw of the
 * rows the float64 reference processed (step_reference.h); an error with its message and nothing
 * written; structs of the older sizes (without these fields) still draw as before. */
#include "tokenrace.h"
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "step_reference.h"

enum { ROWS = 2, V = 100, WORDS = 4, MASK_STRIDE = 5, FULL_STRIDE = 101 };

static const float SENTINEL = 12345.0f;

/* The CSR inputs of the two rows. tests/reference.rs repeats them, with main's logits and bitmask,
 * to write step_reference.h: a change here is a change there. */
static const int32_t prompt_ids[] = {10, 11, 10, /* row 1 */ 40, 41};
static const uint64_t prompt_offsets[] = {0, 3, 5};
static const int32_t output_ids[] = {10, 10, 12, /* row 1 */ 41};
static const uint64_t output_offsets[] = {0, 3, 4};
static const float repetition[] = {2.0f, 1.5f};
static const float frequency[] = {1.0f, 0.5f};
static const float presence[] = {0.5f, 0.25f};
static const int32_t bias_ids[] = {20, 20, 7, /* row 1 */ 55};
static float bias_values[] = {2.0f, 1.0f, -INFINITY, /* row 1 */ 4.0f};
static const uint64_t bias_offsets[] = {0, 3, 4};

static int bit_of(const int32_t *mask, int row, int i) {
  return (int)(((uint32_t)mask[row * MASK_STRIDE + i / 32] >> (i % 32)) & 1u);
}

/* Row `row` after its sampling step, as the float64 reference of tests/common/reference.rs
 * computes it from this file's inputs (step_reference.h, which tests/reference.rs writes and keeps
 * current). */
static void processed_row(int row, float *y) {
  memcpy(y, STEP_REFERENCE_ROWS + (size_t)row * V, V * sizeof(float));
}

static tokenrace_batch batch_of(const float *logits, const float *temps, const uint64_t *seeds,
                                const uint64_t *offsets, const float *top_p) {
  tokenrace_batch b = f32_batch(logits, ROWS, V);
  b.temperature = temps;
  b.seeds = seeds;
  b.offsets = offsets;
  b.top_p = top_p;
  return b;
}

static void fill(float *v, size_t n) {
  for (size_t i = 0; i < n; i++) v[i] = SENTINEL;
}

int main(void) {
  tokenrace_config cfg = tokenrace_config_default();
  cfg.seed = 3;
  cfg.has_seed = 1;
  tokenrace_sampler *s = NULL;
  CHECK(tokenrace_sampler_new(&cfg, &s) == TOKENRACE_STATUS_OK);

  static float x[ROWS * V];
  for (int r = 0; r < ROWS; r++)
    for (int i = 0; i < V; i++) x[r * V + i] = (float)((i * 37 + r * 11) % 50) / 10.0f - 2.0f;
  x[0 * V + 10] = 3.0f; /* in both histories: 3 / 2 - 1 * 2 - 0.5 = -1 */
  x[0 * V + 20] = 2.5f; /* biased twice: (2.5 + 3) = 5.5, the greedy token */
  x[0 * V + 30] = 9.0f; /* masked by the bitmask */
  x[0 * V + 7] = 8.0f;  /* banned by a -inf bias */
  x[1 * V + 41] = -1.0f; /* a negative logit in both histories: -1 * 1.5 - 0.5 - 0.25 */
  x[1 * V + 55] = 1.0f;  /* biased to 5 */
  static int32_t mask[ROWS * MASK_STRIDE];
  for (int k = 0; k < ROWS * MASK_STRIDE; k++) mask[k] = -1;
  mask[0 * MASK_STRIDE + 0] &= ~(1 << 30);            /* token 30 of row 0 */
  mask[0 * MASK_STRIDE + 3] = (int32_t)0x5a5a5a5f;    /* tokens 96..99 allowed, garbage past 100 */
  mask[1 * MASK_STRIDE + 3] = 0x0000000f;             /* zero bits past vocab */
  mask[1 * MASK_STRIDE + 4] = 0;                      /* the stride's padding word */
  mask[1 * MASK_STRIDE + 1] = (int32_t)0xf0f0f0f0;    /* half of tokens 32..63 */
  mask[1 * MASK_STRIDE + 1] |= 1 << (55 - 32) | 1 << (41 - 32);

  float temps[ROWS] = {0.0f, 1.0f};
  uint64_t seeds[ROWS] = {99, 100};
  uint64_t offs[ROWS] = {5, 6};
  float top_p[ROWS] = {1.0f, 0.9f};

  tokenrace_batch b = batch_of(x, temps, seeds, offs, top_p);
  b.prompt_ids = prompt_ids;
  b.prompt_offsets = prompt_offsets;
  b.output_ids = output_ids;
  b.output_offsets = output_offsets;
  b.repetition_penalty = repetition;
  b.frequency_penalty = frequency;
  b.presence_penalty = presence;
  b.bias_ids = bias_ids;
  b.bias_values = bias_values;
  b.bias_offsets = bias_offsets;
  b.token_bitmask = mask;
  b.bitmask_row_stride = MASK_STRIDE;

  int32_t tokens[ROWS] = {-1, -1};
  uint32_t flags[ROWS] = {0, 0};
  float lps[ROWS];
  static float full[ROWS * FULL_STRIDE];
  fill(full, ROWS * FULL_STRIDE);
  tokenrace_output o = tokens_output(tokens);
  o.flags = flags;
  o.logprobs = lps;
  o.logprob_mode = TOKENRACE_LOGPROB_MODE_PROCESSED;
  o.full_logprobs = full;
  o.full_row_stride = FULL_STRIDE;
  o.full_mode = TOKENRACE_FULL_MODE_PROCESSED_LOGITS;
  CHECK(tokenrace_draw(s, &b, &o) == TOKENRACE_STATUS_OK);
  CHECK(tokens[0] == 20);
  CHECK(flags[0] == TOKENRACE_FLAG_GREEDY);
  CHECK(full[0 * FULL_STRIDE + 20] == 5.5f); /* greedy rows: the penalised logit, undivided */
  CHECK(full[0 * FULL_STRIDE + 10] == -1.0f);
  CHECK(full[0 * FULL_STRIDE + 30] == -INFINITY && full[0 * FULL_STRIDE + 7] == -INFINITY);
  CHECK(full[0 * FULL_STRIDE + V] == SENTINEL && full[1 * FULL_STRIDE + V] == SENTINEL);

  /* The plain draw (no step fields) of the reference's processed rows: the same tokens, flags,
   * logprobs and processed logits. */
  static float y[ROWS * V];
  processed_row(0, y);
  processed_row(1, y + V);
  CHECK(y[1 * V + 41] == -1.0f * 1.5f - 0.5f - 0.25f);
  CHECK(y[1 * V + 55] == 5.0f);
  tokenrace_batch plain = batch_of(y, temps, seeds, offs, top_p);
  int32_t ptokens[ROWS] = {-1, -1};
  uint32_t pflags[ROWS] = {0, 0};
  float plps[ROWS];
  static float pfull[ROWS * FULL_STRIDE];
  fill(pfull, ROWS * FULL_STRIDE);
  tokenrace_output po = o;
  po.tokens = ptokens;
  po.flags = pflags;
  po.logprobs = plps;
  po.full_logprobs = pfull;
  CHECK(tokenrace_draw(s, &plain, &po) == TOKENRACE_STATUS_OK);
  CHECK(tokens[0] == ptokens[0] && tokens[1] == ptokens[1]);
  CHECK(flags[0] == pflags[0] && flags[1] == pflags[1]);
  CHECK(fabsf(lps[0] - plps[0]) <= 1e-5f && fabsf(lps[1] - plps[1]) <= 1e-5f);
  int same = 1;
  for (int k = 0; k < ROWS * FULL_STRIDE; k++) same &= full[k] == pfull[k];
  CHECK(same);
  /* Seeded rows repeat; a few seeds of row 1 all draw allowed tokens. */
  for (uint64_t seed = 0; seed < 50; seed++) {
    seeds[1] = seed;
    CHECK(tokenrace_draw(s, &b, &o) == TOKENRACE_STATUS_OK);
    CHECK(tokens[1] >= 0 && tokens[1] < V && bit_of(mask, 1, tokens[1]));
    CHECK(tokenrace_draw(s, &plain, &po) == TOKENRACE_STATUS_OK);
    CHECK(tokens[1] == ptokens[1]);
  }

  /* A +inf bias: INVALID_ARGUMENT naming the array, row, position and entry; nothing written. */
  bias_values[3] = INFINITY;
  int32_t untouched[ROWS] = {-7, -7};
  uint32_t uflags[ROWS] = {77, 77};
  o.tokens = untouched;
  o.flags = uflags;
  fill(full, ROWS * FULL_STRIDE);
  lps[0] = lps[1] = SENTINEL;
  CHECK(tokenrace_draw(s, &b, &o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(tokenrace_last_error(),
               "batch.bias_values[1]: position 0 (entry 3): inf is not a bias (finite, or -inf to ban)") != NULL);
  CHECK(untouched[0] == -7 && untouched[1] == -7 && uflags[0] == 77 && lps[0] == SENTINEL);
  int clean = 1;
  for (int k = 0; k < ROWS * FULL_STRIDE; k++) clean &= full[k] == SENTINEL;
  CHECK(clean);
  bias_values[3] = 4.0f;
  /* A bitmask stride below ceil(vocab / 32). */
  b.bitmask_row_stride = 3;
  CHECK(tokenrace_draw(s, &b, &o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(tokenrace_last_error(), "bitmask_row_stride") != NULL);
  b.bitmask_row_stride = MASK_STRIDE;
  /* A last offset whose ids would span more than the address space: refused naming the offsets
   * array and its row, before any id is read (it used to be read: SIGSEGV). Every list. */
  static const uint64_t huge[][ROWS + 1] = {{0, 3, (uint64_t)1 << 61}, {0, 3, UINT64_MAX}};
  for (int h = 0; h < 2; h++) {
    const uint64_t **lists[5] = {&b.prompt_offsets, &b.output_offsets, &b.allowed_offsets, &b.banned_offsets,
                                 &b.bias_offsets};
    const char *names[5] = {"batch.prompt_offsets[2]: ", "batch.output_offsets[2]: ", "batch.allowed_offsets[2]: ",
                            "batch.banned_offsets[2]: ", "batch.bias_offsets[2]: "};
    for (int l = 0; l < 5; l++) {
      tokenrace_batch bad = b;
      const uint64_t **field = (const uint64_t **)((char *)&bad + ((char *)lists[l] - (char *)&b));
      *field = huge[h];
      if (l == 2) bad.allowed_ids = prompt_ids;
      if (l == 3) bad.banned_ids = prompt_ids;
      CHECK(tokenrace_draw(s, &bad, &o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
      CHECK(strstr(tokenrace_last_error(), names[l]) != NULL);
      CHECK(strstr(tokenrace_last_error(), "overflow the address space") != NULL);
      CHECK(untouched[0] == -7 && untouched[1] == -7);
    }
  }
  /* Entries without their offsets: refused naming the missing array (ignoring them would draw a
   * banned token or lift an allowed list). */
  {
    tokenrace_batch bad = b;
    bad.banned_ids = prompt_ids;
    CHECK(tokenrace_draw(s, &bad, &o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(tokenrace_last_error(), "batch.banned_offsets: is NULL while banned_ids is given") != NULL);
    bad = b;
    bad.allowed_ids = prompt_ids;
    CHECK(tokenrace_draw(s, &bad, &o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(tokenrace_last_error(), "batch.allowed_offsets: is NULL while allowed_ids is given") != NULL);
    bad = b;
    bad.prompt_offsets = NULL;
    CHECK(tokenrace_draw(s, &bad, &o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(tokenrace_last_error(), "batch.prompt_offsets: is NULL while prompt_ids is given") != NULL);
    bad = b;
    bad.output_offsets = NULL;
    CHECK(tokenrace_draw(s, &bad, &o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(tokenrace_last_error(), "batch.output_offsets: is NULL while output_ids is given") != NULL);
    bad = b;
    bad.bias_offsets = NULL;
    CHECK(tokenrace_draw(s, &bad, &o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(tokenrace_last_error(), "batch.bias_offsets: is NULL while bias_ids is given") != NULL);
    bad.bias_ids = NULL;
    CHECK(tokenrace_draw(s, &bad, &o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(tokenrace_last_error(), "batch.bias_offsets: is NULL while bias_values is given") != NULL);
    CHECK(untouched[0] == -7 && untouched[1] == -7);
  }
  /* Outputs that share memory with an input or with each other: refused naming both, nothing
   * written (an `out` one row ahead of the logits used to give wrong processed values). */
  {
    tokenrace_output bad = o;
    bad.full_logprobs = x + V; /* the logits, from row 1 on */
    bad.full_row_stride = V;
    CHECK(tokenrace_draw(s, &b, &bad) == TOKENRACE_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(tokenrace_last_error(), "out.full_logprobs: overlaps batch.logits") != NULL);
    bad = o;
    bad.flags = (uint32_t *)untouched; /* the tokens' array */
    CHECK(tokenrace_draw(s, &b, &bad) == TOKENRACE_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(tokenrace_last_error(), "out.flags: overlaps out.tokens") != NULL);
    bad = o;
    bad.logprobs = (float *)&b.temperature[1];
    CHECK(tokenrace_draw(s, &b, &bad) == TOKENRACE_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(tokenrace_last_error(), "out.logprobs: overlaps batch.temperature") != NULL);
    CHECK(untouched[0] == -7 && untouched[1] == -7);
  }
  /* An output stride whose span overflows is the output's field, not the batch's. */
  {
    tokenrace_output bad = o;
    bad.full_row_stride = UINT64_MAX / 2;
    CHECK(tokenrace_draw(s, &b, &bad) == TOKENRACE_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(tokenrace_last_error(), "out.full_row_stride: ") != NULL);
  }
  o.tokens = tokens;
  o.flags = flags;

  /* Structs of the older sizes: the batch of 0.1 (112 bytes, through min_p) and the first one
   * (88 bytes, through noise_row_stride), the output of 0.1 (64 bytes). The fields past the size
   * are never read: set them to things that would change the draw (a bitmask allowing nothing, a
   * full buffer that must stay untouched). */
  CHECK(offsetof(tokenrace_batch, prompt_ids) == 112 && offsetof(tokenrace_batch, top_k) == 88);
  CHECK(offsetof(tokenrace_batch, penalty_last_n) == 248); /* the batch of 0.2 ends before it */
  CHECK(offsetof(tokenrace_output, full_logprobs) == 64);
  static int32_t nothing[ROWS * MASK_STRIDE];
  memset(nothing, 0, sizeof nothing);
  b.token_bitmask = nothing;
  seeds[1] = 100;
  const uint32_t sizes[3][2] = {{112, sizeof(tokenrace_output)}, {88, sizeof(tokenrace_output)}, {112, 64}};
  for (int k = 0; k < 3; k++) {
    uint32_t batch_size = sizes[k][0];
    tokenrace_batch old = b;
    old.struct_size = batch_size;
    tokenrace_output oo = o;
    oo.struct_size = sizes[k][1];
    oo.logprob_mode = TOKENRACE_LOGPROB_MODE_RAW;
    if (oo.struct_size != 64) oo.full_logprobs = NULL; /* (else it would be written) */
    fill(full, ROWS * FULL_STRIDE);
    CHECK(tokenrace_draw(s, &old, &oo) == TOKENRACE_STATUS_OK);
    /* What the same call draws without the newer fields. */
    tokenrace_batch bare = batch_of(x, temps, seeds, offs, batch_size == 112 ? top_p : NULL);
    int32_t btokens[ROWS] = {-1, -1};
    uint32_t bflags[ROWS] = {0, 0};
    tokenrace_output bo;
    memset(&bo, 0, sizeof bo);
    bo.struct_size = sizeof bo;
    bo.tokens = btokens;
    bo.flags = bflags;
    CHECK(tokenrace_draw(s, &bare, &bo) == TOKENRACE_STATUS_OK);
    CHECK(tokens[0] == btokens[0] && tokens[1] == btokens[1]);
    CHECK(flags[0] == bflags[0] && flags[1] == bflags[1]);
    CHECK(tokens[0] == 30); /* the raw greedy token: no bitmask, no bias */
    clean = 1;
    for (int k = 0; k < ROWS * FULL_STRIDE; k++) clean &= full[k] == SENTINEL;
    CHECK(clean);
  }

  /* A config of 0.1's size (48 bytes, through pool_rows) makes a sampler too. */
  CHECK(offsetof(tokenrace_config, filter_order) == 48);
  tokenrace_config old_cfg = tokenrace_config_default();
  old_cfg.struct_size = 48;
  old_cfg.filter_order = 77; /* past the size: never read */
  tokenrace_sampler *s_old = NULL;
  CHECK(tokenrace_sampler_new(&old_cfg, &s_old) == TOKENRACE_STATUS_OK);
  tokenrace_sampler_free(s_old);

  tokenrace_sampler_free(s);
  if (failures == 0) printf("test_step: ok\n");
  return failures != 0;
}
