/* tokenrace_verify through the C ABI (speculative decoding, since 0.2): greedy requests accept
 * while the draft is the argmax; seeded requests give the same tokens alone, with batch mates and
 * on samplers of other streams, and their bonus row is the seeded draw of that row; external
 * uniforms and noise against a float64 reference of the rules (a draft of probability 0 is never
 * accepted nor emitted); draft probabilities; -1 padding, counts, strides, flags and logprobs;
 * errors naming the argument, request and position with nothing written; struct sizes. */
#include "tokenrace.h"
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

enum { V = 64, REQ = 8, WIDTH = 8, ROWS = 48 };

static const float SENTINEL = 12345.0f;

/* ---- inputs ---------------------------------------------------------------------------------- */

/* Row `pattern`: the values k/16 (k in [0, 64), a permutation; exact in f32, bf16 and f16) and one
 * peak of 6.5 at the token that would hold 63/16, which then has p ~ 0.46 at T = 1. */
static void row_of(float *x, int pattern) {
  for (int i = 0; i < V; i++) {
    int k = (7 * i + 3 * pattern) % V;
    x[i] = k == V - 1 ? 6.5f : (float)k / 16.0f;
  }
}

static void rows_of(float *x, int first_pattern, int n) {
  for (int r = 0; r < n; r++) row_of(x + (size_t)r * V, first_pattern + r);
}

/* The lowest index of the largest value (NaN ignored). */
static int argmax_of(const float *x) {
  int best = -1;
  for (int i = 0; i < V; i++)
    if (!isnan(x[i]) && (best < 0 || x[i] > x[best])) best = i;
  return best;
}

/* The token of the row with k = 62, next to the peak (p ~ 0.035 at T = 1). */
static int second_of(const float *x) {
  for (int i = 0; i < V; i++)
    if (x[i] == 62.0f / 16.0f) return i;
  return -1;
}

static uint64_t xorshift(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Exp(1) noise, never 0. */
static void noise_of(float *e, size_t n, uint64_t seed) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; i++) {
    double u = ((double)(xorshift(&s) >> 11) + 0.5) / 9007199254740992.0;
    e[i] = (float)-log(u);
  }
}

static uint16_t to_bf16(float x) { /* exact for the values of row_of */
  uint32_t b;
  memcpy(&b, &x, 4);
  return (uint16_t)(b >> 16);
}

/* ---- the float64 reference (T = 1, no filters) ------------------------------------------------ */

static double finite_max(const float *x) {
  double m = -INFINITY;
  for (int i = 0; i < V; i++)
    if (isfinite(x[i]) && x[i] > m) m = x[i];
  return m;
}

/* log_softmax((x - m) * inv_t) at token t. */
static double logprob_of(const float *x, double inv_t, int t) {
  double m = finite_max(x), z = 0;
  for (int i = 0; i < V; i++)
    if (isfinite(x[i])) z += exp((x[i] - m) * inv_t);
  return (x[t] - m) * inv_t - log(z);
}

/* The race argmax (x - m) - ln E over the finite tokens but `exclude`. */
static int race_of(const float *x, const float *e, int exclude) {
  double m = finite_max(x), best_key = -INFINITY;
  int best = -1;
  for (int i = 0; i < V; i++) {
    if (i == exclude || !isfinite(x[i])) continue;
    double key = (x[i] - m) - log((double)e[i]);
    if (key > best_key) best_key = key, best = i;
  }
  return best;
}

/* p(t) at T = 1. */
static double p_of(const float *x, int t) { return isfinite(x[t]) ? exp(logprob_of(x, 1.0, t)) : 0.0; }

/* The race over the residual max(p - q, 0): argmax ln(p - q) - ln E over the tokens with p > q. */
static int residual_race_of(const float *x, const float *q, const float *e) {
  double best_key = -INFINITY;
  int best = -1;
  for (int i = 0; i < V; i++) {
    double r = p_of(x, i) - q[i];
    if (!(r > 0)) continue;
    double key = log(r) - log((double)e[i]);
    if (key > best_key) best_key = key, best = i;
  }
  return best;
}

/* ---- calls ------------------------------------------------------------------------------------ */

typedef struct {
  int32_t tokens[REQ * WIDTH];
  int32_t counts[REQ];
  uint32_t flags[REQ];
  float logprobs[REQ * WIDTH];
  tokenrace_verify_output o; /* points into this struct: never copied */
} result;

static void result_init(result *r, uint64_t tokens_stride) {
  for (int k = 0; k < REQ * WIDTH; k++) r->tokens[k] = -7, r->logprobs[k] = SENTINEL;
  for (int k = 0; k < REQ; k++) r->counts[k] = -7, r->flags[k] = 77;
  memset(&r->o, 0, sizeof r->o);
  r->o.struct_size = sizeof r->o;
  r->o.tokens = r->tokens;
  r->o.tokens_stride = tokens_stride;
  r->o.counts = r->counts;
  r->o.flags = r->flags;
  r->o.logprobs = r->logprobs;
}

static int untouched(const result *r) {
  int ok = 1;
  for (int k = 0; k < REQ * WIDTH; k++) ok &= r->tokens[k] == -7 && r->logprobs[k] == SENTINEL;
  for (int k = 0; k < REQ; k++) ok &= r->counts[k] == -7 && r->flags[k] == 77;
  return ok;
}

static tokenrace_verify_batch batch_of(const float *logits, uint32_t requests, const int32_t *counts,
                                       const int32_t *drafts) {
  tokenrace_verify_batch b;
  memset(&b, 0, sizeof b);
  b.struct_size = sizeof b;
  b.dtype = TOKENRACE_DTYPE_F32;
  b.logits = logits;
  b.vocab = V;
  b.requests = requests;
  b.draft_counts = counts;
  b.draft_tokens = drafts;
  for (uint32_t i = 0; i < requests; i++) b.rows += (uint32_t)counts[i] + 1;
  return b;
}

/* Request i's emitted tokens equal `want` (n of them), then -1 up to the stride. */
static int emitted_are(const result *r, int i, const int32_t *want, int n) {
  uint64_t w = r->o.tokens_stride;
  int ok = r->counts[i] == n;
  for (int j = 0; j < n; j++) ok &= r->tokens[i * w + j] == want[j];
  for (uint64_t j = (uint64_t)n; j < w; j++) ok &= r->tokens[i * w + j] == -1;
  if (!ok) {
    fprintf(stderr, "  request %d: count %d, tokens", i, r->counts[i]);
    for (uint64_t j = 0; j < w; j++) fprintf(stderr, " %d", r->tokens[i * w + j]);
    fprintf(stderr, "; wanted %d:", n);
    for (int j = 0; j < n; j++) fprintf(stderr, " %d", want[j]);
    fprintf(stderr, "\n");
  }
  return ok;
}

