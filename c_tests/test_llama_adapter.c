/* include/tokenrace_llama.h, the llama.cpp sampler running the fused draw, against llama.cpp's
 * rules computed here by hand: greedy picks, the "keep only the most probable" parameters,
 * penalties over the accepted window, candidates out of id order and subsets, seeded sequences
 * (reset, clone), the distribution of unseeded draws (chi-square, with a power check), mirostat's
 * kept sets and mu against llama.cpp's rule, and the parameters it refuses. Built on a stand-in of llama.h (llama_stub/); scripts/llama-check.sh
 * runs the adapter against a real libllama. */
#include "llama_stub/llama.h"
#include "check.h"
#include "tokenrace.h"
#include "tokenrace_llama.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* libllama's side of the interface, as llama.cpp defines it. */
struct llama_sampler *llama_sampler_init(struct llama_sampler_i *iface, llama_sampler_context_t ctx) {
    struct llama_sampler *s = (struct llama_sampler *)malloc(sizeof *s);
    s->iface = iface;
    s->ctx = ctx;
    return s;
}
void llama_sampler_free(struct llama_sampler *smpl) {
    if (smpl->iface->free) {
        smpl->iface->free(smpl);
    }
    free(smpl);
}
void llama_sampler_accept(struct llama_sampler *smpl, llama_token token) { smpl->iface->accept(smpl, token); }
void llama_sampler_apply(struct llama_sampler *smpl, llama_token_data_array *cur_p) { smpl->iface->apply(smpl, cur_p); }
void llama_sampler_reset(struct llama_sampler *smpl) { smpl->iface->reset(smpl); }
struct llama_sampler *llama_sampler_clone(const struct llama_sampler *smpl) { return smpl->iface->clone(smpl); }

/* A context of one output row, as libllama hands out its logits. */
struct llama_context {
    float *logits;
    int32_t n_vocab;
};
float *llama_get_logits_ith(struct llama_context *ctx, int32_t i) { return i == -1 || i == 0 ? ctx->logits : NULL; }
const struct llama_model *llama_get_model(const struct llama_context *ctx) { return (const struct llama_model *)ctx; }
const struct llama_vocab *llama_model_get_vocab(const struct llama_model *model) {
    return (const struct llama_vocab *)model;
}
int32_t llama_vocab_n_tokens(const struct llama_vocab *vocab) {
    return ((const struct llama_context *)vocab)->n_vocab;
}

#define VOCAB 6
static const float LOGITS[VOCAB] = {1.0f, 3.0f, 2.5f, 3.0f, -1.0f, 0.5f};

/* The candidates of LOGITS in id order, or in the order `order` gives. */
static void candidates(llama_token_data *data, llama_token_data_array *arr, const int *order, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int id = order ? order[i] : (int)i;
        data[i].id = id;
        data[i].logit = LOGITS[id];
        data[i].p = 0.0f;
    }
    arr->data = data;
    arr->size = n;
    arr->selected = -1;
    arr->sorted = false;
}

/* The token id a sampler picks from the candidates (in `order`, or id order). */
static int pick(struct llama_sampler *s, const int *order, size_t n) {
    llama_token_data data[VOCAB];
    llama_token_data_array arr;
    candidates(data, &arr, order, n);
    llama_sampler_apply(s, &arr);
    CHECK(arr.selected >= 0 && (size_t)arr.selected < n);
    for (size_t i = 0; i < n; i++) {
        CHECK(data[i].logit == LOGITS[data[i].id]); /* the candidates are left as they were */
    }
    return arr.selected >= 0 ? data[arr.selected].id : -1;
}

static struct llama_sampler *make(struct tokenrace_llama_params p) {
    struct llama_sampler *s = tokenrace_llama_sampler_init(&p);
    CHECK(s != NULL);
    return s;
}

static struct tokenrace_llama_params plain(void) {
    struct tokenrace_llama_params p = tokenrace_llama_params_default();
    p.temp = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    return p;
}

