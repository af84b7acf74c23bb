/* The workloads that scripts/cross-count.sh counts instructions of, through the C API:
 *   count_driver LEVEL WORKLOAD ROWS VOCAB CALLS
 * LEVEL: auto, scalar, portable, avx2, avx512, neon or vxe2. WORKLOAD:
 *   greedy, race, topp (top-p 0.9), topk (top-k 50): peaked f32 rows (a bell of values with four peaks a row),
 *     seeded, inline noise, CALLS draws of ROWS x VOCAB;
 *   flat: the race on rows without peaks (the race then visits most blocks);
 *   kept: top-p 0.9 with the kept-set outputs (threshold, count, mass and bitmask: the
 *     kept_scan kernel), on the peaked rows;
 *   poolexp, poollog: a noise pool of ROWS x VOCAB values of E or ln E, one thread, at the best
 *     level (the pool always runs at the best level the CPU has).
 * Prints the library's load address ("base 0x..."), the level, and a hash of the tokens (or of
 * the noise) that must be the same on every machine and level. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenrace.h"

static uint64_t rng = 0x243f6a8885a308d3u;
static uint64_t next_u64(void) { /* splitmix64 */
  uint64_t z = (rng += 0x9e3779b97f4a7c15u);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}

static void print_base(void) {
  Dl_info info;
  if (dladdr((void *)tokenrace_draw, &info)) printf("base %p\n", info.dli_fbase);
}

static int level_of(const char *s) {
  static const struct { const char *name; int value; } levels[] = {
      {"auto", TOKENRACE_SIMD_AUTO}, {"scalar", TOKENRACE_SIMD_SCALAR}, {"portable", TOKENRACE_SIMD_PORTABLE},
      {"avx2", TOKENRACE_SIMD_AVX2}, {"avx512", TOKENRACE_SIMD_AVX512},   {"neon", TOKENRACE_SIMD_NEON},
      {"vxe2", TOKENRACE_SIMD_VXE2}};
  for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++)
    if (!strcmp(s, levels[i].name)) return levels[i].value;
  return -1;
}

