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
 * Then the newer outputs and inputs: the kept set (threshold, count, mass, a hash of the bitmask)
 * under the sampler's order and caller-composed `order`s, with penalties and DRY on some calls;
 * typical sampling, XTC and top-nσ with min_keep (llama.cpp's order and the sampler's); DRY with
 * breakers, windows and allowed lengths (and once more for tokens alone); mirostat v1 and v2 over
 * five draws, each row's mu passed back (tokens and mu out); and tokenrace_verify with the
 * sampling step (chains and a tree, with and without the draft model's probabilities).
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

/* FNV-1a over `n` bytes: a short print of a long output (a kept bitmask), the same on every
 * machine for the same words (hashed as values, not as bytes in memory order). */
static uint64_t hash_words(const int32_t *w, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; i++) {
    uint32_t u = (uint32_t)w[i];
    for (int b = 0; b < 4; b++) h = (h ^ ((u >> (8 * b)) & 0xffu)) * 0x100000001b3ULL;
  }
  return h;
}

/* Rows of `v` logits shaped as main's (each row its own, three peaks, some -inf masks, a NaN in
 * row 3), f32 in `x` and, for dt 1 or 2, bf16 or f16 in `h`; the logits to pass. */
static const void *fill_rows(float *x, uint16_t *h, uint32_t v, int dt, uint32_t peaks[ROWS][3]) {
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
  if (dt == 0) return x;
  for (uint32_t i = 0; i < ROWS * v; i++) h[i] = dt == 1 ? to_bf16(x[i]) : to_f16(x[i]);
  return h;
}

/* A batch of `rows` rows over `logits`: temperatures TEMPS, even rows seeded, odd rows from the
 * sampler's stream (offsets from the call number). */
struct common_rows {
  float temps[ROWS];
  uint64_t seeds[ROWS], offsets[ROWS];
  uint8_t seeded[ROWS];
};

static void start_batch(tokenrace_batch *b, struct common_rows *c, const void *logits, int dt, uint32_t v, int call) {
  memset(b, 0, sizeof *b);
  b->struct_size = sizeof *b;
  b->dtype = dt == 0 ? TOKENRACE_DTYPE_F32 : dt == 1 ? TOKENRACE_DTYPE_BF16 : TOKENRACE_DTYPE_F16;
  b->logits = logits;
  b->rows = ROWS;
  b->vocab = v;
  for (int r = 0; r < ROWS; r++) {
    c->temps[r] = TEMPS[r % 5];
    c->seeds[r] = next_u64();
    c->offsets[r] = (uint64_t)(call * ROWS + r);
    c->seeded[r] = r % 2 == 0;
  }
  b->temperature = c->temps;
  b->seeds = c->seeds;
  b->offsets = c->offsets;
  b->seeded = c->seeded;
}

static int draw_or_fail(tokenrace_sampler *s, const tokenrace_batch *b, tokenrace_output *o, const char *what,
                        int call) {
  if (tokenrace_draw(s, b, o) == TOKENRACE_STATUS_OK) return 0;
  fprintf(stderr, "seeded_dump: %s call %d: %s\n", what, call, tokenrace_last_error());
  return 1;
}

/* llama.cpp's chain as a caller's order, and two others (top-nσ first: the kept set is reported
 * only where top-nσ judges the whole row). */
static const uint32_t ORDER_LLAMA[] = {TOKENRACE_STAGE_TOP_N_SIGMA, TOKENRACE_STAGE_TOP_K, TOKENRACE_STAGE_TYPICAL,
                                       TOKENRACE_STAGE_TOP_P, TOKENRACE_STAGE_MIN_P, TOKENRACE_STAGE_XTC,
                                       TOKENRACE_STAGE_TEMPERATURE};
static const uint32_t ORDER_MIXED[] = {TOKENRACE_STAGE_TOP_N_SIGMA, TOKENRACE_STAGE_MIN_P,
                                       TOKENRACE_STAGE_TEMPERATURE, TOKENRACE_STAGE_TOP_P, TOKENRACE_STAGE_TOP_K};
static const uint32_t ORDER_KEPT[] = {TOKENRACE_STAGE_TOP_N_SIGMA, TOKENRACE_STAGE_TOP_K, TOKENRACE_STAGE_TOP_P,
                                      TOKENRACE_STAGE_MIN_P, TOKENRACE_STAGE_TEMPERATURE};