static void greedy_and_keep_one(void) {
    static const int shuffled[VOCAB] = {5, 3, 0, 4, 1, 2};
    struct tokenrace_llama_params p = plain();
    p.temp = 0.0f;
    struct llama_sampler *s = make(p);
    /* Tokens 1 and 3 tie at the top: llama.cpp keeps the first candidate, the lowest id here. */
    CHECK(pick(s, NULL, VOCAB) == 1);
    /* Out of id order, the first of the tied candidates as given: token 3. */
    CHECK(pick(s, shuffled, VOCAB) == 3);
    llama_sampler_free(s);
    p.temp = -1.0f; /* llama.cpp: any temp <= 0 is greedy */
    s = make(p);
    CHECK(pick(s, NULL, VOCAB) == 1);
    llama_sampler_free(s);
    /* top_p <= 0 and min_p > 1 keep the most probable tokens only (the tie at the top stays). */
    static const float keep_one[2][2] = {{0.0f, 0.0f}, {1.0f, 1.5f}};
    for (int c = 0; c < 2; c++) {
        p = plain();
        p.top_p = keep_one[c][0];
        p.min_p = keep_one[c][1];
        s = make(p);
        for (int i = 0; i < 200; i++) {
            int t = pick(s, NULL, VOCAB);
            CHECK(t == 1 || t == 3);
        }
        llama_sampler_free(s);
    }
}

/* llama.cpp's penalties over the last n accepted tokens: repeat (divide a positive logit,
 * multiply a negative one), frequency (per occurrence) and presence. */
static void penalties(void) {
    struct tokenrace_llama_params p = plain();
    p.temp = 0.0f;
    p.penalty_last_n = 2;
    p.penalty_repeat = 2.0f;
    struct llama_sampler *s = make(p);
    CHECK(pick(s, NULL, VOCAB) == 1);
    llama_sampler_accept(s, 1); /* 3.0 / 2 = 1.5: token 3 (3.0) leads */
    CHECK(pick(s, NULL, VOCAB) == 3);
    llama_sampler_accept(s, 3); /* 1 and 3 at 1.5: token 2 (2.5) leads */
    CHECK(pick(s, NULL, VOCAB) == 2);
    llama_sampler_accept(s, 2); /* the window is 3, 2: token 1 is back at 3.0 */
    CHECK(pick(s, NULL, VOCAB) == 1);
    /* The same through shuffled candidates: the history follows the ids. */
    static const int shuffled[VOCAB] = {4, 2, 5, 3, 1, 0};
    CHECK(pick(s, shuffled, VOCAB) == 1);
    /* A subset without the penalised tokens: nothing of the history applies. */
    static const int subset[3] = {0, 5, 4};
    CHECK(pick(s, subset, 3) == 0);
    llama_sampler_reset(s); /* history gone */
    CHECK(pick(s, NULL, VOCAB) == 1);
    llama_sampler_free(s);

    /* Frequency and presence: token 1 seen twice, token 3 once, in a window of every token. */
    p = plain();
    p.temp = 0.0f;
    p.penalty_last_n = -1;
    p.penalty_freq = 0.4f;
    p.penalty_present = 0.3f;
    s = make(p);
    llama_sampler_accept(s, 1);
    llama_sampler_accept(s, 1);
    llama_sampler_accept(s, 3);
    /* 1: 3.0 - 0.8 - 0.3 = 1.9; 3: 3.0 - 0.4 - 0.3 = 2.3; 2: 2.5 wins. */
    CHECK(pick(s, NULL, VOCAB) == 2);
    llama_sampler_free(s);

    /* penalty_last_n = 0 turns the penalties off, as in llama.cpp. */
    p.penalty_last_n = 0;
    s = make(p);
    llama_sampler_accept(s, 1);
    CHECK(pick(s, NULL, VOCAB) == 1);
    llama_sampler_free(s);
}

/* llama.cpp's DRY after "3 1 3" at allowed length 1: a 1 next would extend the repeat of "3",
 * so 1 loses the multiplier (3.0 - 1.0) and 3 leads; a one-token breaker 1 shields it, a breaker
 * 3 ends the history (no repeat spans it), a window of 2 ("1 3") holds no repeat. Candidates
 * out of id order, and a subset without 3 (whose history still holds it), see the same. */
