/* tokenrace_score through the C ABI: a draw's tokens scored give back the draw's logprobs, ranks,
 * top-n and given-id logprobs bit for bit (raw and processed, greedy and filtered rows); the
 * sampler's stream does not move; refusals name target_ids' row and write nothing. */
#include "tokenrace.h"
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

enum { ROWS = 5, V = 300, TOP = 3, GIVEN = 4 };

typedef struct {
  int32_t tokens[ROWS];
  uint32_t flags[ROWS];
  float logprobs[ROWS];
  int32_t ranks[ROWS];
  int32_t topn_ids[ROWS * TOP];
  float topn_logprobs[ROWS * TOP];
  float token_logprobs[GIVEN];
  int32_t token_ranks[GIVEN];
} written;

static tokenrace_output output_of(written *w, uint32_t mode) {
  memset(w, 0x5a, sizeof *w);
  tokenrace_output o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.logprob_mode = mode;
  o.tokens = w->tokens;
  o.flags = w->flags;
  o.logprobs = w->logprobs;
  o.ranks = w->ranks;
  o.top_n = TOP;
  o.topn_ids = w->topn_ids;
  o.topn_logprobs = w->topn_logprobs;
  o.token_logprobs = w->token_logprobs;
  o.token_ranks = w->token_ranks;
  return o;
}

static tokenrace_sampler *new_sampler(void) {
  tokenrace_config cfg = tokenrace_config_default();
  cfg.seed = 5;
  cfg.has_seed = 1;
  tokenrace_sampler *s = NULL;
  CHECK(tokenrace_sampler_new(&cfg, &s) == TOKENRACE_STATUS_OK);
  return s;
}

int main(void) {
  static float x[ROWS * V];
  for (int r = 0; r < ROWS; r++)
    for (int i = 0; i < V; i++) x[r * V + i] = (float)((i * 53 + r * 17) % 97) / 15.0f - 3.0f;
  const float temps[ROWS] = {1.0f, 0.0f, 0.7f, 1.3f, 0.9f};
  const int32_t top_k[ROWS] = {0, 0, 20, 0, 4};
  const float top_p[ROWS] = {1.0f, 1.0f, 0.9f, 0.8f, 1.0f};
  const int32_t given_ids[GIVEN] = {0, 17, 299, 5};
  const uint64_t given_offsets[ROWS + 1] = {0, 2, 2, 3, 3, 4};

  tokenrace_batch b;
  memset(&b, 0, sizeof b);
  b.struct_size = sizeof b;
  b.dtype = TOKENRACE_DTYPE_F32;
  b.logits = x;
  b.rows = ROWS;
  b.vocab = V;
  b.temperature = temps;
  b.top_k = top_k;
  b.top_p = top_p;
  b.logprob_token_ids = given_ids;
  b.logprob_token_offsets = given_offsets;

  tokenrace_sampler *s = new_sampler();
  tokenrace_sampler *fresh = new_sampler();
  const uint32_t modes[2] = {TOKENRACE_LOGPROB_MODE_RAW, TOKENRACE_LOGPROB_MODE_PROCESSED};
  for (int m = 0; m < 2; m++) {
    written drawn, scored;
    tokenrace_output od = output_of(&drawn, modes[m]);
    CHECK(tokenrace_draw(s, &b, &od) == TOKENRACE_STATUS_OK);
    CHECK(tokenrace_draw(fresh, &b, &od) == TOKENRACE_STATUS_OK); /* keeps the two streams alike */
    tokenrace_output os = output_of(&scored, modes[m]);
    CHECK(tokenrace_score(s, &b, drawn.tokens, &os) == TOKENRACE_STATUS_OK);
    CHECK(memcmp(&drawn, &scored, sizeof drawn) == 0);
  }

  /* Refusals: a target out of range (row named), forced tokens given, no targets. */
  written w;
  tokenrace_output o = output_of(&w, TOKENRACE_LOGPROB_MODE_RAW);
  written untouched;
  memcpy(&untouched, &w, sizeof w);
  const int32_t bad[ROWS] = {0, 1, 300, 2, 3};
  CHECK(tokenrace_score(s, &b, bad, &o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(tokenrace_last_error(), "target_ids: row 2: 300 is not a token id in [0, 300)") != NULL);
  CHECK(tokenrace_score(s, &b, NULL, &o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(tokenrace_last_error(), "target_ids: is NULL") != NULL);
  const int32_t forced[ROWS] = {-1, -1, -1, -1, -1};
  tokenrace_batch with_forced = b;
  with_forced.forced_tokens = forced;
  CHECK(tokenrace_score(s, &with_forced, bad, &o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(tokenrace_last_error(), "batch.forced_tokens: must be absent") != NULL);
  CHECK(memcmp(&w, &untouched, sizeof w) == 0);

  /* Neither the scores nor the refusals moved the stream: the next unseeded draws are alike. */
  written a, c;
  tokenrace_output oa = output_of(&a, TOKENRACE_LOGPROB_MODE_RAW);
  tokenrace_output oc = output_of(&c, TOKENRACE_LOGPROB_MODE_RAW);
  CHECK(tokenrace_draw(s, &b, &oa) == TOKENRACE_STATUS_OK);
  CHECK(tokenrace_draw(fresh, &b, &oc) == TOKENRACE_STATUS_OK);
  CHECK(memcmp(a.tokens, c.tokens, sizeof a.tokens) == 0);

  tokenrace_sampler_free(s);
  tokenrace_sampler_free(fresh);
  if (failures) fprintf(stderr, "test_score: %d failures\n", failures);
  return failures ? 1 : 0;
}