/* The kept set (threshold, count, mass, bitmask) of top-k / top-p / min-p / top-nσ rows, under
 * the sampler's order and two caller-composed orders, with the sampling step's penalties and
 * DRY on every third call. Returns 1 on failure. */
static int dump_kept(tokenrace_sampler *s, float *x, uint16_t *h, int32_t *bitmask, int *call) {
  static const int32_t K[] = {50, 0, 0, 0, 40};
  static const float P[] = {1.0f, 0.9f, 1.0f, 1.0f, 0.8f};
  static const float MP[] = {0.0f, 0.0f, 0.05f, 0.0f, 0.02f};
  static const float NS[] = {-1.0f, -1.0f, -1.0f, 1.5f, 2.5f};
  for (size_t vi = 0; vi < sizeof VOCABS / sizeof VOCABS[0]; vi++) {
    uint32_t v = VOCABS[vi], words = (v + 31) / 32;
    for (int fi = 0; fi < 5; fi++) {
      for (int om = 0; om < 3; om++, (*call)++) {
        int dt = (fi + om) % 2;
        uint32_t peaks[ROWS][3];
        const void *logits = fill_rows(x, h, v, dt, peaks);
        tokenrace_batch b;
        struct common_rows c;
        start_batch(&b, &c, logits, dt, v, *call);
        int32_t top_k[ROWS];
        float top_p[ROWS], min_p[ROWS], nsigma[ROWS];
        for (int r = 0; r < ROWS; r++) {
          top_k[r] = K[fi];
          top_p[r] = P[fi];
          min_p[r] = MP[fi];
          nsigma[r] = r % 3 == 2 ? -1.0f : NS[fi];
        }
        b.top_k = top_k;
        b.top_p = top_p;
        b.min_p = min_p;
        b.top_n_sigma = nsigma;
        if (om == 1) {
          b.order = ORDER_KEPT;
          b.order_len = sizeof ORDER_KEPT / sizeof ORDER_KEPT[0];
        } else if (om == 2) {
          b.order = ORDER_MIXED;
          b.order_len = sizeof ORDER_MIXED / sizeof ORDER_MIXED[0];
        }
        /* Every third call: an output history repeating the first peak after a pair, so that
         * the penalties and DRY move the kept values. */
        int32_t output[ROWS * OUTPUT];
        uint64_t output_off[ROWS + 1];
        float rep[ROWS], dry_mult[ROWS];
        if (*call % 3 == 0) {
          for (int r = 0; r <= ROWS; r++) output_off[r] = (uint64_t)r * OUTPUT;
          for (int r = 0; r < ROWS; r++) {
            uint32_t a = below(v);
            for (int j = 0; j < OUTPUT; j++)
              output[r * OUTPUT + j] = (int32_t)(j % 8 == 0 ? a : j % 8 == 1 ? peaks[r][0] : below(v));
            output[r * OUTPUT + OUTPUT - 1] = (int32_t)a;
            rep[r] = 1.25f;
            dry_mult[r] = r % 2 ? 0.8f : 0.0f;
          }
          b.output_ids = output;
          b.output_offsets = output_off;
          b.repetition_penalty = rep;
          b.dry_multiplier = dry_mult;
        }
        int32_t tokens[ROWS], counts[ROWS];
        uint32_t flags[ROWS];
        float thresholds[ROWS];
        double masses[ROWS];
        tokenrace_output o;
        memset(&o, 0, sizeof o);
        o.struct_size = sizeof o;
        o.tokens = tokens;
        o.flags = flags;
        o.kept_threshold = thresholds;
        o.kept_count = counts;
        o.kept_mass = masses;
        o.kept_bitmask = bitmask;
        if (draw_or_fail(s, &b, &o, "kept", *call)) return 1;
        for (int r = 0; r < ROWS; r++)
          printf("kept call %d vocab %u filters %d order %d row %d: token %d flags %u threshold %a count %d mass %a "
                 "bitmask %016llx\n",
                 *call, v, fi, om, r, tokens[r], flags[r], (double)thresholds[r], counts[r], masses[r],
                 (unsigned long long)hash_words(bitmask + (size_t)r * words, words));
      }
    }
  }
  return 0;
}

