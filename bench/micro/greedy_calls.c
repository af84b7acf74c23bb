/* Greedy draws through the C ABI: R rows x V f32 logits (uniform in [-3, 3), one 20 a row), all
 * at temperature 0, one thread; the median wall time per call over N calls, and per row. Small
 * vocabularies show the per-call and per-row cost around the kernel, large ones the kernel's
 * pass (docs/performance.md, "Greedy: against np.argmax and the read floor").
 *   cc -O2 -Iinclude bench/micro/greedy_calls.c -Ltarget/release -ltokenrace -Wl,-rpath,$PWD/target/release \
 *      -o /tmp/greedy_calls && taskset -c 1 /tmp/greedy_calls 64 163840 40      # R V N [threads [entry]]
 * entry: "draw" (tokenrace_draw with a temperature of 0 a row, the default) or "greedy"
 * (tokenrace_draw_greedy, the call without the general batch). */
#include "tokenrace.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s ROWS VOCAB CALLS [THREADS [draw|greedy]]\n", argv[0]);
    return 2;
  }
  int rows = atoi(argv[1]), vocab = atoi(argv[2]), calls = atoi(argv[3]);
  int threads = argc > 4 ? atoi(argv[4]) : 1;
  int greedy_entry = argc > 5 && strcmp(argv[5], "greedy") == 0;
  size_t n = (size_t)rows * vocab;
  float *x = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
  unsigned s = 1;
  for (size_t i = 0; i < n; i++) {
    s = s * 1103515245u + 12345u;
    x[i] = (float)(s >> 8) / 16777216.0f * 6 - 3;
  }
  for (int r = 0; r < rows; r++) x[(size_t)r * vocab + (size_t)r * 7919 % vocab] = 20;
  tokenrace_config cfg = tokenrace_config_default();
  cfg.threads = threads;
  tokenrace_sampler *sampler;
  if (tokenrace_sampler_new(&cfg, &sampler) != TOKENRACE_STATUS_OK) return 1;
  float *temps = calloc(rows, sizeof(float));
  int32_t *tokens = malloc(rows * sizeof(int32_t));
  tokenrace_batch b;
  memset(&b, 0, sizeof b);
  b.struct_size = sizeof b;
  b.logits = x;
  b.rows = rows;
  b.vocab = vocab;
  b.temperature = temps;
  tokenrace_output o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.tokens = tokens;
  tokenrace_greedy_batch g;
  memset(&g, 0, sizeof g);
  g.struct_size = sizeof g;
  g.dtype = TOKENRACE_DTYPE_F32;
  g.logits = x;
  g.rows = rows;
  g.vocab = vocab;
  double *t = malloc(calls * sizeof(double));
  for (int i = 0; i < calls; i++) {
    double a = now_us();
    tokenrace_status st = greedy_entry ? tokenrace_draw_greedy(sampler, &g, tokens, NULL) : tokenrace_draw(sampler, &b, &o);
    if (st != TOKENRACE_STATUS_OK) {
      fprintf(stderr, "%s\n", tokenrace_last_error());
      return 1;
    }
    t[i] = now_us() - a;
  }
  for (int r = 0; r < rows; r++) {
    if (tokens[r] != (int)((size_t)r * 7919 % vocab)) {
      fprintf(stderr, "row %d: token %d\n", r, tokens[r]);
      return 1;
    }
  }
  qsort(t, calls, sizeof(double), cmp);
  printf("%d x %d %s (%s): median %.3f us/call, %.4f us/row\n", rows, vocab, greedy_entry ? "tokenrace_draw_greedy" : "tokenrace_draw", tokenrace_sampler_simd_level(sampler),
         t[calls / 2], t[calls / 2] / rows);
  tokenrace_sampler_free(sampler);
  return 0;
}