static int pool(const char *workload, uint32_t rows, uint32_t vocab) {
  tokenrace_pool_config pc = tokenrace_pool_config_default();
  pc.rows = rows;
  pc.vocab = vocab;
  pc.kind = !strcmp(workload, "poollog") ? TOKENRACE_NOISE_KIND_LOG_EXP : TOKENRACE_NOISE_KIND_EXP;
  pc.threads = 1;
  pc.has_seed = 1;
  pc.seed = 99;
  pc.policy = TOKENRACE_POOL_POLICY_BLOCK;
  pc.timeout_ms = 3600 * 1000;
  tokenrace_pool *p = NULL;
  if (tokenrace_pool_new(&pc, &p) != TOKENRACE_STATUS_OK) {
    fprintf(stderr, "count_driver: %s\n", tokenrace_last_error());
    return 2;
  }
  print_base();
  printf("level %s\n", tokenrace_simd_level());
  tokenrace_pool_lease lease;
  memset(&lease, 0, sizeof lease);
  lease.struct_size = sizeof lease;
  if (tokenrace_pool_borrow(p, rows, &lease) != TOKENRACE_STATUS_OK) {
    fprintf(stderr, "count_driver: %s\n", tokenrace_last_error());
    return 1;
  }
  uint64_t h = 0;
  for (size_t i = 0; i < (size_t)rows * vocab; i += 997) {
    uint32_t b;
    memcpy(&b, &lease.values[i], sizeof b);
    h = (h ^ b) * 0x100000001b3u;
  }
  tokenrace_pool_release(p, &lease);
  tokenrace_pool_shutdown(p);
  tokenrace_pool_free(p);
  printf("values %zu\nhash %016" PRIx64 "\n", (size_t)rows * vocab, h);
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 6 || level_of(argv[1]) < 0) {
    fprintf(stderr, "usage: %s LEVEL greedy|race|topp|topk|flat|kept|poolexp|poollog ROWS VOCAB CALLS\n", argv[0]);
    return 1;
  }
  const char *workload = argv[2];
  uint32_t rows = (uint32_t)atoi(argv[3]), vocab = (uint32_t)atoi(argv[4]);
  int calls = atoi(argv[5]);
  if (!strncmp(workload, "pool", 4)) return pool(workload, rows, vocab);

  tokenrace_config cfg = tokenrace_config_default();
  cfg.simd = (uint32_t)level_of(argv[1]);
  cfg.threads = 1;
  cfg.max_rows = rows;
  cfg.seed = 5;
  cfg.has_seed = 1;
  cfg.noise = TOKENRACE_NOISE_SOURCE_INLINE;
  tokenrace_sampler *s = NULL;
  if (tokenrace_sampler_new(&cfg, &s) != TOKENRACE_STATUS_OK) {
    fprintf(stderr, "count_driver: %s\n", tokenrace_last_error());
    return 2;
  }
  print_base();
  printf("level %s\n", tokenrace_sampler_simd_level(s));

  size_t n = (size_t)rows * vocab;
  float *x = malloc(n * sizeof *x);
  float *temps = malloc(rows * sizeof *temps), *top_p = malloc(rows * sizeof *top_p);
  int32_t *top_k = malloc(rows * sizeof *top_k);
  uint64_t *seeds = malloc(rows * sizeof *seeds), *offsets = malloc(rows * sizeof *offsets);
  uint8_t *seeded = malloc(rows);
  int32_t *tokens = malloc(rows * sizeof *tokens);
  const int kept = !strcmp(workload, "kept");
  size_t words = ((size_t)vocab + 31) / 32;
  float *kept_threshold = malloc(rows * sizeof *kept_threshold);
  int32_t *kept_count = malloc(rows * sizeof *kept_count), *kept_bitmask = malloc(rows * words * sizeof *kept_bitmask);
  double *kept_mass = malloc(rows * sizeof *kept_mass);
  if (!x || !temps || !top_p || !top_k || !seeds || !offsets || !seeded || !tokens || !kept_threshold || !kept_count ||
      !kept_bitmask || !kept_mass)
    return 1;
  /* A bell of logits around 0 (the sum of four uniform draws, in steps of 1/1024)... */
  for (size_t i = 0; i < n; i++) {
    uint64_t r = next_u64();
    int32_t v = (int32_t)(r & 0xfff) + (int32_t)(r >> 16 & 0xfff) + (int32_t)(r >> 32 & 0xfff) + (int32_t)(r >> 48 & 0xfff);
    x[i] = (float)(v - 8190) / 1024.0f;
  }
  /* ...and, but for "flat", four peaks a row, as a trained model's rows have. */
  if (strcmp(workload, "flat"))
    for (uint32_t r = 0; r < rows; r++)
      for (int k = 0; k < 4; k++) x[(size_t)r * vocab + next_u64() % vocab] = 18.0f - 0.5f * (float)k;
  for (uint32_t r = 0; r < rows; r++) {
    temps[r] = !strcmp(workload, "greedy") ? 0.0f : 1.0f;
    top_p[r] = 0.9f;
    top_k[r] = 50;
    seeds[r] = 77 + r;
    seeded[r] = 1;
  }
  uint64_t hash = 0;
  for (int c = 0; c < calls; c++) {
    for (uint32_t r = 0; r < rows; r++) offsets[r] = (uint64_t)c * rows + r;
    tokenrace_batch b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.dtype = TOKENRACE_DTYPE_F32;
    b.logits = x;
    b.rows = rows;
    b.vocab = vocab;
    b.temperature = temps;
    b.seeds = seeds;
    b.offsets = offsets;
    b.seeded = seeded;
    if (!strcmp(workload, "topp") || kept) b.top_p = top_p;
    if (!strcmp(workload, "topk")) b.top_k = top_k;
    tokenrace_output o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.tokens = tokens;
    if (kept) {
      o.kept_threshold = kept_threshold;
      o.kept_count = kept_count;
      o.kept_mass = kept_mass;
      o.kept_bitmask = kept_bitmask;
    }
    if (tokenrace_draw(s, &b, &o) != TOKENRACE_STATUS_OK) {
      fprintf(stderr, "count_driver: %s\n", tokenrace_last_error());
      return 1;
    }
    for (uint32_t r = 0; r < rows; r++) hash = (hash ^ (uint32_t)tokens[r]) * 0x100000001b3u;
    for (uint32_t r = 0; kept && r < rows; r++) {
      hash = (hash ^ (uint32_t)kept_count[r]) * 0x100000001b3u;
      for (size_t w = 0; w < words; w++) hash = (hash ^ (uint32_t)kept_bitmask[r * words + w]) * 0x100000001b3u;
    }
  }
  printf("values %zu\nhash %016" PRIx64 "\n", n * (size_t)calls, hash);
  tokenrace_sampler_free(s);
  return 0;
}