/* Typical sampling, XTC and top-nσ (llama.cpp's order, and the sampler's own), with min_keep:
 * tokens, flags, raw logprobs, ranks and the top-n. Returns 1 on failure. */
static int dump_llama_filters(tokenrace_sampler *s, float *x, uint16_t *h, int *call) {
  static const uint32_t V[] = {1000, 32000, 151936};
  for (size_t vi = 0; vi < 3; vi++) {
    uint32_t v = V[vi];
    for (int variant = 0; variant < 4; variant++, (*call)++) {
      int dt = variant % 2;
      uint32_t peaks[ROWS][3];
      const void *logits = fill_rows(x, h, v, dt, peaks);
      tokenrace_batch b;
      struct common_rows c;
      start_batch(&b, &c, logits, dt, v, *call);
      float typical[ROWS], xtc_p[ROWS], xtc_t[ROWS], nsigma[ROWS];
      int32_t min_keep[ROWS], top_k[ROWS];
      for (int r = 0; r < ROWS; r++) {
        typical[r] = r % 3 == 0 ? 1.0f : r % 3 == 1 ? 0.9f : 0.5f;
        xtc_p[r] = r % 4 == 0 ? 0.0f : r % 4 == 1 ? 0.5f : 1.0f;
        xtc_t[r] = r % 2 ? 0.1f : 0.05f;
        nsigma[r] = r % 5 == 0 ? -1.0f : r % 5 < 3 ? 1.0f : 2.5f;
        min_keep[r] = r % 4 == 3 ? 3 : 0;
        top_k[r] = variant >= 2 && r % 2 ? 40 : 0;
      }
      b.typical_p = typical;
      b.xtc_probability = xtc_p;
      b.xtc_threshold = xtc_t;
      b.top_n_sigma = nsigma;
      b.min_keep = min_keep;
      b.top_k = top_k;
      if (variant < 2) {
        b.order = ORDER_LLAMA;
        b.order_len = sizeof ORDER_LLAMA / sizeof ORDER_LLAMA[0];
      }
      int32_t tokens[ROWS], ranks[ROWS], ids[ROWS * TOP_N];
      uint32_t flags[ROWS];
      float lps[ROWS], tlps[ROWS * TOP_N];
      tokenrace_output o;
      memset(&o, 0, sizeof o);
      o.struct_size = sizeof o;
      o.tokens = tokens;
      o.flags = flags;
      o.logprobs = lps;
      o.ranks = ranks;
      o.top_n = TOP_N;
      o.topn_ids = ids;
      o.topn_logprobs = tlps;
      if (draw_or_fail(s, &b, &o, "typical/xtc/top-nsigma", *call)) return 1;
      for (int r = 0; r < ROWS; r++) {
        printf("llama filters call %d vocab %u variant %d row %d: token %d flags %u lp %a rank %d top", *call, v,
               variant, r, tokens[r], flags[r], (double)lps[r], ranks[r]);
        for (int j = 0; j < TOP_N; j++) printf(" %d:%a", ids[r * TOP_N + j], (double)tlps[r * TOP_N + j]);
        printf("\n");
      }
    }
  }
  return 0;
}

/* DRY over prompt ++ output histories that repeat, with breakers (one of one token, one of
 * two) on odd rows, windows -1 and 16, allowed lengths 1 and 2, with and without penalties:
 * tokens, flags and processed logprobs, then tokens and flags alone. Returns 1 on failure. */
