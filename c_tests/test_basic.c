/* The C ABI as a C caller sees it: statuses, messages, nothing written on failure, dtypes. */
#include "tokenrace.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static tokenrace_output output(int32_t *tokens, uint32_t *flags) {
  tokenrace_output o = tokens_output(tokens);
  o.flags = flags;
  return o;
}

static uint16_t to_bf16(float x) {
  uint32_t b;
  memcpy(&b, &x, 4);
  return (uint16_t)((b + 0x7fff + ((b >> 16) & 1)) >> 16);
}

int main(void) {
  CHECK(tokenrace_abi_version() == TOKENRACE_ABI_VERSION);
  CHECK(strlen(tokenrace_version()) > 0);
  const char *level = tokenrace_simd_level();
  CHECK(!strcmp(level, "avx512") || !strcmp(level, "avx2") || !strcmp(level, "portable") ||
        !strcmp(level, "scalar"));

  tokenrace_config cfg = tokenrace_config_default();
  CHECK(cfg.struct_size == sizeof cfg);
  CHECK(cfg.max_rows == 256);
  cfg.seed = 7;
  cfg.has_seed = 1;
  cfg.max_rows = 8;
  tokenrace_sampler *s = NULL;
  CHECK(tokenrace_sampler_new(&cfg, &s) == TOKENRACE_STATUS_OK);
  CHECK(s != NULL);

  /* Greedy rows: exact argmax, lowest index on ties. */
  enum { V = 1000 };
  static float logits[4 * V];
  for (int r = 0; r < 4; r++)
    for (int i = 0; i < V; i++) logits[r * V + i] = (float)((i * 7919 + r * 31) % 1000) / 100.0f;
  logits[0 * V + 500] = 50.0f;
  logits[1 * V + 10] = 50.0f;
  logits[1 * V + 900] = 50.0f;
  logits[2 * V + 3] = NAN;
  logits[2 * V + 999] = 60.0f;
  for (int i = 0; i < V; i++) logits[3 * V + i] = -INFINITY;
  float temps[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int32_t tokens[4] = {-1, -1, -1, -1};
  uint32_t flags[4] = {0};
  tokenrace_batch b = f32_batch(logits, 4, V);
  b.temperature = temps;
  tokenrace_output o = output(tokens, flags);
  CHECK(tokenrace_draw(s, &b, &o) == TOKENRACE_STATUS_OK);
  CHECK(tokens[0] == 500 && tokens[1] == 10 && tokens[2] == 999 && tokens[3] == 0);
  CHECK(flags[2] & TOKENRACE_FLAG_HAS_NAN);
  CHECK(flags[3] & TOKENRACE_FLAG_EMPTY);
  CHECK(flags[0] & TOKENRACE_FLAG_GREEDY);

  /* Sampling rows: every id in range; a dominant token wins. */
  float t1[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  b.temperature = t1;
  CHECK(tokenrace_draw(s, &b, &o) == TOKENRACE_STATUS_OK);
  CHECK(tokens[0] == 500 && tokens[2] == 999);
  CHECK(tokens[1] == 10 || tokens[1] == 900);

  /* Bad input: a clear status, a message that names the culprit, nothing written. */
  float bad[4] = {1.0f, 1.0f, -0.5f, 1.0f};
  b.temperature = bad;
  int32_t untouched[4] = {-7, -7, -7, -7};
  o.tokens = untouched;
  CHECK(tokenrace_draw(s, &b, &o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(tokenrace_last_error(), "temperature[2]") != NULL);
  CHECK(untouched[0] == -7 && untouched[3] == -7);

  b.temperature = t1;
  b.rows = 9;
  CHECK(tokenrace_draw(s, &b, &o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(tokenrace_last_error(), "max_rows") != NULL);
  b.rows = 4;
  b.dtype = 9;
  CHECK(tokenrace_draw(s, &b, &o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(tokenrace_last_error(), "dtype") != NULL);
  b.dtype = TOKENRACE_DTYPE_F32;
  b.struct_size = 4;
  CHECK(tokenrace_draw(s, &b, &o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(tokenrace_last_error(), "struct_size") != NULL);
  b.struct_size = sizeof b;
  o.tokens = NULL;
  CHECK(tokenrace_draw(s, &b, &o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(tokenrace_last_error(), "tokens") != NULL);
  CHECK(tokenrace_draw(NULL, &b, &o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(tokenrace_draw(s, NULL, &o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  o.tokens = untouched;
  CHECK(untouched[1] == -7);

  /* A good call clears the message. */
  CHECK(tokenrace_draw(s, &b, &o) == TOKENRACE_STATUS_OK);
  CHECK(strcmp(tokenrace_last_error(), "") == 0);

  /* bf16 logits, strided rows. */
  static uint16_t half[2 * 1024];
  for (int i = 0; i < 2 * 1024; i++) half[i] = to_bf16(INFINITY); /* padding that must not be read */
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < V; i++) half[r * 1024 + i] = to_bf16((float)(i % 100) / 10.0f);
  half[0 * 1024 + 123] = to_bf16(40.0f);
  half[1 * 1024 + 456] = to_bf16(40.0f);
  tokenrace_batch hb = f32_batch(NULL, 2, V);
  hb.dtype = TOKENRACE_DTYPE_BF16;
  hb.logits = half;
  hb.row_stride = 1024;
  hb.temperature = temps;
  o.tokens = tokens;
  CHECK(tokenrace_draw(s, &hb, &o) == TOKENRACE_STATUS_OK);
  CHECK(tokens[0] == 123 && tokens[1] == 456);

  /* Seeded rows are reproducible. */
  uint64_t seeds[4] = {1, 2, 3, 4};
  int32_t first[4], second[4];
  b.seeds = seeds;
  o.tokens = first;
  CHECK(tokenrace_draw(s, &b, &o) == TOKENRACE_STATUS_OK);
  o.tokens = second;
  CHECK(tokenrace_draw(s, &b, &o) == TOKENRACE_STATUS_OK);
  CHECK(memcmp(first, second, sizeof first) == 0);

  tokenrace_sampler_stats st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  CHECK(tokenrace_sampler_get_stats(s, &st) == TOKENRACE_STATUS_OK);
  CHECK(st.calls >= 5 && st.rejected_calls >= 1);

  /* A config field out of range is INVALID_CONFIG naming it. */
  tokenrace_config bad_cfg = tokenrace_config_default();
  bad_cfg.simd = 42;
  tokenrace_sampler *s2 = NULL;
  CHECK(tokenrace_sampler_new(&bad_cfg, &s2) == TOKENRACE_STATUS_INVALID_CONFIG);
  CHECK(strstr(tokenrace_last_error(), "simd") != NULL && s2 == NULL);

  /* from_env writes no more than the caller's struct_size, and refuses a missing one. */
  tokenrace_config env_cfg;
  memset(&env_cfg, 0xab, sizeof env_cfg);
  env_cfg.struct_size = 0;
  CHECK(tokenrace_config_from_env(&env_cfg) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(tokenrace_last_error(), "struct_size") != NULL);
  env_cfg.struct_size = sizeof env_cfg;
  CHECK(tokenrace_config_from_env(&env_cfg) == TOKENRACE_STATUS_OK);
  CHECK(env_cfg.struct_size == sizeof env_cfg && env_cfg.max_rows == 256);

  /* An output error names the output. */
  o.tokens = NULL;
  b.temperature = t1;
  b.seeds = NULL;
  CHECK(tokenrace_draw(s, &b, &o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(tokenrace_last_error(), "out.tokens") != NULL);

  tokenrace_sampler_free(s);
  tokenrace_sampler_free(NULL);
  if (failures == 0) printf("test_basic: ok\n");
  return failures != 0;
}
