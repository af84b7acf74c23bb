/* End-to-end latency of one tokenrace_draw call through the C ABI: 1 row, vocab 32000, f32.
 *   cc -O2 -Iinclude bench/latency.c -Ltarget/release -ltokenrace -Wl,-rpath,$PWD/target/release -lm -o /tmp/latency
 *   /tmp/latency            # prints the median and 10th/90th percentiles over 20000 calls */
#include "tokenrace.h"
#include <math.h>
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

int main(void) {
  enum { V = 32000, N = 20000 };
  static float logits[V];
  unsigned s = 1;
  for (int i = 0; i < V; i++) {
    s = s * 1103515245u + 12345u;
    logits[i] = 3.0f * ((float)(s >> 8) / 16777216.0f - 0.5f) * 3.4f;
  }
  logits[123] = 20.0f;
  logits[4567] = 19.3f;
  tokenrace_config cfg = tokenrace_config_default();
  tokenrace_sampler *sampler;
  if (tokenrace_sampler_new(&cfg, &sampler) != TOKENRACE_STATUS_OK) return 1;
  float temps[2][1] = {{0.0f}, {1.0f}};
  const char *names[2] = {"greedy", "race"};
  static double t[N];
  for (int mode = 0; mode < 2; mode++) {
    tokenrace_batch b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.logits = logits;
    b.rows = 1;
    b.vocab = V;
    b.temperature = temps[mode];
    int32_t token;
    tokenrace_output o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.tokens = &token;
    for (int i = 0; i < N; i++) {
      double a = now_us();
      if (tokenrace_draw(sampler, &b, &o) != TOKENRACE_STATUS_OK) return 1;
      t[i] = now_us() - a;
    }
    qsort(t, N, sizeof t[0], cmp);
    printf("%-6s 1 x %d f32 through the C ABI (%s): median %.2f us, p10 %.2f, p90 %.2f\n", names[mode], V,
           tokenrace_sampler_simd_level(sampler), t[N / 2], t[N / 10], t[9 * N / 10]);
  }
  tokenrace_sampler_free(sampler);
  return 0;
}