static int dump_dry(tokenrace_sampler *s, float *x, uint16_t *h, int *call) {
  static const uint32_t V[] = {1000, 32000, 151936};
  for (size_t vi = 0; vi < 3; vi++) {
    uint32_t v = V[vi];
    for (int variant = 0; variant < 2; variant++, (*call)++) {
      int dt = variant;
      uint32_t peaks[ROWS][3];
      const void *logits = fill_rows(x, h, v, dt, peaks);
      tokenrace_batch b;
      struct common_rows c;
      start_batch(&b, &c, logits, dt, v, *call);
      /* The prompt ends with peaks 0, 1 followed by a; the output repeats peaks 0, 1 then a,
       * and ends with peaks 0, 1: DRY penalises a, and the longer repeat (peak 2 after a) too. */
      int32_t prompt[ROWS * PROMPT], output[ROWS * OUTPUT], breaker_ids[ROWS * 3];
      uint64_t prompt_off[ROWS + 1], output_off[ROWS + 1], breaker_off[ROWS * 2 + 1], breaker_rows[ROWS + 1];
      float mult[ROWS], base[ROWS], rep[ROWS];
      int32_t allowed[ROWS], last_n[ROWS];
      uint64_t breakers = 0, breaker_tokens = 0;
      breaker_off[0] = 0;
      for (int r = 0; r < ROWS; r++) {
        uint32_t a = below(v);
        for (int j = 0; j < PROMPT; j++) {
          int k = j % 4;
          prompt[r * PROMPT + j] = (int32_t)(k == 0 ? peaks[r][0] : k == 1 ? peaks[r][1] : k == 2 ? a : peaks[r][2]);
        }
        for (int j = 0; j < OUTPUT; j++) output[r * OUTPUT + j] = (int32_t)below(v);
        output[r * OUTPUT + OUTPUT - 2] = (int32_t)peaks[r][0];
        output[r * OUTPUT + OUTPUT - 1] = (int32_t)peaks[r][1];
        prompt_off[r] = (uint64_t)r * PROMPT;
        output_off[r] = (uint64_t)r * OUTPUT;
        mult[r] = r % 3 == 0 ? 0.8f : r % 3 == 1 ? 1.5f : 0.0f;
        base[r] = r % 2 ? 1.75f : 2.0f;
        allowed[r] = r % 4 == 1 ? 1 : 2;
        last_n[r] = r % 4 == 2 ? 16 : -1;
        rep[r] = variant ? 1.2f : 1.0f;
        breaker_rows[r] = breakers;
        if (r % 2) {
          breaker_ids[breaker_tokens++] = (int32_t)below(v);
          breaker_off[++breakers] = breaker_tokens;
          breaker_ids[breaker_tokens++] = (int32_t)a;
          breaker_ids[breaker_tokens++] = (int32_t)peaks[r][2];
          breaker_off[++breakers] = breaker_tokens;
        }
      }
      prompt_off[ROWS] = (uint64_t)ROWS * PROMPT;
      output_off[ROWS] = (uint64_t)ROWS * OUTPUT;
      breaker_rows[ROWS] = breakers;
      b.prompt_ids = prompt;
      b.prompt_offsets = prompt_off;
      b.output_ids = output;
      b.output_offsets = output_off;
      b.repetition_penalty = rep;
      b.dry_multiplier = mult;
      b.dry_base = base;
      b.dry_allowed_length = allowed;
      b.dry_penalty_last_n = last_n;
      b.dry_breaker_ids = breaker_ids;
      b.dry_breaker_offsets = breaker_off;
      b.dry_breakers_row_offsets = breaker_rows;
      int32_t tokens[ROWS], lean_tokens[ROWS];
      uint32_t flags[ROWS], lean_flags[ROWS];
      float lps[ROWS];
      tokenrace_output o;
      memset(&o, 0, sizeof o);
      o.struct_size = sizeof o;
      o.logprob_mode = TOKENRACE_LOGPROB_MODE_PROCESSED;
      o.tokens = tokens;
      o.flags = flags;
      o.logprobs = lps;
      if (draw_or_fail(s, &b, &o, "dry", *call)) return 1;
      tokenrace_output lo;
      memset(&lo, 0, sizeof lo);
      lo.struct_size = sizeof lo;
      lo.tokens = lean_tokens;
      lo.flags = lean_flags;
      if (draw_or_fail(s, &b, &lo, "dry (tokens alone)", *call)) return 1;
      for (int r = 0; r < ROWS; r++)
        printf("dry call %d vocab %u variant %d row %d: token %d flags %u lp %a; alone: token %d flags %u\n", *call, v,
               variant, r, tokens[r], flags[r], (double)lps[r], lean_tokens[r], lean_flags[r]);
    }
  }
  return 0;
}

/* Mirostat v1 and v2 over a sequence of draws, each row's mu passed back (tau 5 or 3, eta 0.1
 * or 0.5, m 100 or 20; after top-k / min-p on some rows; seeded and stream rows): tokens and
 * mu out. Returns 1 on failure. */
