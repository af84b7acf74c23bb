/* Prints the tokens, flags, logprobs (with %a), ranks and top-n of a fixed set of draws, through
 * the C API, at one SIMD level and thread count: `seeded_dump LEVEL THREADS`, LEVEL one of
 * scalar, portable, avx2, avx512, neon, vxe2. The output names neither, so that every level, thread count
 * and machine (x86-64, s390x) can be compared byte for byte (scripts/cross-s390x.sh does).
 *
 * Rows are seeded (their tokens depend only on seed, offset and the logits) or unseeded (keys
 * from the sampler's seeded stream, the same on every machine given the same calls), over f32,
 * bf16 and f16, vocab 1000 to 151936, T 0 to 2, with and without top-k / top-p / min-p, RAW and
 * PROCESSED logprobs, and inline or external noise; every third call also with the sampling step
 * (prompt and output histories that name the peaks, the three penalties, a logit bias and a
 * grammar bitmask on odd rows), drawn once more for tokens and flags alone when on inline noise.
 * Every input is made with integer arithmetic (and exact
 * conversions), so it is the same on every machine.
 *
 * Exit status: 0 on success, 2 if the level is not supported here, 1 on any other failure. */
#include "tokenrace.h"
#include <math.h> /* INFINITY and NAN only: no libm function is called */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x5eedf00dULL;