static void dry(void) {
    struct tokenrace_llama_params p = plain();
    p.temp = 0.0f;
    p.dry_multiplier = 1.0f;
    p.dry_allowed_length = 1;
    static const int32_t one[1] = {1}, three[1] = {3};
    static const uint64_t offsets[2] = {0, 1};
    static const int shuffled[VOCAB] = {4, 2, 5, 3, 1, 0};
    static const int without_3[4] = {0, 5, 2, 1};
    for (int variant = 0; variant < 4; variant++) {
        struct tokenrace_llama_params q = p;
        if (variant == 1 || variant == 2) {
            q.dry_breaker_ids = variant == 1 ? one : three;
            q.dry_breaker_offsets = offsets;
            q.dry_breaker_count = 1;
        }
        if (variant == 3) {
            q.dry_penalty_last_n = 2;
        }
        struct llama_sampler *s = make(q);
        llama_sampler_accept(s, 3);
        llama_sampler_accept(s, 1);
        llama_sampler_accept(s, 3);
        int want = variant == 0 ? 3 : 1;
        CHECK(pick(s, NULL, VOCAB) == want);
        CHECK(pick(s, shuffled, VOCAB) == 3); /* 1 and 3 tie but in variant 0: the first given */
        CHECK(pick(s, without_3, 4) == (variant == 0 ? 2 : 1));
        struct llama_sampler *c = llama_sampler_clone(s);
        CHECK(pick(c, without_3, 4) == (variant == 0 ? 2 : 1));
        llama_sampler_free(c);
        llama_sampler_free(s);
    }
}

/* A seeded sequence draws token i from (seed, i): the same sequence again after a reset, in a
 * clone, and in another sampler with the same seed; another seed differs somewhere. */
static void seeded_sequences(void) {
    struct tokenrace_llama_params p = plain();
    p.seed = 42;
    struct llama_sampler *a = make(p), *b = make(p);
    int first[64];
    for (int i = 0; i < 64; i++) {
        first[i] = pick(a, NULL, VOCAB);
        llama_sampler_accept(a, first[i]);
        CHECK(pick(b, NULL, VOCAB) == first[i]);
        llama_sampler_accept(b, first[i]);
    }
    llama_sampler_reset(a);
    int differs = 0;
    struct llama_sampler *clone = NULL;
    for (int i = 0; i < 64; i++) {
        if (i == 32) {
            clone = llama_sampler_clone(a);
        }
        int t = pick(a, NULL, VOCAB);
        CHECK(t == first[i]);
        llama_sampler_accept(a, t);
        if (clone) {
            CHECK(pick(clone, NULL, VOCAB) == first[i]);
            llama_sampler_accept(clone, first[i]);
        }
    }
    /* tokenrace_llama_sample, from a context's logits in place: the same tokens as apply on
     * the candidates in id order, and it accepts them (the positions advance alike). */
    float logits[VOCAB];
    memcpy(logits, LOGITS, sizeof logits);
    struct llama_context ctx = {logits, VOCAB};
    struct llama_sampler *fast = make(p);
    for (int i = 0; i < 64; i++) {
        CHECK(tokenrace_llama_sample(fast, &ctx, -1) == first[i]);
    }
    llama_sampler_free(fast);
    p.seed = 43;
    struct llama_sampler *c = make(p);
    for (int i = 0; i < 64; i++) {
        int t = pick(c, NULL, VOCAB);
        differs |= t != first[i];
        llama_sampler_accept(c, t);
    }
    CHECK(differs);
    llama_sampler_free(a);
    llama_sampler_free(b);
    llama_sampler_free(clone);
    llama_sampler_free(c);
}

/* Pearson's chi-square of `counts` against probabilities `q`. */
static double chi_square(const int *counts, const double *q, int n, int draws) {
    double x2 = 0.0;
    for (int i = 0; i < n; i++) {
        double e = q[i] * draws;
        if (e > 0) {
            x2 += (counts[i] - e) * (counts[i] - e) / e;
        }
    }
    return x2;
}

/* llama.cpp's chain at T = 0.7 with top-k 4 and min-p 0.05 (filters at T = 1, then the
 * temperature): unseeded draws follow softmax(x / 0.7) over the kept tokens. The test's limit
 * (chi-square, 3 degrees of freedom: 16.3 is p = 0.001) must reject the same draws judged
 * against a sampler that forgot the temperature (the power check). */
