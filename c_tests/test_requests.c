/* The request state through the C ABI: requests added once and appended to after each draw,
 * drawn by request id, give exactly the tokens and logprobs of the same draws with the
 * histories passed as CSR lists (seeded rows, every penalty, a penalty window); so do requests
 * that hold their sampling parameters (tokenrace_requests_set_params) and take each drawn token
 * themselves (batch.append_to_requests); an unknown id is refused naming the row, nothing
 * written; a refused append changes nothing. */
#include "tokenrace.h"
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

enum { ROWS = 3, V = 257, STEPS = 30, MAXH = 200 };

static uint64_t rng_state = 12345;
static uint32_t next_u32(void) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng_state >> 33);
}

int main(void) {
  tokenrace_config cfg = tokenrace_config_default();
  cfg.seed = 9;
  cfg.has_seed = 1;
  tokenrace_sampler *with_lists = NULL, *with_state = NULL, *with_params = NULL;
  CHECK(tokenrace_sampler_new(&cfg, &with_lists) == TOKENRACE_STATUS_OK);
  CHECK(tokenrace_sampler_new(&cfg, &with_state) == TOKENRACE_STATUS_OK);
  CHECK(tokenrace_sampler_new(&cfg, &with_params) == TOKENRACE_STATUS_OK);
  tokenrace_requests *state = NULL, *holding = NULL;
  CHECK(tokenrace_requests_new(&state) == TOKENRACE_STATUS_OK);
  CHECK(tokenrace_requests_new(&holding) == TOKENRACE_STATUS_OK);

  static float logits[ROWS * V];
  for (int i = 0; i < ROWS * V; i++) logits[i] = (float)(next_u32() % 1000) / 250.0f;
  /* The histories as lists: row r's prompt then its output, which grows each step. */
  static int32_t prompts[ROWS][MAXH], outputs[ROWS][MAXH];
  int prompt_len[ROWS], output_len[ROWS] = {0, 0, 0};
  const uint64_t ids[ROWS] = {1000, 77, 5};
  for (int r = 0; r < ROWS; r++) {
    prompt_len[r] = 20 + 30 * r;
    for (int j = 0; j < prompt_len[r]; j++) prompts[r][j] = (int32_t)(next_u32() % 40);
    CHECK(tokenrace_requests_add(state, ids[r], prompts[r], (uint64_t)prompt_len[r], NULL, 0) ==
          TOKENRACE_STATUS_OK);
  }
  const float temps[ROWS] = {0.8f, 1.0f, 0.0f};
  const uint64_t seeds[ROWS] = {3, 4, 5};
  const float repetition[ROWS] = {1.3f, 0.9f, 1.5f};
  const float frequency[ROWS] = {0.2f, -0.1f, 0.0f};
  const float presence[ROWS] = {0.1f, 0.3f, 0.0f};
  const int32_t last_n[ROWS] = {0, 25, 7};
  /* The same requests again, each holding its parameters: its draws pass none. */
  for (int r = 0; r < ROWS; r++) {
    CHECK(tokenrace_requests_add(holding, ids[r], prompts[r], (uint64_t)prompt_len[r], NULL, 0) ==
          TOKENRACE_STATUS_OK);
    tokenrace_request_params p = tokenrace_request_params_default();
    p.temperature = temps[r];
    p.seed = seeds[r];
    p.has_seed = 1;
    p.repetition_penalty = repetition[r];
    p.frequency_penalty = frequency[r];
    p.presence_penalty = presence[r];
    p.penalty_last_n = last_n[r];
    CHECK(tokenrace_requests_set_params(holding, ids[r], &p) == TOKENRACE_STATUS_OK);
  }
  for (int step = 0; step < STEPS; step++) {
    static int32_t prompt_ids[ROWS * MAXH], output_ids[ROWS * MAXH];
    uint64_t prompt_offsets[ROWS + 1] = {0}, output_offsets[ROWS + 1] = {0}, offsets[ROWS];
    for (int r = 0; r < ROWS; r++) {
      memcpy(prompt_ids + prompt_offsets[r], prompts[r], (size_t)prompt_len[r] * sizeof(int32_t));
      prompt_offsets[r + 1] = prompt_offsets[r] + (uint64_t)prompt_len[r];
      memcpy(output_ids + output_offsets[r], outputs[r], (size_t)output_len[r] * sizeof(int32_t));
      output_offsets[r + 1] = output_offsets[r] + (uint64_t)output_len[r];
      offsets[r] = (uint64_t)(prompt_len[r] + output_len[r]);
    }
    tokenrace_batch b = f32_batch(logits, ROWS, V);
    b.temperature = temps;
    b.seeds = seeds;
    b.offsets = offsets;
    b.repetition_penalty = repetition;
    b.frequency_penalty = frequency;
    b.presence_penalty = presence;
    b.penalty_last_n = last_n;
    tokenrace_batch listed = b, named = b;
    listed.prompt_ids = prompt_ids;
    listed.prompt_offsets = prompt_offsets;
    listed.output_ids = output_ids;
    listed.output_offsets = output_offsets;
    named.requests = state;
    named.request_ids = ids;
    int32_t tokens_a[ROWS], tokens_b[ROWS];
    float lps_a[ROWS], lps_b[ROWS];
    tokenrace_output oa, ob;
    memset(&oa, 0, sizeof oa);
    oa.struct_size = sizeof oa;
    oa.logprob_mode = TOKENRACE_LOGPROB_MODE_PROCESSED;
    ob = oa;
    oa.tokens = tokens_a;
    oa.logprobs = lps_a;
    ob.tokens = tokens_b;
    ob.logprobs = lps_b;
    CHECK(tokenrace_draw(with_lists, &listed, &oa) == TOKENRACE_STATUS_OK);
    CHECK(tokenrace_draw(with_state, &named, &ob) == TOKENRACE_STATUS_OK);
    CHECK(memcmp(tokens_a, tokens_b, sizeof tokens_a) == 0);
    CHECK(memcmp(lps_a, lps_b, sizeof lps_a) == 0);
    /* Its parameters from the state, its token appended by the draw itself. */
    tokenrace_batch held = f32_batch(logits, ROWS, V);
    held.offsets = offsets;
    held.requests = holding;
    held.request_ids = ids;
    held.append_to_requests = 1;
    int32_t tokens_c[ROWS];
    float lps_c[ROWS];
    tokenrace_output oc = ob;
    oc.tokens = tokens_c;
    oc.logprobs = lps_c;
    CHECK(tokenrace_draw(with_params, &held, &oc) == TOKENRACE_STATUS_OK);
    CHECK(memcmp(tokens_a, tokens_c, sizeof tokens_a) == 0);
    CHECK(memcmp(lps_a, lps_c, sizeof lps_a) == 0);
    /* The host keeps the drawn tokens: one each, appended to the state and the lists. */
    CHECK(tokenrace_requests_append(state, ROWS, ids, tokens_b, NULL) == TOKENRACE_STATUS_OK);
    for (int r = 0; r < ROWS; r++) outputs[r][output_len[r]++] = tokens_a[r];
  }
  uint64_t len = 0;
  CHECK(tokenrace_requests_output_len(state, 77, &len) == TOKENRACE_STATUS_OK && len == STEPS);
  CHECK(tokenrace_requests_output_len(holding, 77, &len) == TOKENRACE_STATUS_OK && len == STEPS);

  /* A refused append (an unknown id after a known one) appends nothing. */
  const uint64_t bad_ids[2] = {77, 78};
  const int32_t two[2] = {1, 2};
  CHECK(tokenrace_requests_append(state, 2, bad_ids, two, NULL) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(tokenrace_last_error(), "ids[1]: request 78 is not in the state") != NULL);
  CHECK(tokenrace_requests_output_len(state, 77, &len) == TOKENRACE_STATUS_OK && len == STEPS);

  /* An unknown id in a draw: refused naming its row, nothing written. */
  const uint64_t unknown[ROWS] = {1000, 77, 6};
  tokenrace_batch b = f32_batch(logits, ROWS, V);
  b.requests = state;
  b.request_ids = unknown;
  int32_t tokens[ROWS] = {-7, -7, -7};
  tokenrace_output o = tokens_output(tokens);
  CHECK(tokenrace_draw(with_state, &b, &o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(tokenrace_last_error(), "batch.request_ids[2]: request 6 is not in the requests state") != NULL);
  CHECK(tokens[0] == -7 && tokens[1] == -7 && tokens[2] == -7);

  CHECK(tokenrace_requests_remove(state, 77) == TOKENRACE_STATUS_OK);
  CHECK(tokenrace_requests_len(state, &len) == TOKENRACE_STATUS_OK && len == 2);
  tokenrace_requests_free(state);
  tokenrace_requests_free(holding);
  tokenrace_sampler_free(with_params);
  tokenrace_sampler_free(with_lists);
  tokenrace_sampler_free(with_state);
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("test_requests: ok\n");
  return 0;
}