static uint64_t next_u64(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/* An integer in [0, n). */
static uint32_t below(uint32_t n) { return (uint32_t)((next_u64() >> 32) % n); }

/* A logit shaped like a model's, exactly representable: an approximately normal integer (the sum
 * of four uniforms) over 1024 (sd about 3 before the scale). */
static float logit(void) {
  int32_t s = 0;
  for (int i = 0; i < 4; i++) s += (int32_t)below(4096);
  return (float)(s - 8190) / 1024.0f;
}

static uint32_t f32_bits(float x) {
  uint32_t b;
  memcpy(&b, &x, 4);
  return b;
}

/* Round-to-nearest-even conversions (NaN stays NaN). */
static uint16_t to_bf16(float x) {
  uint32_t b = f32_bits(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b >> 16) | 0x40);
  return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

static uint16_t to_f16(float x) {
  uint32_t b = f32_bits(x);
  uint16_t sign = (uint16_t)((b >> 16) & 0x8000u);
  uint32_t a = b & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;        /* NaN */
  if (a >= 0x477ff000u) return sign | 0x7c00u;       /* rounds to inf (>= 65520) */
  if (a < 0x38800000u) {                              /* below 2^-14: subnormal or zero */
    if (a < 0x33000000u) return sign;                 /* below 2^-25: rounds to 0 */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;                         /* m * 2^(e - 150) in units of 2^-24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return sign | (uint16_t)q;
  }
  uint32_t h = ((a >> 13) - (112u << 10));
  uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return sign | (uint16_t)h;
}

static int simd_of(const char *name) {
  if (!strcmp(name, "scalar")) return TOKENRACE_SIMD_SCALAR;
  if (!strcmp(name, "portable")) return TOKENRACE_SIMD_PORTABLE;
  if (!strcmp(name, "avx2")) return TOKENRACE_SIMD_AVX2;
  if (!strcmp(name, "avx512")) return TOKENRACE_SIMD_AVX512;
  if (!strcmp(name, "neon")) return TOKENRACE_SIMD_NEON;
  if (!strcmp(name, "vxe2")) return TOKENRACE_SIMD_VXE2;
  return -1;
}

enum { ROWS = 10, TOP_N = 4, PROMPT = 64, OUTPUT = 32, BIASED = 4 };

static const uint32_t VOCABS[] = {1000, 4099, 32000, 151936};
static const float TEMPS[] = {0.0f, 0.3f, 0.7f, 1.0f, 2.0f};

/* Filter settings per call: off, top-k, top-p, min-p, all three. */
static const int32_t KS[] = {0, 50, 0, 0, 40};
static const float PS[] = {1.0f, 1.0f, 0.9f, 1.0f, 0.8f};
static const float MPS[] = {0.0f, 0.0f, 0.0f, 0.05f, 0.02f};

int main(int argc, char **argv) {
  if (argc != 3 || simd_of(argv[1]) < 0) {
    fprintf(stderr, "usage: %s scalar|portable|avx2|avx512|neon|vxe2 THREADS\n", argv[0]);
    return 1;
  }
  tokenrace_config cfg = tokenrace_config_default();
  cfg.simd = (uint32_t)simd_of(argv[1]);
  cfg.threads = (uint32_t)atoi(argv[2]);
  cfg.seed = 20240601;
  cfg.has_seed = 1;
  cfg.max_rows = ROWS;
  tokenrace_sampler *s = NULL;
  tokenrace_status st = tokenrace_sampler_new(&cfg, &s);
  if (st == TOKENRACE_STATUS_UNSUPPORTED) {
    fprintf(stderr, "seeded_dump: %s: %s\n", argv[1], tokenrace_last_error());
    return 2;
  }
  if (st != TOKENRACE_STATUS_OK) {
    fprintf(stderr, "seeded_dump: sampler: %s\n", tokenrace_last_error());
    return 1;
  }
  if (strcmp(tokenrace_sampler_simd_level(s), argv[1])) {
    fprintf(stderr, "seeded_dump: asked for %s, got %s\n", argv[1], tokenrace_sampler_simd_level(s));
    return 1;
  }

  uint32_t max_v = VOCABS[sizeof VOCABS / sizeof VOCABS[0] - 1];
  float *x = malloc(sizeof(float) * ROWS * max_v);
  uint16_t *h = malloc(sizeof(uint16_t) * ROWS * max_v);
  float *noise = malloc(sizeof(float) * ROWS * max_v);
  int32_t *bitmask = malloc(sizeof(int32_t) * ROWS * ((max_v + 31) / 32));
  if (!x || !h || !noise || !bitmask) return 1;
  int call = 0;
  long seeded_rows = 0, unseeded_rows = 0;

  for (size_t vi = 0; vi < sizeof VOCABS / sizeof VOCABS[0]; vi++) {
    uint32_t v = VOCABS[vi];
    for (int dt = 0; dt < 3; dt++) {
      for (int fi = 0; fi < 5; fi++) {
        for (int variant = 0; variant < 2; variant++, call++) {
          /* Logits: each row its own, a few peaks, some -inf masks; one row with a NaN. */
          uint32_t peaks[ROWS][3];
          for (uint32_t i = 0; i < ROWS * v; i++) x[i] = logit();
          for (int r = 0; r < ROWS; r++) {
            for (int k = 0; k < 3; k++) {
              uint32_t at = below(v); /* one call per statement: C leaves the order of two open */
              x[r * v + at] = 12.0f + (float)below(64) / 16.0f;
              peaks[r][k] = at;
            }
            for (int k = 0; k < 20; k++) x[r * v + below(v)] = -INFINITY;
          }
          x[3 * v + below(v)] = NAN;
          const void *logits = x;
          if (dt == 1 || dt == 2) {
            for (uint32_t i = 0; i < ROWS * v; i++) h[i] = dt == 1 ? to_bf16(x[i]) : to_f16(x[i]);
            logits = h;
          }
          float temps[ROWS];
          uint64_t seeds[ROWS], offsets[ROWS];
          uint8_t seeded[ROWS];
          int32_t top_k[ROWS];
          float top_p[ROWS], min_p[ROWS];
          for (int r = 0; r < ROWS; r++) {
            temps[r] = TEMPS[r % 5];
            seeds[r] = next_u64();
            offsets[r] = (uint64_t)(call * ROWS + r);
            /* Variant 0: every row seeded. Variant 1: odd rows from the stream or, in every
             * other call, from external E noise. */
            seeded[r] = variant == 0 || r % 2 == 0;
            top_k[r] = KS[fi];
            top_p[r] = PS[fi];
            min_p[r] = MPS[fi];
          }
          int external = variant == 1 && (call / 2) % 2 == 1;
          if (external)
            for (uint32_t i = 0; i < ROWS * v; i++) noise[i] = (float)(1 + below(1 << 20)) / 262144.0f;

          tokenrace_batch b;
          memset(&b, 0, sizeof b);
          b.struct_size = sizeof b;
          b.dtype = dt == 0 ? TOKENRACE_DTYPE_F32 : dt == 1 ? TOKENRACE_DTYPE_BF16 : TOKENRACE_DTYPE_F16;
          b.logits = logits;
          b.rows = ROWS;
          b.vocab = v;
          b.temperature = temps;
          b.seeds = seeds;
          b.offsets = offsets;
          b.seeded = seeded;
          if (external) {
            b.noise = noise;
            b.noise_kind = TOKENRACE_NOISE_KIND_EXP;
            b.noise_row_stride = v;
          }
          if (fi > 0) {
            b.top_k = top_k;
            b.top_p = top_p;
            b.min_p = min_p;
          }
          /* The sampling step, every third call: histories that hold the first two peaks of each
           * row (so the penalties change who wins) and repeats, r = 1.25, f = 0.5, p = 0.25, four
           * biases (one -inf), and on odd rows a bitmask allowing about half the vocabulary and
           * the last peak. */
          int32_t prompt[ROWS * PROMPT], output[ROWS * OUTPUT], bias_ids[ROWS * BIASED];
          float bias_values[ROWS * BIASED];
          uint64_t prompt_off[ROWS + 1], output_off[ROWS + 1], bias_off[ROWS + 1];
          float rep[ROWS], freq[ROWS], pres[ROWS];
          static const float BIAS[BIASED] = {2.5f, -1.0f, -INFINITY, 0.75f};
          if (call % 3 == 2) {
            uint32_t words = (v + 31) / 32;
            for (int r = 0; r <= ROWS; r++) {
              prompt_off[r] = (uint64_t)r * PROMPT;
              output_off[r] = (uint64_t)r * OUTPUT;
              bias_off[r] = (uint64_t)r * BIASED;
            }
            for (int r = 0; r < ROWS; r++) {
              for (int j = 0; j < PROMPT; j++) prompt[r * PROMPT + j] = (int32_t)(j == 0 ? peaks[r][0] : below(v));
              uint32_t repeated = below(v);
              for (int j = 0; j < OUTPUT; j++)
                output[r * OUTPUT + j] = (int32_t)(j < 3 ? peaks[r][1] : j < 6 ? repeated : below(v));
              for (int j = 0; j < BIASED; j++) {
                bias_ids[r * BIASED + j] = (int32_t)(j == 3 ? peaks[r][2] : below(v));
                bias_values[r * BIASED + j] = BIAS[j];
              }
              rep[r] = 1.25f;
              freq[r] = 0.5f;
              pres[r] = 0.25f;
              for (uint32_t w = 0; w < words; w++)
                bitmask[r * words + w] = r % 2 ? (int32_t)(uint32_t)next_u64() : -1;
              uint32_t last = peaks[r][2];
              bitmask[r * words + last / 32] |= (int32_t)(1u << (last % 32));
            }
            b.prompt_ids = prompt;
            b.prompt_offsets = prompt_off;
            b.output_ids = output;
            b.output_offsets = output_off;
            b.repetition_penalty = rep;
            b.frequency_penalty = freq;
            b.presence_penalty = pres;
            b.bias_ids = bias_ids;
            b.bias_values = bias_values;
            b.bias_offsets = bias_off;
            b.token_bitmask = bitmask;
          }
          int32_t tokens[ROWS], ranks[ROWS], ids[ROWS * TOP_N];
          uint32_t flags[ROWS];
          float lps[ROWS], tlps[ROWS * TOP_N];
          tokenrace_output o;
          memset(&o, 0, sizeof o);
          o.struct_size = sizeof o;
          o.logprob_mode = (call % 2) ? TOKENRACE_LOGPROB_MODE_PROCESSED : TOKENRACE_LOGPROB_MODE_RAW;
          o.tokens = tokens;
          o.flags = flags;
          o.logprobs = lps;
          o.ranks = ranks;
          o.top_n = TOP_N;
          o.topn_ids = ids;
          o.topn_logprobs = tlps;
          if (tokenrace_draw(s, &b, &o) != TOKENRACE_STATUS_OK) {
            fprintf(stderr, "seeded_dump: call %d: %s\n", call, tokenrace_last_error());
            return 1;
          }
          for (int r = 0; r < ROWS; r++) {
            if (seeded[r])
              seeded_rows++;
            else
              unseeded_rows++;
            printf("call %d vocab %u dtype %d filters %d row %d T %a %s: token %d flags %u lp %a rank %d top", call,
                   v, dt, fi, r, (double)temps[r], seeded[r] ? "seeded" : external ? "external" : "stream",
                   tokens[r], flags[r], (double)lps[r], ranks[r]);
            for (int j = 0; j < TOP_N; j++) printf(" %d:%a", ids[r * TOP_N + j], (double)tlps[r * TOP_N + j]);
            printf("\n");
          }
          if (call % 3 == 2 && !external) {
            /* The sampling step once more, for tokens and flags alone: a row that asks for
             * nothing that reads its whole row may leave its histories to the blocks it visits
             * (src/edits/deferred.rs), which the call above, asking for logprobs, never does. */
            int32_t lean_tokens[ROWS];
            uint32_t lean_flags[ROWS];
            tokenrace_output lo;
            memset(&lo, 0, sizeof lo);
            lo.struct_size = sizeof lo;
            lo.tokens = lean_tokens;
            lo.flags = lean_flags;
            if (tokenrace_draw(s, &b, &lo) != TOKENRACE_STATUS_OK) {
              fprintf(stderr, "seeded_dump: call %d (tokens alone): %s\n", call, tokenrace_last_error());
              return 1;
            }
            for (int r = 0; r < ROWS; r++)
              printf("call %d row %d, tokens and flags alone: token %d flags %u\n", call, r, lean_tokens[r], lean_flags[r]);
          }
        }
      }
    }
  }
  printf("%d calls, %ld seeded rows, %ld unseeded rows\n", call, seeded_rows, unseeded_rows);
  free(x);
  free(h);
  free(noise);
  free(bitmask);
  tokenrace_sampler_free(s);
  return 0;
}