static int error_has(const char *a, const char *b, const char *c) {
  const char *e = tokenrace_last_error();
  int ok = strstr(e, "tokenrace_verify: ") == e && strstr(e, a) && (!b || strstr(e, b)) && (!c || strstr(e, c));
  if (!ok) fprintf(stderr, "  message \"%s\" lacks \"%s\" / \"%s\" / \"%s\"\n", e, a, b ? b : "", c ? c : "");
  return ok;
}

static tokenrace_sampler *sampler_of(uint64_t stream_seed, uint32_t threads) {
  tokenrace_config cfg = tokenrace_config_default();
  cfg.seed = stream_seed;
  cfg.has_seed = 1;
  cfg.max_rows = ROWS;
  cfg.threads = threads;
  tokenrace_sampler *s = NULL;
  CHECK(tokenrace_sampler_new(&cfg, &s) == TOKENRACE_STATUS_OK);
  return s;
}

static float X[ROWS * V];
static float E[ROWS * V];

/* ---- greedy requests -------------------------------------------------------------------------- */

static void greedy_requests(tokenrace_sampler *s) {
  /* Four requests over 11 rows: all drafts accepted (the bonus row's argmax follows), a mismatch
   * at draft 1 (the argmax there, then stop), no drafts (the bonus row), a mismatch at once. */
  rows_of(X, 0, 11);
  int a[11];
  for (int r = 0; r < 11; r++) a[r] = argmax_of(X + r * V);
  const int32_t counts[4] = {3, 3, 0, 1};
  const int32_t drafts[7] = {a[0], a[1], a[2], a[4], (a[5] + 1) % V, a[6], (a[9] + 5) % V};
  const float temps[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  tokenrace_verify_batch b = batch_of(X, 4, counts, drafts);
  CHECK(b.rows == 11);
  b.temperature = temps;
  const int32_t w0[4] = {a[0], a[1], a[2], a[3]}, w1[2] = {a[4], a[5]}, w2[1] = {a[8]}, w3[1] = {a[9]};
  const int32_t *want[4] = {w0, w1, w2, w3};
  const int n[4] = {4, 2, 1, 1};
  const int first_row[4] = {0, 4, 8, 9};

  static result r;
  for (int mode = 0; mode < 2; mode++) {
    /* tokens_stride 0 (max(draft_counts) + 1 = 4) and 6; RAW and PROCESSED logprobs (greedy
     * requests report RAW in both). */
    uint64_t stride = mode == 0 ? 0 : 6;
    result_init(&r, stride);
    r.o.logprob_mode = mode == 0 ? TOKENRACE_LOGPROB_MODE_RAW : TOKENRACE_LOGPROB_MODE_PROCESSED;
    CHECK(tokenrace_verify(s, &b, &r.o) == TOKENRACE_STATUS_OK);
    CHECK(r.o.tokens_stride == stride); /* the caller's struct is not written */
    r.o.tokens_stride = stride == 0 ? 4 : stride;
    uint64_t w = r.o.tokens_stride;
    for (int i = 0; i < 4; i++) {
      CHECK(emitted_are(&r, i, want[i], n[i]));
      CHECK(r.flags[i] == TOKENRACE_FLAG_GREEDY);
      for (int j = 0; j < n[i]; j++) {
        double lp = logprob_of(X + (first_row[i] + j) * V, 1.0, want[i][j]);
        CHECK(isfinite(r.logprobs[i * w + j]) && fabs(r.logprobs[i * w + j] - lp) <= 1e-5);
      }
      for (uint64_t j = (uint64_t)n[i]; j < w; j++) CHECK(isnan(r.logprobs[i * w + j]));
    }
    /* Nothing past requests x stride. */
    for (uint64_t k = 4 * w; k < REQ * WIDTH; k++) CHECK(r.tokens[k] == -7 && r.logprobs[k] == SENTINEL);
    for (int k = 4; k < REQ; k++) CHECK(r.counts[k] == -7 && r.flags[k] == 77);
  }

  /* The same rows in bf16, and in f32 with a row stride whose padding holds +inf (never read). */
  static uint16_t bf[11 * V];
  for (int k = 0; k < 11 * V; k++) bf[k] = to_bf16(X[k]);
  enum { STRIDE = V + 5 };
  static float padded[11 * STRIDE];
  for (int k = 0; k < 11 * STRIDE; k++) padded[k] = INFINITY;
  for (int row = 0; row < 11; row++) memcpy(padded + row * STRIDE, X + row * V, V * sizeof(float));
  for (int variant = 0; variant < 2; variant++) {
    tokenrace_verify_batch c = b;
    if (variant == 0) {
      c.dtype = TOKENRACE_DTYPE_BF16;
      c.logits = bf;
    } else {
      c.logits = padded;
      c.row_stride = STRIDE;
    }
    result_init(&r, 0);
    r.o.logprobs = NULL;
    CHECK(tokenrace_verify(s, &c, &r.o) == TOKENRACE_STATUS_OK);
    r.o.tokens_stride = 4;
    for (int i = 0; i < 4; i++) CHECK(emitted_are(&r, i, want[i], n[i]) && r.flags[i] == TOKENRACE_FLAG_GREEDY);
    CHECK(r.logprobs[0] == SENTINEL); /* not asked for */
  }

  /* Flags are those of the rows looked at: a NaN in the bonus row counts only when every draft
   * was accepted (and is never the token). */
  rows_of(X, 20, 2);
  int b0 = argmax_of(X), b1 = argmax_of(X + V);
  X[V + (b1 + 1) % V] = NAN;
  const int32_t one[1] = {1};
  int32_t d[1] = {(b0 + 1) % V};
  tokenrace_verify_batch g = batch_of(X, 1, one, d);
  g.temperature = temps;
  result_init(&r, 0);
  CHECK(tokenrace_verify(s, &g, &r.o) == TOKENRACE_STATUS_OK);
  CHECK(r.counts[0] == 1 && r.tokens[0] == b0 && r.flags[0] == TOKENRACE_FLAG_GREEDY);
  d[0] = b0;
  result_init(&r, 0);
  CHECK(tokenrace_verify(s, &g, &r.o) == TOKENRACE_STATUS_OK);
  CHECK(r.counts[0] == 2 && r.tokens[0] == b0 && r.tokens[1] == b1);
  CHECK(r.flags[0] == (TOKENRACE_FLAG_GREEDY | TOKENRACE_FLAG_HAS_NAN));
}

/* ---- seeded requests -------------------------------------------------------------------------- */

/* Request R (3 drafts, the argmax of each row, seeded at offset 100) alone, then between an
 * unseeded sampling request and a greedy one: the same tokens, counts, flags and logprobs, on two
 * samplers of different streams and thread counts. */
static void seeded_requests(tokenrace_sampler *s1, tokenrace_sampler *s2) {
  static float alone[4 * V], mixed[(3 + 4 + 2) * V];
  rows_of(alone, 0, 4);
  rows_of(mixed, 10, 3);
  memcpy(mixed + 3 * V, alone, sizeof alone);
  rows_of(mixed + 7 * V, 30, 2);
  const int32_t rc[1] = {3}, mc[3] = {2, 3, 1};
  int32_t rd[3], md[6];
  for (int j = 0; j < 3; j++) rd[j] = argmax_of(alone + j * V);
  md[0] = argmax_of(mixed), md[1] = argmax_of(mixed + V);
  memcpy(md + 2, rd, sizeof rd);
  md[5] = argmax_of(mixed + 7 * V);
  const float rt[1] = {1.0f}, mt[3] = {1.0f, 1.0f, 0.0f};
  uint64_t rs[1], ms[3] = {0, 0, 0};
  uint64_t ro[1] = {100}, mo[3] = {5, 100, 9};
  const uint8_t mseeded[3] = {0, 1, 0};

  static result r, m, m2, shifted;
  int seen[5] = {0};
  int offsets_matter = 0, shift_checked = 0;
  for (uint64_t seed = 0; seed < 16; seed++) {
    rs[0] = seed, ms[1] = seed;
    tokenrace_verify_batch b = batch_of(alone, 1, rc, rd);
    b.temperature = rt, b.seeds = rs, b.offsets = ro;
    result_init(&r, 0);
    CHECK(tokenrace_verify(s1, &b, &r.o) == TOKENRACE_STATUS_OK);
    CHECK(r.counts[0] >= 1 && r.counts[0] <= 4);
    seen[r.counts[0]]++;
    for (int j = 0; j < r.counts[0]; j++) {
      CHECK(r.tokens[j] >= 0 && r.tokens[j] < V && isfinite(r.logprobs[j]));
      /* Accepted drafts are the drafts; a rejected one is not what is emitted in its place. */
      if (j < r.counts[0] - 1) CHECK(r.tokens[j] == rd[j]);
      else if (j < 3) CHECK(r.tokens[j] != rd[j]);
    }

    tokenrace_verify_batch c = batch_of(mixed, 3, mc, md);
    c.temperature = mt, c.seeds = ms, c.offsets = mo, c.seeded = mseeded;
    tokenrace_sampler *on[2] = {s1, s2};
    result *out[2] = {&m, &m2};
    for (int k = 0; k < 2; k++) {
      result_init(out[k], 0);
      CHECK(tokenrace_verify(on[k], &c, &out[k]->o) == TOKENRACE_STATUS_OK);
      out[k]->o.tokens_stride = 4;
      CHECK(emitted_are(out[k], 1, r.tokens, r.counts[0]));
      CHECK(out[k]->flags[1] == r.flags[0] && r.flags[0] == 0);
      for (int j = 0; j < 4; j++) {
        float a = out[k]->logprobs[4 + j], e = r.logprobs[j];
        CHECK(a == e || (isnan(a) && isnan(e)));
      }
      CHECK(out[k]->tokens[2 * 4] == md[5] && out[k]->counts[2] == 2); /* the greedy mate */
    }

    /* The same request one position later (rows 1..3, drafts 1..2, offset 101) continues R where
     * R accepted its first draft: position j's randomness is keyed by (seed, offset + j). */
    if (r.counts[0] >= 2) {
      const int32_t sc[1] = {2};
      const uint64_t so[1] = {101};
      tokenrace_verify_batch t = batch_of(alone + V, 1, sc, rd + 1);
      t.temperature = rt, t.seeds = rs, t.offsets = so;
      result_init(&shifted, 0);
      CHECK(tokenrace_verify(s2, &t, &shifted.o) == TOKENRACE_STATUS_OK);
      shifted.o.tokens_stride = 3;
      CHECK(emitted_are(&shifted, 0, r.tokens + 1, r.counts[0] - 1));
      shift_checked++;
    }
    /* Another offset: other randomness (some seed must show it). */
    ro[0] = 200;
    result_init(&shifted, 0);
    CHECK(tokenrace_verify(s1, &b, &shifted.o) == TOKENRACE_STATUS_OK);
    offsets_matter |= shifted.counts[0] != r.counts[0] || memcmp(shifted.tokens, r.tokens, 4 * sizeof(int32_t));
    ro[0] = 100;
  }
  int distinct = 0;
  for (int k = 1; k <= 4; k++) distinct += seen[k] > 0;
  CHECK(distinct >= 2); /* both accepting and rejecting happen */
  CHECK(offsets_matter && shift_checked > 0);
}

/* A seeded request's bonus row is the seeded draw of that row at offset + n (with its filters):
 * with drafts accepted for sure (+inf at the draft: p is a point mass there), the token and the
 * processed logprob equal tokenrace_draw's. */
static void seeded_bonus_rows_are_draws(tokenrace_sampler *s) {
  static float x[3 * V];
  rows_of(x, 40, 3);
  x[0 * V + 9] = INFINITY;
  x[1 * V + 17] = INFINITY;
  const int32_t counts[2] = {2, 0};
  const int32_t drafts[2] = {9, 17};
  const float temps[2] = {0.7f, 0.9f};
  const int32_t top_k[2] = {20, 0};
  const float top_p[2] = {0.95f, 1.0f};
  for (uint64_t seed = 0; seed < 8; seed++) {
    uint64_t seeds[2] = {seed, seed + 1000}, offsets[2] = {50, 7};
    /* Request 0 on rows 0..2 (bonus at row 2, offset 52), request 1: row 2 alone at offset 7. */
    static float rows4[4 * V];
    memcpy(rows4, x, sizeof x);
    memcpy(rows4 + 3 * V, x + 2 * V, V * sizeof(float));
    tokenrace_verify_batch b = batch_of(rows4, 2, counts, drafts);
    b.temperature = temps, b.top_k = top_k, b.top_p = top_p, b.seeds = seeds, b.offsets = offsets;
    static result r;
    result_init(&r, 0);
    r.o.logprob_mode = TOKENRACE_LOGPROB_MODE_PROCESSED;
    CHECK(tokenrace_verify(s, &b, &r.o) == TOKENRACE_STATUS_OK);
    CHECK(r.counts[0] == 3 && r.tokens[0] == 9 && r.tokens[1] == 17 && r.counts[1] == 1);
    CHECK(r.flags[0] == TOKENRACE_FLAG_HAS_POSINF && r.flags[1] == 0);
    CHECK(r.logprobs[0] == 0.0f && r.logprobs[1] == 0.0f); /* the only +inf: ln 1 */

    /* The same row drawn: request 0's parameters at offset 52, request 1's at offset 7. */
    tokenrace_batch d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.dtype = TOKENRACE_DTYPE_F32;
    d.logits = rows4 + 2 * V; /* rows 2 and 3: the same row twice */
    d.rows = 2;
    d.vocab = V;
    const uint64_t doff[2] = {52, 7};
    d.temperature = temps, d.top_k = top_k, d.top_p = top_p, d.seeds = seeds, d.offsets = doff;
    int32_t tokens[2] = {-1, -1};
    float lps[2];
    tokenrace_output o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.tokens = tokens;
    o.logprobs = lps;
    o.logprob_mode = TOKENRACE_LOGPROB_MODE_PROCESSED;
    CHECK(tokenrace_draw(s, &d, &o) == TOKENRACE_STATUS_OK);
    CHECK(r.tokens[2] == tokens[0] && r.tokens[3] == tokens[1]);
    CHECK(r.logprobs[2] == lps[0] && r.logprobs[3] == lps[1]);
  }
}

/* ---- external uniforms and noise, no q --------------------------------------------------------- */

static void external_uniforms(tokenrace_sampler *s) {
  rows_of(X, 50, 3);
  noise_of(E, 3 * V, 1);
  const float temps[1] = {1.0f};
  const int32_t counts[1] = {2};
  int32_t drafts[2];
  double u[2];
  static result r;
  tokenrace_verify_batch b = batch_of(X, 1, counts, drafts);
  b.temperature = temps, b.uniforms = u, b.noise = E, b.noise_kind = TOKENRACE_NOISE_KIND_EXP;
  b.noise_row_stride = V;

  /* u close to 0 accepts drafts of p ~ 0.035 and ~ 0.46; the bonus token is the race on row 2. */
  drafts[0] = second_of(X), drafts[1] = argmax_of(X + V);
  u[0] = 1e-9, u[1] = 1e-9;
  CHECK(p_of(X, drafts[0]) > 0.01 && p_of(X, drafts[0]) < 0.1);
  result_init(&r, 0);
  CHECK(tokenrace_verify(s, &b, &r.o) == TOKENRACE_STATUS_OK);
  int32_t want[3] = {drafts[0], drafts[1], race_of(X + 2 * V, E + 2 * V, -1)};
  CHECK(emitted_are(&r, 0, want, 3) && r.flags[0] == 0);
  for (int j = 0; j < 3; j++) CHECK(fabs(r.logprobs[j] - logprob_of(X + j * V, 1.0, want[j])) <= 1e-5);

  /* u close to 1 rejects the argmax (p ~ 0.46), whose noise makes it win the plain race: the
   * token emitted is the race without it. */
  drafts[0] = argmax_of(X);
  E[drafts[0]] = 1e-6f;
  CHECK(race_of(X, E, -1) == drafts[0]);
  u[0] = 1.0 - 1e-12;
  result_init(&r, 0);
  CHECK(tokenrace_verify(s, &b, &r.o) == TOKENRACE_STATUS_OK);
  want[0] = race_of(X, E, drafts[0]);
  CHECK(emitted_are(&r, 0, want, 1) && want[0] != drafts[0]);

  /* A draft of probability 0 (a -inf logit) is rejected even with u ~ 1e-300, and not emitted:
   * at draft 0, and at draft 1 after an accepted one; on the caller's noise and uniforms, then
   * on the sampler's. */
  for (uint64_t k = 0; k < 8; k++) {
    rows_of(X, 50, 3);
    noise_of(E, 3 * V, 10 + k);
    int z = (int)(k * 5) % V;
    X[z] = -INFINITY;
    X[V + z] = -INFINITY;
    drafts[0] = z, drafts[1] = z;
    u[0] = 1e-300, u[1] = 1e-300;
    result_init(&r, 0);
    CHECK(tokenrace_verify(s, &b, &r.o) == TOKENRACE_STATUS_OK);
    want[0] = race_of(X, E, -1);
    CHECK(emitted_are(&r, 0, want, 1) && r.tokens[0] != z);
    CHECK(isfinite(r.logprobs[0]) && isnan(r.logprobs[1]));
    drafts[0] = argmax_of(X);
    result_init(&r, 0);
    CHECK(tokenrace_verify(s, &b, &r.o) == TOKENRACE_STATUS_OK);
    want[0] = drafts[0], want[1] = race_of(X + V, E + V, -1);
    CHECK(emitted_are(&r, 0, want, 2) && r.tokens[1] != z);
  }
  tokenrace_verify_batch own = b;
  own.uniforms = NULL, own.noise = NULL;
  int z = 3;
  rows_of(X, 60, 3);
  X[z] = -INFINITY;
  drafts[0] = z, drafts[1] = argmax_of(X + V);
  int never = 1;
  for (int k = 0; k < 40; k++) {
    result_init(&r, 0);
    CHECK(tokenrace_verify(s, &own, &r.o) == TOKENRACE_STATUS_OK);
    never &= r.counts[0] == 1 && r.tokens[0] != z && r.tokens[0] >= 0 && r.tokens[0] < V && r.tokens[1] == -1;
  }
  CHECK(never);
}

/* ---- draft probabilities ----------------------------------------------------------------------- */

static void draft_probs(tokenrace_sampler *s) {
  enum { QS = V + 3 };
  static float q[3 * QS];
  const float temps[1] = {1.0f};
  const int32_t counts[1] = {3};
  int32_t drafts[3];
  double u[3];
  static result with_q, without_q;

  /* A one-hot q is what NULL means: the same tokens on the same uniforms and noise. Its padding
   * (NaN, stride V + 3) is never read. */
  for (uint64_t k = 0; k < 12; k++) {
    rows_of(X, 70 + (int)k, 4);
    noise_of(E, 4 * V, 100 + k);
    for (int j = 0; j < 3; j++) drafts[j] = (k % 3 == 0) ? second_of(X + j * V) : argmax_of(X + j * V);
    for (int j = 0; j < 3; j++) u[j] = 0.05 + 0.3 * (double)((k + (uint64_t)j) % 3);
    for (int k2 = 0; k2 < 3 * QS; k2++) q[k2] = NAN;
    for (int j = 0; j < 3; j++) {
      for (int i = 0; i < V; i++) q[j * QS + i] = 0.0f;
      q[j * QS + drafts[j]] = 1.0f;
    }
    tokenrace_verify_batch b = batch_of(X, 1, counts, drafts);
    b.temperature = temps, b.uniforms = u, b.noise = E, b.noise_row_stride = V;
    result_init(&without_q, 0);
    CHECK(tokenrace_verify(s, &b, &without_q.o) == TOKENRACE_STATUS_OK);
    b.draft_probs = q, b.draft_probs_row_stride = QS;
    result_init(&with_q, 0);
    CHECK(tokenrace_verify(s, &b, &with_q.o) == TOKENRACE_STATUS_OK);
    with_q.o.tokens_stride = 4;
    CHECK(emitted_are(&with_q, 0, without_q.tokens, without_q.counts[0]));
  }

  /* q uniform (1/64, exact): a draft with p > q is accepted for any u; one with p < q is rejected
   * at u = 0.5 (p / q ~ 0.045) and the token comes from the residual max(p - q, 0). */
  rows_of(X, 90, 4);
  noise_of(E, 4 * V, 7);
  for (int k2 = 0; k2 < 3 * QS; k2++) q[k2] = 1.0f / V;
  int low = -1;
  for (int i = 0; i < V; i++)
    if (X[2 * V + i] == 0.0f) low = i;
  drafts[0] = argmax_of(X), drafts[1] = argmax_of(X + V), drafts[2] = low;
  u[0] = 1.0 - 1e-12, u[1] = 0.999, u[2] = 0.5;
  CHECK(p_of(X, drafts[0]) > 1.0 / V && p_of(X + 2 * V, low) < 0.1 / V);
  tokenrace_verify_batch b = batch_of(X, 1, counts, drafts);
  b.temperature = temps, b.uniforms = u, b.noise = E, b.noise_row_stride = V;
  b.draft_probs = q, b.draft_probs_row_stride = QS;
  result_init(&with_q, 0);
  CHECK(tokenrace_verify(s, &b, &with_q.o) == TOKENRACE_STATUS_OK);
  int32_t want[3] = {drafts[0], drafts[1], residual_race_of(X + 2 * V, q + 2 * QS, E + 2 * V)};
  CHECK(emitted_are(&with_q, 0, want, 3));
  CHECK(want[2] >= 0 && p_of(X + 2 * V, want[2]) > 1.0 / V);
  /* The plain race of that row would often pick another token: a residual is not the row. */
  const int32_t one[1] = {1};
  int differs = 0;
  for (uint64_t k = 0; k < 16; k++) {
    noise_of(E, 2 * V, 200 + k);
    int32_t d[1] = {low};
    tokenrace_verify_batch c = batch_of(X + 2 * V, 1, one, d);
    c.temperature = temps, c.uniforms = u + 2, c.noise = E, c.noise_row_stride = V;
    c.draft_probs = q, c.draft_probs_row_stride = QS;
    result_init(&with_q, 0);
    CHECK(tokenrace_verify(s, &c, &with_q.o) == TOKENRACE_STATUS_OK);
    int resid = residual_race_of(X + 2 * V, q, E);
    CHECK(with_q.counts[0] == 1 && with_q.tokens[0] == resid && p_of(X + 2 * V, resid) > 1.0 / V);
    differs |= resid != race_of(X + 2 * V, E, -1);
  }
  CHECK(differs);
}

/* ---- zero requests, and errors ----------------------------------------------------------------- */

static void zero_requests_need_no_pointers(tokenrace_sampler *s) {
  tokenrace_verify_batch b;
  memset(&b, 0, sizeof b);
  b.struct_size = sizeof b;
  b.vocab = V;
  tokenrace_verify_output o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  CHECK(tokenrace_verify(s, &b, &o) == TOKENRACE_STATUS_OK);
  b.vocab = 0;
  CHECK(tokenrace_verify(s, &b, &o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("batch.vocab", NULL, NULL));
}

/* Every failing call returns INVALID_ARGUMENT naming the field (and request and position), writes
 * nothing, and counts as a rejected call. */
static void errors_name_the_field(tokenrace_sampler *s) {
  tokenrace_sampler_stats before;
  memset(&before, 0, sizeof before);
  before.struct_size = sizeof before;
  CHECK(tokenrace_sampler_get_stats(s, &before) == TOKENRACE_STATUS_OK);
  int rejected = 0;

  rows_of(X, 0, 6);
  static float q[3 * V];
  for (int k = 0; k < 3 * V; k++) q[k] = 1.0f / V;
  int32_t counts[3] = {2, 0, 1};
  int32_t drafts[3] = {3, 4, 5};
  double u[3] = {0.5, 0.5, 0.5};
  float temps[3] = {1.0f, 1.0f, 1.0f};
  float top_p[3] = {1.0f, 1.0f, 1.0f};
  tokenrace_verify_batch b = batch_of(X, 3, counts, drafts);
  b.draft_probs = q, b.uniforms = u, b.temperature = temps, b.top_p = top_p;
  static result r;
  result_init(&r, 0);
  CHECK(tokenrace_verify(s, &b, &r.o) == TOKENRACE_STATUS_OK); /* the valid call */

#define REFUSED(call, a, b_, c)                                            \
  do {                                                                     \
    result_init(&r, 0);                                                    \
    CHECK((call) == TOKENRACE_STATUS_INVALID_ARGUMENT);                    \
    CHECK(error_has(a, b_, c));                                            \
    CHECK(untouched(&r));                                                  \
    rejected++;                                                            \
  } while (0)

  drafts[1] = V;
  REFUSED(tokenrace_verify(s, &b, &r.o), "batch.draft_tokens[1]: ", "request 0, draft 1", "64 is not a token id");
  drafts[1] = 4;
  drafts[2] = -2;
  REFUSED(tokenrace_verify(s, &b, &r.o), "batch.draft_tokens[2]: ", "request 2, draft 0", "nor -1");
  /* -1 is vLLM's placeholder: rejected, so request 2 emits one token (its residual draw). */
  drafts[2] = -1;
  result_init(&r, 0);
  CHECK(tokenrace_verify(s, &b, &r.o) == TOKENRACE_STATUS_OK);
  CHECK(r.counts[2] == 1 && r.tokens[2 * r.o.tokens_stride] >= 0 && r.tokens[2 * r.o.tokens_stride] < V);
  drafts[2] = 5;
  /* An output that shares memory with an input: refused naming both, nothing written. */
  result_init(&r, 0);
  int32_t *own = r.o.counts;
  r.o.counts = drafts;
  CHECK(tokenrace_verify(s, &b, &r.o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("out.counts: overlaps batch.draft_tokens", NULL, NULL));
  r.o.counts = own;
  CHECK(untouched(&r) && drafts[0] == 3 && drafts[1] == 4 && drafts[2] == 5);
  rejected++;
  b.rows = 7;
  REFUSED(tokenrace_verify(s, &b, &r.o), "batch.draft_counts: ", "need 6 target rows", "rows is 7");
  b.rows = 6;
  counts[1] = -1;
  REFUSED(tokenrace_verify(s, &b, &r.o), "batch.draft_counts[1]: ", "negative", NULL);
  counts[1] = 0;
  q[2 * V] = 0.5f;
  REFUSED(tokenrace_verify(s, &b, &r.o), "batch.draft_probs[2]: ", "request 2, draft 0", "not 1 within 1e-3");
  q[2 * V] = 1.0f / V;
  q[V + 7] = -0.01f;
  REFUSED(tokenrace_verify(s, &b, &r.o), "batch.draft_probs[1]: ", "request 0, draft 1", "token 7");
  q[V + 7] = NAN;
  REFUSED(tokenrace_verify(s, &b, &r.o), "batch.draft_probs[1]: ", "token 7", NULL);
  q[V + 7] = 1.0f / V;
  b.draft_probs_row_stride = V - 1;
  REFUSED(tokenrace_verify(s, &b, &r.o), "batch.draft_probs_row_stride", NULL, NULL);
  b.draft_probs_row_stride = 0;
  u[1] = 1.0;
  REFUSED(tokenrace_verify(s, &b, &r.o), "batch.uniforms[1]: ", "request 0, draft 1", "not in (0, 1)");
  u[1] = 0.5;
  u[2] = 0.0;
  REFUSED(tokenrace_verify(s, &b, &r.o), "batch.uniforms[2]: ", "request 2, draft 0", "(0, 1)");
  u[2] = NAN;
  REFUSED(tokenrace_verify(s, &b, &r.o), "batch.uniforms[2]: ", "(0, 1)", NULL);
  u[2] = 0.5;
  temps[1] = NAN;
  REFUSED(tokenrace_verify(s, &b, &r.o), "batch.temperature[1]", NULL, NULL);
  temps[1] = 1.0f;
  top_p[2] = 1.5f;
  REFUSED(tokenrace_verify(s, &b, &r.o), "batch.top_p[2]", NULL, NULL);
  top_p[2] = 1.0f;
  b.dtype = 3;
  REFUSED(tokenrace_verify(s, &b, &r.o), "batch.dtype: 3 is not a tokenrace_dtype", NULL, NULL);
  b.dtype = TOKENRACE_DTYPE_F32;
  b.noise = E;
  b.noise_kind = 2;
  REFUSED(tokenrace_verify(s, &b, &r.o), "batch.noise_kind", NULL, NULL);
  b.noise = NULL;
  b.noise_kind = 0;
  const int32_t *saved = b.draft_tokens;
  b.draft_tokens = NULL;
  REFUSED(tokenrace_verify(s, &b, &r.o), "batch.draft_tokens: is NULL", NULL, NULL);
  b.draft_tokens = saved;
  b.logits = NULL;
  REFUSED(tokenrace_verify(s, &b, &r.o), "batch.logits: is NULL", NULL, NULL);
  b.logits = X;
  /* The output's fields (r.o is set up by REFUSED's result_init: patched in the call). */
  result_init(&r, 2);
  CHECK(tokenrace_verify(s, &b, &r.o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("out.tokens_stride: 2 is smaller than max(draft_counts) + 1 = 3", NULL, NULL));
  r.o.tokens_stride = 0;
  CHECK(untouched(&r));
  rejected++;
  r.o.logprob_mode = 2;
  CHECK(tokenrace_verify(s, &b, &r.o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("out.logprob_mode: 2 is not a tokenrace_logprob_mode", NULL, NULL) && untouched(&r));
  rejected++;
  r.o.logprob_mode = 0;
  r.o.tokens = NULL;
  CHECK(tokenrace_verify(s, &b, &r.o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("out.tokens: is NULL", NULL, NULL) && untouched(&r));
  rejected++;
  r.o.tokens = r.tokens;
  r.o.counts = NULL;
  CHECK(tokenrace_verify(s, &b, &r.o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("out.counts: is NULL", NULL, NULL) && untouched(&r));
  rejected++;
  r.o.counts = r.counts;
  /* NULL structs and sampler (a NULL sampler counts nowhere). */
  CHECK(tokenrace_verify(s, NULL, &r.o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("batch: is NULL", NULL, NULL) && untouched(&r));
  rejected++;
  CHECK(tokenrace_verify(s, &b, NULL) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("out: is NULL", NULL, NULL));
  rejected++;
  CHECK(tokenrace_verify(NULL, &b, &r.o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("sampler: is NULL", NULL, NULL) && untouched(&r));

  /* More rows than the sampler's max_rows. */
  static float many[(ROWS + 1) * V];
  rows_of(many, 0, ROWS + 1);
  static int32_t zero_counts[ROWS + 1];
  tokenrace_verify_batch big = batch_of(many, ROWS + 1, zero_counts, NULL);
  static int32_t big_tokens[ROWS + 1], big_counts[ROWS + 1];
  tokenrace_verify_output bo;
  memset(&bo, 0, sizeof bo);
  bo.struct_size = sizeof bo;
  bo.tokens = big_tokens;
  bo.counts = big_counts;
  CHECK(tokenrace_verify(s, &big, &bo) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("max_rows", NULL, NULL));
  rejected++;
  big.rows = big.requests = ROWS;
  CHECK(tokenrace_verify(s, &big, &bo) == TOKENRACE_STATUS_OK);

  /* Greedy requests ignore their uniforms and q rows, however bad. */
  float greedy[3] = {0.0f, 0.0f, 0.0f};
  b.temperature = greedy;
  u[0] = 1.0, u[2] = -3.0;
  q[0] = 5.0f;
  q[V + 1] = NAN;
  result_init(&r, 0);
  CHECK(tokenrace_verify(s, &b, &r.o) == TOKENRACE_STATUS_OK);
  CHECK(r.counts[0] >= 1 && r.counts[1] == 1 && r.counts[2] >= 1);
#undef REFUSED

  tokenrace_sampler_stats after;
  memset(&after, 0, sizeof after);
  after.struct_size = sizeof after;
  CHECK(tokenrace_sampler_get_stats(s, &after) == TOKENRACE_STATUS_OK);
  CHECK(after.rejected_calls - before.rejected_calls == (uint64_t)rejected);
  CHECK(after.calls - before.calls == 4);
}

/* ---- struct sizes ------------------------------------------------------------------------------ */

static void struct_sizes(tokenrace_sampler *s) {
  /* The layouts, pinned: the first versions (160 and 48 bytes), then the draft trees' fields. */
  CHECK(sizeof(tokenrace_verify_batch) == 352 && sizeof(tokenrace_verify_output) == 56);
  CHECK(offsetof(tokenrace_verify_batch, draft_parents) == 160);
  CHECK(offsetof(tokenrace_verify_batch, prompt_ids) == 168 && offsetof(tokenrace_verify_batch, token_bitmask) == 288);
  CHECK(offsetof(tokenrace_verify_batch, bitmask_row_stride) == 296 && offsetof(tokenrace_verify_batch, stop_offsets) == 344);
  CHECK(offsetof(tokenrace_verify_output, accepted_nodes) == 48);
  CHECK(offsetof(tokenrace_verify_batch, requests) == 32 && offsetof(tokenrace_verify_batch, draft_counts) == 40);
  CHECK(offsetof(tokenrace_verify_batch, draft_probs_row_stride) == 64);
  CHECK(offsetof(tokenrace_verify_batch, uniforms) == 128 && offsetof(tokenrace_verify_batch, noise) == 136);
  CHECK(offsetof(tokenrace_verify_batch, noise_row_stride) == 152);
  CHECK(offsetof(tokenrace_verify_output, tokens_stride) == 16 && offsetof(tokenrace_verify_output, logprobs) == 40);

  rows_of(X, 0, 3);
  const int32_t counts[2] = {1, 0};
  const int32_t drafts[1] = {0};
  tokenrace_verify_batch b = batch_of(X, 2, counts, drafts);
  static result r;
  /* Smaller than the first version (160 bytes), also a size ending inside a field (every size
   * below 160 is: the first version ends at a field's end): refused, naming the argument. */
  const uint32_t small[5] = {0, 4, 100, 156, 159};
  for (int k = 0; k < 5; k++) {
    tokenrace_verify_batch old = b;
    old.struct_size = small[k];
    result_init(&r, 0);
    CHECK(tokenrace_verify(s, &old, &r.o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
    char needle[128];
    snprintf(needle, sizeof needle, "batch.struct_size: %u is smaller than the first tokenrace_verify_batch (160 bytes)",
             small[k]);
    CHECK(error_has(needle, NULL, NULL) && untouched(&r));
  }
  const uint32_t small_out[3] = {0, 44, 47};
  for (int k = 0; k < 3; k++) {
    result_init(&r, 0);
    r.o.struct_size = small_out[k];
    CHECK(tokenrace_verify(s, &b, &r.o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
    char needle[128];
    snprintf(needle, sizeof needle, "out.struct_size: %u is smaller than the first tokenrace_verify_output (48 bytes)",
             small_out[k]);
    CHECK(error_has(needle, NULL, NULL) && untouched(&r));
  }
  /* A newer caller's larger structs: accepted when the bytes beyond are zero, UNSUPPORTED when a
   * field this library does not know is set (nothing written). */
  struct {
    tokenrace_verify_batch b;
    uint64_t newer;
  } big_b;
  memset(&big_b, 0, sizeof big_b);
  big_b.b = b;
  big_b.b.struct_size = sizeof big_b;
  struct {
    tokenrace_verify_output o;
    uint64_t newer;
  } big_o;
  memset(&big_o, 0, sizeof big_o);
  result_init(&r, 0);
  big_o.o = r.o;
  big_o.o.struct_size = sizeof big_o;
  CHECK(tokenrace_verify(s, &big_b.b, &big_o.o) == TOKENRACE_STATUS_OK);
  CHECK(r.counts[0] >= 1 && r.counts[1] == 1);
  big_b.newer = 1;
  result_init(&r, 0);
  big_o.o = r.o;
  big_o.o.struct_size = sizeof big_o;
  CHECK(tokenrace_verify(s, &big_b.b, &big_o.o) == TOKENRACE_STATUS_UNSUPPORTED);
  CHECK(strstr(tokenrace_last_error(), "batch: sets fields beyond the 352 bytes of tokenrace_verify_batch") != NULL);
  CHECK(untouched(&r));
  big_b.newer = 0;
  big_o.newer = 9;
  CHECK(tokenrace_verify(s, &big_b.b, &big_o.o) == TOKENRACE_STATUS_UNSUPPORTED);
  CHECK(strstr(tokenrace_last_error(), "out: sets fields beyond the 56 bytes of tokenrace_verify_output") != NULL);
  CHECK(untouched(&r));
}

/* ---- draft trees ----------------------------------------------------------------------------- */

/* A greedy tree: the root's children are a wrong token, the argmax, the argmax again; node 1 is
 * accepted (the first equal child), its child node 3 (the argmax of node 1's row, row 2) too, and
 * node 3's row (row 4) gives the bonus token. A chain given as a tree is the chain; a parent that
 * is not an earlier node is refused naming the node, with nothing written. */
static void draft_trees(tokenrace_sampler *s) {
  rows_of(X, 40, 5);
  int a0 = argmax_of(X), a2 = argmax_of(X + 2 * V), a4 = argmax_of(X + 4 * V);
  const int32_t counts[1] = {4};
  const int32_t drafts[4] = {(a0 + 1) % V, a0, a0, a2};
  const int32_t parents[4] = {-1, -1, -1, 1};
  const float temps[1] = {0.0f};
  tokenrace_verify_batch b = batch_of(X, 1, counts, drafts);
  b.temperature = temps;
  b.draft_parents = parents;
  static result r;
  int32_t nodes[REQ * WIDTH];
  for (int k = 0; k < REQ * WIDTH; k++) nodes[k] = -7;
  result_init(&r, 5);
  r.o.accepted_nodes = nodes;
  CHECK(tokenrace_verify(s, &b, &r.o) == TOKENRACE_STATUS_OK);
  const int32_t want[3] = {a0, a2, a4};
  CHECK(emitted_are(&r, 0, want, 3));
  CHECK(nodes[0] == 1 && nodes[1] == 3 && nodes[2] == -1 && nodes[3] == -1 && nodes[4] == -1 && nodes[5] == -7);

  /* Seeded sampling chains, with and without parents i - 1: the same tokens and logprobs. */
  rows_of(X, 50, 6);
  const int32_t cc[2] = {3, 1};
  int32_t cd[4] = {argmax_of(X), argmax_of(X + V), second_of(X + 2 * V), argmax_of(X + 4 * V)};
  const int32_t chain[4] = {-1, 0, 1, -1};
  const uint64_t seeds[2] = {7, 8}, offsets[2] = {3, 40};
  tokenrace_verify_batch c = batch_of(X, 2, cc, cd);
  c.seeds = seeds, c.offsets = offsets;
  static result plain, tree;
  result_init(&plain, 0);
  CHECK(tokenrace_verify(s, &c, &plain.o) == TOKENRACE_STATUS_OK);
  c.draft_parents = chain;
  result_init(&tree, 0);
  CHECK(tokenrace_verify(s, &c, &tree.o) == TOKENRACE_STATUS_OK);
  CHECK(memcmp(plain.tokens, tree.tokens, sizeof plain.tokens) == 0);
  CHECK(memcmp(plain.counts, tree.counts, sizeof plain.counts) == 0);
  CHECK(memcmp(plain.logprobs, tree.logprobs, sizeof plain.logprobs) == 0);

  /* Node 2 of request 0 naming itself as its parent: refused, nothing written. */
  const int32_t bad[4] = {-1, 0, 2, -1};
  c.draft_parents = bad;
  result_init(&r, 0);
  CHECK(tokenrace_verify(s, &c, &r.o) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("batch.draft_parents[2]", "request 0, node 2", "parent 2") && untouched(&r));
}

/* ---- watermarking ----------------------------------------------------------------------------- */

/* Seeds: rows whose last k = 2 tokens of prompt then output agree share a seed (the prompt's tail
 * counts while the output is shorter than k); a draw seeded with them gives tokens the detector
 * scores; bad arguments are refused naming them, with nothing written. */
static void watermark(tokenrace_sampler *s) {
  /* Row 0: prompt {4, 5}, output {6, 7}; row 1: prompt {9}, output {6, 7}; row 2: prompt {5},
   * output {6}; row 3: prompt {4, 5, 6}, no output. Rows 0 and 1 share the context {6, 7}, rows 2
   * and 3 the context {5, 6}. */
  const int32_t prompt[7] = {4, 5, 9, 5, 4, 5, 6};
  const uint64_t prompt_off[5] = {0, 2, 3, 4, 7};
  const int32_t output[5] = {6, 7, 6, 7, 6};
  const uint64_t output_off[5] = {0, 2, 4, 5, 5};
  const uint64_t secrets[4] = {11, 11, 11, 11};
  uint64_t seeds[4] = {0, 0, 0, 0};
  CHECK(tokenrace_watermark_seeds(4, secrets, 2, prompt, prompt_off, output, output_off, seeds) ==
        TOKENRACE_STATUS_OK);
  CHECK(seeds[0] == seeds[1] && seeds[2] == seeds[3] && seeds[0] != seeds[2]);
  const uint64_t bad_off[5] = {0, 2, 1, 4, 7};
  uint64_t untouched_seeds[4] = {1, 2, 3, 4};
  CHECK(tokenrace_watermark_seeds(4, secrets, 2, prompt, bad_off, output, output_off, untouched_seeds) ==
        TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(tokenrace_last_error(), "prompt_offsets[2]") != NULL);
  CHECK(untouched_seeds[0] == 1 && untouched_seeds[3] == 4);

  /* 64 positions of a flat row (every token equally likely) drawn with their seeds: the detector
   * scores them far above chance (each U is the largest of 64). */
  static float flat[V]; /* zero: every token equally likely */
  int32_t text[64];
  uint64_t seed_of[64], zero[64];
  int32_t history[66] = {1, 2};
  for (int t = 0; t < 64; t++) {
    /* One position at a time: its context is the last two tokens so far. */
    uint64_t off[2] = {0, (uint64_t)t + 2};
    CHECK(tokenrace_watermark_seeds(1, secrets, 2, NULL, NULL, history, off, &seed_of[t]) == TOKENRACE_STATUS_OK);
    zero[t] = 0;
    tokenrace_batch b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.dtype = TOKENRACE_DTYPE_F32;
    b.logits = flat;
    b.rows = 1;
    b.vocab = V;
    b.seeds = &seed_of[t];
    b.offsets = &zero[t];
    int32_t token = -1;
    tokenrace_output o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.tokens = &token;
    CHECK(tokenrace_draw(s, &b, &o) == TOKENRACE_STATUS_OK);
    text[t] = token;
    history[t + 2] = token;
  }
  double score = -1, p = -1;
  uint64_t scored = 0;
  CHECK(tokenrace_watermark_detect(11, 2, history, 2, text, 64, &score, &scored, &p) == TOKENRACE_STATUS_OK);
  CHECK(scored >= 1 && scored <= 64 && p < 1e-6 && score > (double)scored);
  double other = -1;
  CHECK(tokenrace_watermark_detect(12, 2, history, 2, text, 64, NULL, NULL, &other) == TOKENRACE_STATUS_OK);
  CHECK(other > 1e-6);
  const int32_t negative[2] = {3, -4};
  p = -1;
  CHECK(tokenrace_watermark_detect(11, 2, NULL, 0, negative, 2, NULL, NULL, &p) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(tokenrace_last_error(), "tokens[1]: -4 is not a token id") != NULL && p == -1);
}

int main(void) {
  tokenrace_sampler *s1 = sampler_of(1, 1), *s2 = sampler_of(2, 2);
  greedy_requests(s1);
  seeded_requests(s1, s2);
  seeded_bonus_rows_are_draws(s2);
  external_uniforms(s1);
  draft_probs(s1);
  zero_requests_need_no_pointers(s1);
  errors_name_the_field(s2);
  struct_sizes(s1);
  draft_trees(s1);
  watermark(s1);
  tokenrace_sampler_free(s1);
  tokenrace_sampler_free(s2);
  if (failures == 0) printf("test_verify: ok\n");
  return failures != 0;
}