static void distribution(void) {
    struct tokenrace_llama_params p = plain();
    p.temp = 0.7f;
    p.top_k = 4;
    p.min_p = 0.05f;
    struct llama_sampler *s = make(p);
    enum { DRAWS = 40000 };
    int counts[VOCAB] = {0};
    for (int i = 0; i < DRAWS; i++) {
        int t = pick(s, NULL, VOCAB);
        if (t >= 0) {
            counts[t]++;
        }
    }
    llama_sampler_free(s);
    /* Kept: the top 4 logits (3, 3, 2.5, 1); min-p 0.05 at T = 1 keeps x >= 3 + ln 0.05 = 0.0. */
    double q[VOCAB] = {0}, q_wrong[VOCAB] = {0}, z = 0.0, z_wrong = 0.0;
    for (int i = 0; i < VOCAB; i++) {
        int kept = i <= 3;
        q[i] = kept ? exp(LOGITS[i] / 0.7) : 0.0;
        q_wrong[i] = kept ? exp(LOGITS[i]) : 0.0;
        z += q[i];
        z_wrong += q_wrong[i];
    }
    for (int i = 0; i < VOCAB; i++) {
        q[i] /= z;
        q_wrong[i] /= z_wrong;
    }
    CHECK(counts[4] == 0 && counts[5] == 0);
    double x2 = chi_square(counts, q, VOCAB, DRAWS), x2_wrong = chi_square(counts, q_wrong, VOCAB, DRAWS);
    if (x2 >= 16.3 || x2_wrong < 16.3) {
        fprintf(stderr, "chi-square %.2f (limit 16.3), against T = 1: %.2f (must exceed it)\n", x2, x2_wrong);
    }
    CHECK(x2 < 16.3);
    CHECK(x2_wrong >= 16.3);
}

static void refused_parameters(void) {
    struct tokenrace_llama_params p = plain();
    p.temp = NAN;
    CHECK(tokenrace_llama_sampler_init(&p) == NULL);
    p = plain();
    p.penalty_repeat = 0.0f;
    CHECK(tokenrace_llama_sampler_init(&p) == NULL);
    p = plain();
    p.penalty_last_n = -2;
    CHECK(tokenrace_llama_sampler_init(&p) == NULL);
    p = plain();
    p.top_n_sigma = INFINITY;
    CHECK(tokenrace_llama_sampler_init(&p) == NULL);
    p = plain();
    p.dry_multiplier = -1.0f;
    CHECK(tokenrace_llama_sampler_init(&p) == NULL);
    p = plain();
    p.dry_penalty_last_n = -2;
    CHECK(tokenrace_llama_sampler_init(&p) == NULL);
    static const int32_t ids[1] = {2};
    static const uint64_t empty[2] = {0, 0};
    p = plain();
    p.dry_breaker_ids = ids;
    p.dry_breaker_offsets = empty;
    p.dry_breaker_count = 1;
    CHECK(tokenrace_llama_sampler_init(&p) == NULL);
}

/* llama.cpp's mirostat over LOGITS at temperature `t` (its f32 1/T), in double: which tokens it
 * keeps (ties with the last kept stay) and each kept token's surprise in bits in the kept set,
 * renormalised. v1 with llama.cpp's common m = 100 and n_vocab = VOCAB. */