static int dump_mirostat(tokenrace_sampler *s, float *x, uint16_t *h, int *call) {
  static const uint32_t V[] = {1000, 32000, 151936};
  enum { STEPS = 5 };
  for (size_t vi = 0; vi < 3; vi++) {
    uint32_t v = V[vi];
    int32_t mode[ROWS], m[ROWS], top_k[ROWS];
    float tau[ROWS], eta[ROWS], mu[ROWS], mu_out[ROWS], min_p[ROWS];
    for (int r = 0; r < ROWS; r++) {
      mode[r] = r % 5 == 4 ? 0 : 1 + r % 2;
      tau[r] = r % 3 ? 5.0f : 3.0f;
      eta[r] = r % 4 < 2 ? 0.1f : 0.5f;
      m[r] = r % 3 == 1 ? 20 : 100;
      mu[r] = 2.0f * tau[r];
      top_k[r] = r % 4 == 3 ? 40 : 0;
      min_p[r] = r % 4 == 2 ? 0.01f : 0.0f;
    }
    for (int step = 0; step < STEPS; step++, (*call)++) {
      int dt = step % 2;
      uint32_t peaks[ROWS][3];
      const void *logits = fill_rows(x, h, v, dt, peaks);
      tokenrace_batch b;
      struct common_rows c;
      start_batch(&b, &c, logits, dt, v, *call);
      b.mirostat = mode;
      b.mirostat_tau = tau;
      b.mirostat_eta = eta;
      b.mirostat_m = m;
      b.mirostat_mu = mu;
      b.top_k = top_k;
      b.min_p = min_p;
      int32_t tokens[ROWS];
      uint32_t flags[ROWS];
      float lps[ROWS];
      tokenrace_output o;
      memset(&o, 0, sizeof o);
      o.struct_size = sizeof o;
      o.tokens = tokens;
      o.flags = flags;
      o.logprobs = lps;
      o.mirostat_mu = mu_out;
      if (draw_or_fail(s, &b, &o, "mirostat", *call)) return 1;
      for (int r = 0; r < ROWS; r++) {
        printf("mirostat call %d vocab %u step %d row %d v%d: token %d flags %u lp %a mu %a -> %a\n", *call, v, step,
               r, mode[r], tokens[r], flags[r], (double)lps[r], (double)mu[r], (double)mu_out[r]);
        if (mode[r]) mu[r] = mu_out[r];
      }
    }
  }
  return 0;
}

/* Verification with the sampling step: six requests of 0 to 4 drafts (chains, or a tree), with
 * and without the draft model's probabilities, greedy and sampling, and per request a prompt,
 * an output, the three penalties, a bias, a banned list, an allowed list on some, a bad word,
 * min_tokens with a stop id, and a grammar bitmask per target row. Returns 1 on failure. */