static void mirostat_reference(int version, float t, double mu, int *kept, double *surprise) {
    double inv_t = (double)(1.0f / t), hi = -INFINITY, w[VOCAB], z = 0.0, sorted[VOCAB];
    for (int i = 0; i < VOCAB; i++) {
        hi = LOGITS[i] > hi ? LOGITS[i] : hi;
    }
    for (int i = 0; i < VOCAB; i++) {
        w[i] = exp(((double)LOGITS[i] - hi) * inv_t);
        z += w[i];
        sorted[i] = LOGITS[i];
    }
    for (int i = 0; i < VOCAB; i++) { /* descending */
        for (int j = i + 1; j < VOCAB; j++) {
            if (sorted[j] > sorted[i]) {
                double x = sorted[i];
                sorted[i] = sorted[j];
                sorted[j] = x;
            }
        }
    }
    double least = hi;
    if (version == 2) {
        for (int i = 0; i < VOCAB; i++) {
            if (-log2(w[i] / z) <= mu && LOGITS[i] < least) {
                least = LOGITS[i];
            }
        }
    } else {
        double tb = 0.0, tt = 0.0;
        for (int i = 0; i < VOCAB - 1; i++) {
            double ti = log((i + 2.0) / (i + 1.0));
            double bi = log(exp((sorted[i] - hi) * inv_t) / exp((sorted[i + 1] - hi) * inv_t));
            tb += ti * bi;
            tt += ti * ti;
        }
        double s_hat = tb / tt, e = s_hat - 1.0;
        double k = pow((e * pow(2.0, mu)) / (1.0 - pow((double)VOCAB, -e)), 1.0 / s_hat);
        int kk = (isnan(k) || k < 1.0) ? 1 : (k >= VOCAB ? VOCAB : (int)k);
        least = sorted[kk - 1];
    }
    double zk = 0.0;
    for (int i = 0; i < VOCAB; i++) {
        kept[i] = LOGITS[i] >= least;
        zk += kept[i] ? w[i] : 0.0;
    }
    for (int i = 0; i < VOCAB; i++) {
        surprise[i] = kept[i] ? -log2(w[i] / zk) : INFINITY;
    }
}

/* Mirostat v1 and v2: llama.cpp's common chain (the temperature, then mirostat; top-k and the
 * penalties set here are not applied); each drawn token lies in the reference's kept set and
 * the sequence's mu follows llama.cpp's update after every draw; reset restarts mu at 2 tau, a
 * clone keeps it; bad values are refused. */
static void mirostat(void) {
    for (int version = 1; version <= 2; version++) {
        struct tokenrace_llama_params p = plain();
        p.temp = 0.9f;
        p.top_k = 1;
        p.penalty_last_n = 8;
        p.penalty_repeat = 3.0f;
        p.mirostat = version;
        p.mirostat_tau = 1.5f;
        p.mirostat_eta = 0.3f;
        struct llama_sampler *s = make(p);
        struct tokenrace_llama_state *st = (struct tokenrace_llama_state *)s->ctx;
        CHECK(st->mirostat_mu == 3.0f);
        int seen[VOCAB] = {0};
        for (int step = 0; step < 300; step++) {
            double mu = st->mirostat_mu, surprise[VOCAB];
            int kept[VOCAB];
            mirostat_reference(version, p.temp, mu, kept, surprise);
            int t = pick(s, NULL, VOCAB);
            llama_sampler_accept(s, t);
            CHECK(t >= 0 && kept[t]);
            if (t < 0 || !kept[t]) {
                break;
            }
            seen[t] = 1;
            double want = mu - 0.3 * (surprise[t] - 1.5);
            if (fabs(st->mirostat_mu - want) > 1e-5 * (fabs(want) > 1.0 ? fabs(want) : 1.0)) {
                fprintf(stderr, "v%d step %d: mu %.9g, llama.cpp's %.9g\n", version, step, st->mirostat_mu, want);
                CHECK(0);
                break;
            }
        }
        /* Neither top-k 1 nor the penalties hold the draws to one token. */
        CHECK(seen[1] + seen[2] + seen[3] + seen[0] + seen[5] >= 2);
        struct llama_sampler *c = llama_sampler_clone(s);
        CHECK(((struct tokenrace_llama_state *)c->ctx)->mirostat_mu == st->mirostat_mu);
        llama_sampler_reset(s);
        CHECK(st->mirostat_mu == 3.0f);
        llama_sampler_free(c);
        llama_sampler_free(s);
    }
    struct tokenrace_llama_params p = plain();
    p.mirostat = 3;
    CHECK(tokenrace_llama_sampler_init(&p) == NULL);
    p = plain();
    p.mirostat = 2;
    p.mirostat_eta = NAN;
    CHECK(tokenrace_llama_sampler_init(&p) == NULL);
}

int main(void) {
    greedy_and_keep_one();
    penalties();
    dry();
    seeded_sequences();
    distribution();
    refused_parameters();
    mirostat();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("test_llama_adapter: ok\n");
    return 0;
}