static int dump_verify(const tokenrace_config *base, float *x, uint16_t *h, int32_t *bitmask, float *q, int *call) {
  enum { REQ = 6, MAXD = 4 };
  /* A sampler of its own: 20 target rows. */
  tokenrace_config cfg = *base;
  cfg.max_rows = 2 * ROWS;
  tokenrace_sampler *s = NULL;
  if (tokenrace_sampler_new(&cfg, &s) != TOKENRACE_STATUS_OK) {
    fprintf(stderr, "seeded_dump: verify sampler: %s\n", tokenrace_last_error());
    return 1;
  }
  static const int32_t DRAFTS[REQ] = {0, 1, 2, 3, 4, 4};
  static const uint32_t V[] = {1000, 32000};
  for (size_t vi = 0; vi < 2; vi++) {
    uint32_t v = V[vi], words = (v + 31) / 32;
    for (int variant = 0; variant < 4; variant++, (*call)++) {
      int dt = variant % 2, with_q = variant == 2, tree = variant == 3;
      uint32_t peaks[ROWS][3];
      int total = 0;
      for (int i = 0; i < REQ; i++) total += DRAFTS[i];
      uint32_t rows = (uint32_t)(total + REQ);
      /* The 20 target rows: fill_rows makes ROWS (10) rows; two fills. */
      float *xs = x;
      const void *logits = fill_rows(xs, h, v, 0, peaks);
      uint32_t peaks2[ROWS][3];
      fill_rows(xs + (size_t)ROWS * v, h, v, 0, peaks2);
      if (dt) {
        for (uint32_t i = 0; i < rows * v; i++) h[i] = to_bf16(x[i]);
        logits = h;
      }
      int32_t draft_tokens[REQ * MAXD], parents[REQ * MAXD];
      int row = 0, d = 0;
      for (int i = 0; i < REQ; i++) {
        for (int j = 0; j < DRAFTS[i]; j++, d++) {
          int target = row + j; /* the row that judges draft j: the peak there, or another */
          uint32_t pk = target < ROWS ? peaks[target][j % 3] : peaks2[target - ROWS][j % 3];
          draft_tokens[d] = (int32_t)(j == 2 ? below(v) : pk);
          parents[d] = tree && j >= 2 ? j - 2 : j - 1; /* a tree: nodes 2, 3 are siblings' children */
        }
        row += DRAFTS[i] + 1;
      }
      if (with_q) {
        /* The draft model's rows: 1/2 on the draft, 1/4 on a peak, 1/8 on two others. */
        memset(q, 0, sizeof(float) * (size_t)total * v);
        for (int k = 0; k < total; k++) {
          float *qr = q + (size_t)k * v;
          uint32_t a = below(v), bb = below(v), cc = below(v);
          qr[a] += 0.25f;
          qr[bb] += 0.125f;
          qr[cc] += 0.125f;
          qr[draft_tokens[k]] += 0.5f;
        }
      }
      float temps[REQ], rep[REQ], freq[REQ], pres[REQ], bias_values[REQ * 2];
      int32_t top_k[REQ], prompt[REQ * 8], output[REQ * 8], bias_ids[REQ * 2], banned[REQ], allowed_ids[REQ * 64];
      int32_t bad_ids[REQ * 2], min_tokens[REQ], stop_ids[REQ];
      uint64_t seeds[REQ], offsets[REQ], prompt_off[REQ + 1], output_off[REQ + 1], bias_off[REQ + 1],
          banned_off[REQ + 1], allowed_off[REQ + 1], bad_off[REQ + 1], bad_rows[REQ + 1], stop_off[REQ + 1];
      uint8_t allowed_rows[REQ];
      uint64_t n_allowed = 0;
      row = 0;
      for (int i = 0; i <= REQ; i++) {
        prompt_off[i] = (uint64_t)i * 8;
        output_off[i] = (uint64_t)i * 8;
        bias_off[i] = (uint64_t)i * 2;
        banned_off[i] = (uint64_t)i;
        bad_off[i] = (uint64_t)i * 2;
        bad_rows[i] = (uint64_t)i;
        stop_off[i] = (uint64_t)i;
      }
      d = 0;
      for (int i = 0; i < REQ; i++) {
        temps[i] = i % 3 == 0 ? 0.0f : i % 3 == 1 ? 0.7f : 1.0f;
        top_k[i] = i % 2 ? 50 : 0;
        seeds[i] = next_u64();
        offsets[i] = (uint64_t)(*call * REQ + i);
        rep[i] = 1.2f;
        freq[i] = 0.25f;
        pres[i] = 0.5f;
        uint32_t pk = row < ROWS ? peaks[row][0] : peaks2[row - ROWS][0];
        for (int j = 0; j < 8; j++) {
          prompt[i * 8 + j] = (int32_t)(j == 0 ? pk : below(v));
          output[i * 8 + j] = (int32_t)below(v);
        }
        bias_ids[i * 2] = (int32_t)below(v);
        bias_values[i * 2] = 3.0f;
        bias_ids[i * 2 + 1] = (int32_t)below(v);
        bias_values[i * 2 + 1] = -INFINITY;
        banned[i] = (int32_t)below(v);
        /* A bad word: the output's last token then a peak of the request's first row. */
        bad_ids[i * 2] = output[i * 8 + 7];
        bad_ids[i * 2 + 1] = (int32_t)(row < ROWS ? peaks[row][1] : peaks2[row - ROWS][1]);
        min_tokens[i] = i % 2 ? 12 : 0;
        stop_ids[i] = (int32_t)(row < ROWS ? peaks[row][2] : peaks2[row - ROWS][2]);
        allowed_rows[i] = i == 4;
        allowed_off[i] = n_allowed;
        if (i == 4) {
          /* The drafts, the peaks of its rows and some others. */
          for (int j = 0; j < DRAFTS[i]; j++) allowed_ids[n_allowed++] = draft_tokens[d + j];
          for (int j = 0; j < 40; j++) allowed_ids[n_allowed++] = (int32_t)below(v);
        }
        d += DRAFTS[i];
        row += DRAFTS[i] + 1;
      }
      allowed_off[REQ] = n_allowed;
      for (uint32_t r = 0; r < rows; r++) {
        for (uint32_t w = 0; w < words; w++) bitmask[r * words + w] = r % 3 == 1 ? (int32_t)(uint32_t)next_u64() : -1;
      }
      tokenrace_verify_batch b;
      memset(&b, 0, sizeof b);
      b.struct_size = sizeof b;
      b.dtype = dt ? TOKENRACE_DTYPE_BF16 : TOKENRACE_DTYPE_F32;
      b.logits = logits;
      b.rows = rows;
      b.vocab = v;
      b.requests = REQ;
      b.draft_counts = DRAFTS;
      b.draft_tokens = draft_tokens;
      b.draft_probs = with_q ? q : NULL;
      b.temperature = temps;
      b.top_k = top_k;
      b.seeds = seeds;
      b.offsets = offsets;
      b.draft_parents = tree ? parents : NULL;
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
      b.allowed_ids = allowed_ids;
      b.allowed_offsets = allowed_off;
      b.allowed_rows = allowed_rows;
      b.banned_ids = banned;
      b.banned_offsets = banned_off;
      b.token_bitmask = bitmask;
      b.bad_words_ids = bad_ids;
      b.bad_word_offsets = bad_off;
      b.bad_words_row_offsets = bad_rows;
      b.min_tokens = min_tokens;
      b.stop_ids = stop_ids;
      b.stop_offsets = stop_off;
      int32_t tokens[REQ * (MAXD + 1)], counts[REQ], nodes[REQ * (MAXD + 1)];
      uint32_t flags[REQ];
      float lps[REQ * (MAXD + 1)];
      tokenrace_verify_output o;
      memset(&o, 0, sizeof o);
      o.struct_size = sizeof o;
      o.logprob_mode = variant % 2 ? TOKENRACE_LOGPROB_MODE_PROCESSED : TOKENRACE_LOGPROB_MODE_RAW;
      o.tokens = tokens;
      o.tokens_stride = MAXD + 1;
      o.counts = counts;
      o.flags = flags;
      o.logprobs = lps;
      o.accepted_nodes = nodes;
      if (tokenrace_verify(s, &b, &o) != TOKENRACE_STATUS_OK) {
        fprintf(stderr, "seeded_dump: verify call %d: %s\n", *call, tokenrace_last_error());
        tokenrace_sampler_free(s);
        return 1;
      }
      for (int i = 0; i < REQ; i++) {
        printf("verify call %d vocab %u variant %d request %d: count %d flags %u tokens", *call, v, variant, i,
               counts[i], flags[i]);
        for (int j = 0; j <= MAXD; j++)
          printf(" %d:%a:%d", tokens[i * (MAXD + 1) + j], (double)lps[i * (MAXD + 1) + j], nodes[i * (MAXD + 1) + j]);
        printf("\n");
      }
    }
  }
  tokenrace_sampler_free(s);
  return 0;
}

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
          const void *logits = fill_rows(x, h, v, dt, peaks);
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
  /* The newer outputs and inputs, after the calls above (whose lines they leave as they were). */
  int first_new = call;
  float *q = malloc(sizeof(float) * 16 * 32000);
  if (!q) return 1;
  if (dump_kept(s, x, h, bitmask, &call) || dump_llama_filters(s, x, h, &call) || dump_dry(s, x, h, &call) ||
      dump_mirostat(s, x, h, &call) || dump_verify(&cfg, x, h, bitmask, q, &call))
    return 1;
  free(q);
  printf("%d calls (%d of kept sets, typical/XTC/top-nsigma, orders, DRY, mirostat, verify with the step), %ld seeded "
         "rows, %ld unseeded rows\n",
         call, call - first_new, seeded_rows, unseeded_rows);
  free(x);
  free(h);
  free(noise);
  free(bitmask);
  tokenrace_sampler_free(s);
  return 0;
}
