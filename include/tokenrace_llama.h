/*
 * tokenrace_llama.h: a llama.cpp sampler (`llama_sampler_i`) that runs llama.cpp's usual chain,
 * penalties -> DRY -> top-nσ -> top-k -> top-p -> min-p -> temperature -> dist, as one fused
 * tokenrace draw. Header-only C (C99 or C++), no symbol of its own: include it in one
 * translation unit after llama.h and tokenrace.h.
 *
 *     #include "llama.h"
 *     #include "tokenrace.h"
 *     #include "tokenrace_llama.h"
 *
 *     struct tokenrace_llama_params p = tokenrace_llama_params_default();
 *     p.temp = 0.8f; p.top_k = 40; p.top_p = 0.95f; p.min_p = 0.05f; p.seed = 1234;
 *     p.penalty_last_n = 64; p.penalty_repeat = 1.1f;
 *     struct llama_sampler *chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
 *     llama_sampler_chain_add(chain, tokenrace_llama_sampler_init(&p));   // NULL: bad params
 *     ...
 *     llama_token t = llama_sampler_sample(chain, ctx, -1);             // accepts t, too
 *
 * or, faster, the sampler alone with tokenrace_llama_sample(smpl, ctx, -1), which draws from the
 * context's logits in place instead of the candidates llama_sampler_sample builds.
 *
 * One sampler per sequence, as llama.cpp's own: `accept` keeps the sequence's history (the
 * penalties' window) and its position (the offset of a seeded draw). The rules, parameter names
 * and disabled values are llama.cpp's (`docs/integration.md` lists every difference); the draw
 * is tokenrace's exact race (`docs/semantics.md`):
 *
 * - llama.cpp's default chain order: top-nσ, top-k, top-p, min-p (each at T = 1 on what the
 *   ones before it kept), then the temperature (`tokenrace_batch.order`);
 * - `temp <= 0`: the most probable token (the lowest id among equal logits);
 * - `top_k <= 0` off; `top_p >= 1` off, `top_p <= 0` keeps only the most probable token (as
 *   llama.cpp's min_keep = 1 does); `min_p <= 0` off, `min_p > 1` keeps only the most probable;
 *   `top_n_sigma <= 0` off;
 * - penalties over the last `penalty_last_n` accepted tokens (0: off, -1: every accepted token),
 *   repetition (`penalty_repeat`, 1 off), frequency and presence (`penalty_freq`,
 *   `penalty_present`, 0 off);
 * - DRY after the penalties, over the last `dry_penalty_last_n` accepted tokens (-1: all, 0:
 *   off), `dry_multiplier` (0 off), `dry_base` (< 1 off), `dry_allowed_length`, and the sequence
 *   breakers as token ids (`dry_breaker_ids`, `dry_breaker_offsets`, `dry_breaker_count`: breaker
 *   k is ids[offsets[k]..offsets[k + 1]], copied when the sampler is made); llama.cpp takes
 *   them as strings and tokenizes them, which a caller does with llama_tokenize;
 * - `mirostat` 1 or 2 (llama.cpp's mirostat v1, v2; `mirostat_tau`, `mirostat_eta`, and v1's m
 *   = 100 as llama.cpp's common code passes): the chain becomes llama.cpp's common mirostat
 *   chain, the temperature then mirostat (the filters, penalties and DRY are not applied, as
 *   there); the sequence's mu starts at 2 tau (at reset too) and is updated after each draw, as
 *   llama.cpp's sampler does in `apply`;
 * - `seed`: a seeded sequence draws token i from a pure function of (seed, i, logits), i the
 *   count of tokens accepted since the last reset; LLAMA_DEFAULT_SEED draws from tokenrace's own
 *   stream (seeded from OS entropy).
 *
 * The candidates may come in any order and be any subset of the vocabulary (samplers before
 * this one in the chain): the draw runs over the candidates as given, the history mapped onto
 * them. `apply` sets `cur_p->selected`; it leaves the candidates' logits and `p` as they were.
 */
#ifndef TOKENRACE_LLAMA_H
#define TOKENRACE_LLAMA_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* llama.cpp's sampling parameters that the fused draw honours (names as in llama.cpp's
 * `common_params_sampling`). */
struct tokenrace_llama_params {
    float temp;
    int32_t top_k;
    float top_p;
    float min_p;
    float top_n_sigma;
    int32_t penalty_last_n;
    float penalty_repeat;
    float penalty_freq;
    float penalty_present;
    uint32_t seed;
    /* Threads of the tokenrace sampler (1: the calling thread). */
    uint32_t threads;
    float dry_multiplier;
    float dry_base;
    int32_t dry_allowed_length;
    int32_t dry_penalty_last_n;
    /* DRY's sequence breakers as token ids (NULL: none); copied by tokenrace_llama_sampler_init. */
    const int32_t *dry_breaker_ids;
    const uint64_t *dry_breaker_offsets;
    size_t dry_breaker_count;
    /* llama.cpp's mirostat: 0 off, 1 v1, 2 v2; the target surprise (bits) and learning rate. */
    int32_t mirostat;
    float mirostat_tau;
    float mirostat_eta;
};

/* llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, no penalties, a
 * random seed. */
static inline struct tokenrace_llama_params tokenrace_llama_params_default(void) {
    struct tokenrace_llama_params p;
    p.temp = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.top_n_sigma = -1.0f;
    p.penalty_last_n = 64;
    p.penalty_repeat = 1.0f;
    p.penalty_freq = 0.0f;
    p.penalty_present = 0.0f;
    p.seed = LLAMA_DEFAULT_SEED;
    p.threads = 1;
    p.dry_multiplier = 0.0f;
    p.dry_base = 1.75f;
    p.dry_allowed_length = 2;
    p.dry_penalty_last_n = -1;
    p.dry_breaker_ids = NULL;
    p.dry_breaker_offsets = NULL;
    p.dry_breaker_count = 0;
    p.mirostat = 0;
    p.mirostat_tau = 5.0f;
    p.mirostat_eta = 0.1f;
    return p;
}

/* One sequence's sampler state. */
struct tokenrace_llama_state {
    /* The sampler's interface, set member by member: llama.cpp's struct grows (backend
     * sampling), and the members this header does not know stay NULL. */
    struct llama_sampler_i iface;
    struct tokenrace_llama_params params;
    struct tokenrace_sampler *sampler;
    /* The accepted tokens the penalties count: at most `penalty_last_n` of them are used. */
    int32_t *history;
    size_t history_len, history_cap;
    /* Tokens accepted since the last reset: the offset of the next seeded draw. */
    uint64_t position;
    /* Mirostat's mu: 2 tau at the start, updated after each draw. */
    float mirostat_mu;
    /* Per-call scratch: the candidates' logits, the history mapped onto candidate indices,
     * and the id -> candidate index map of candidates given out of id order. */
    float *row;
    int32_t *mapped;
    int32_t *index_of;
    size_t row_cap, mapped_cap, index_cap;
    /* The sampler's own copy of DRY's breakers (params.dry_breaker_* point into them), and the
     * breakers' row offsets of the one-row batch. */
    int32_t *breaker_ids;
    uint64_t *breaker_offsets;
    uint64_t breaker_rows[2];
    /* Per-call scratch: the breakers mapped onto a row's slots. */
    int32_t *breakers_mapped;
    size_t breakers_mapped_cap;
};

/* Whether DRY is on (llama.cpp's disabled values: multiplier 0, base < 1, window 0). */
static inline int tokenrace_llama_dry_on(const struct tokenrace_llama_params *p) {
    /* llama.cpp's mirostat chain (temperature, mirostat) has no DRY. */
    return p->mirostat == 0 && p->dry_multiplier != 0.0f && p->dry_base >= 1.0f && p->dry_penalty_last_n != 0;
}

/* The accepted tokens a draw reads: the longer of the two windows (penalties', DRY's); -1 for
 * every accepted token, 0 for none. */
static inline int64_t tokenrace_llama_kept_window(const struct tokenrace_llama_params *p) {
    int64_t penalties = p->penalty_last_n, dry = tokenrace_llama_dry_on(p) ? p->dry_penalty_last_n : 0;
    if (penalties < 0 || dry < 0) {
        return -1;
    }
    return penalties > dry ? penalties : dry;
}

/* Grows `*buf` to at least `n` elements of `size` bytes; 0 when out of memory. */
static inline int tokenrace_llama_grow(void **buf, size_t *cap, size_t n, size_t size) {
    if (n <= *cap) {
        return 1;
    }
    size_t want = *cap ? *cap : 64;
    while (want < n) {
        want *= 2;
    }
    void *p = realloc(*buf, want * size);
    if (!p) {
        return 0;
    }
    *buf = p;
    *cap = want;
    return 1;
}

/* Whether the parameters are ones llama.cpp accepts and tokenrace can honour (a message on
 * stderr names the first that is not). */
static inline int tokenrace_llama_params_valid(const struct tokenrace_llama_params *p) {
    const char *bad = NULL;
    if (isnan(p->temp) || isinf(p->temp)) {
        bad = "temp must be finite";
    } else if (isnan(p->top_p)) {
        bad = "top_p is NaN";
    } else if (isnan(p->min_p)) {
        bad = "min_p is NaN";
    } else if (!isfinite(p->top_n_sigma)) {
        bad = "top_n_sigma must be finite";
    } else if (p->penalty_last_n < -1) {
        bad = "penalty_last_n must be >= -1";
    } else if (!(isfinite(p->penalty_repeat) && p->penalty_repeat > 0.0f)) {
        bad = "penalty_repeat must be finite and > 0";
    } else if (!isfinite(p->penalty_freq) || !isfinite(p->penalty_present)) {
        bad = "penalty_freq and penalty_present must be finite";
    } else if (!(isfinite(p->dry_multiplier) && p->dry_multiplier >= 0.0f) || !isfinite(p->dry_base)) {
        bad = "dry_multiplier must be finite and >= 0, dry_base finite";
    } else if (p->dry_allowed_length < 0 || p->dry_penalty_last_n < -1) {
        bad = "dry_allowed_length must be >= 0 and dry_penalty_last_n >= -1";
    } else if (p->mirostat < 0 || p->mirostat > 2) {
        bad = "mirostat must be 0 (off), 1 (v1) or 2 (v2)";
    } else if (!isfinite(p->mirostat_tau) || !isfinite(p->mirostat_eta)) {
        bad = "mirostat_tau and mirostat_eta must be finite";
    } else if (p->dry_breaker_count && (!p->dry_breaker_ids || !p->dry_breaker_offsets)) {
        bad = "dry_breaker_count > 0 needs dry_breaker_ids and dry_breaker_offsets";
    } else if (p->dry_breaker_count) {
        for (size_t k = 0; k < p->dry_breaker_count && !bad; k++) {
            if (p->dry_breaker_offsets[k + 1] <= p->dry_breaker_offsets[k]) {
                bad = "each DRY sequence breaker holds at least one token";
            }
        }
        for (uint64_t j = 0; j < p->dry_breaker_offsets[p->dry_breaker_count] && !bad; j++) {
            if (p->dry_breaker_ids[j] < 0) {
                bad = "a DRY sequence breaker holds a negative token id";
            }
        }
    }
    if (bad) {
        fprintf(stderr, "tokenrace_llama_sampler_init: %s\n", bad);
        return 0;
    }
    return 1;
}

static inline struct tokenrace_sampler *tokenrace_llama_new_sampler(const struct tokenrace_llama_params *p) {
    struct tokenrace_config cfg = tokenrace_config_default();
    cfg.vocab_size = 0; /* candidates of any count */
    cfg.max_rows = 1;
    cfg.threads = p->threads;
    /* Only temp <= 0 is greedy (mapped to 0 below); any positive temperature samples. */
    cfg.greedy_below = FLT_MIN;
    cfg.filter_order = TOKENRACE_FILTER_ORDER_FILTERS_FIRST;
    struct tokenrace_sampler *s = NULL;
    if (tokenrace_sampler_new(&cfg, &s) != TOKENRACE_STATUS_OK) {
        fprintf(stderr, "tokenrace_llama_sampler_init: %s\n", tokenrace_last_error());
        return NULL;
    }
    return s;
}

static inline const char *tokenrace_llama_name(const struct llama_sampler *smpl) {
    (void)smpl;
    return "tokenrace";
}

static inline void tokenrace_llama_accept(struct llama_sampler *smpl, llama_token token) {
    struct tokenrace_llama_state *st = (struct tokenrace_llama_state *)smpl->ctx;
    st->position++;
    int64_t last_n = tokenrace_llama_kept_window(&st->params);
    if (last_n == 0) {
        return; /* penalties and DRY off: nothing to keep */
    }
    /* A window keeps its last n tokens: the history is cut back to them once it holds 2n. */
    if (last_n > 0 && st->history_len >= 2 * (size_t)last_n) {
        memmove(st->history, st->history + st->history_len - (size_t)(last_n - 1),
                (size_t)(last_n - 1) * sizeof(int32_t));
        st->history_len = (size_t)(last_n - 1);
    }
    if (!tokenrace_llama_grow((void **)&st->history, &st->history_cap, st->history_len + 1, sizeof(int32_t))) {
        fprintf(stderr, "tokenrace_llama: out of memory keeping the history; token dropped from it\n");
        return;
    }
    st->history[st->history_len++] = token;
}

/* The penalties' window of the history, as positions in the row drawn: token ids when the row
 * is in id order (`index_of` NULL), else through `index_of` (id -> candidate index, -1: not a
 * candidate; `max_id` its last id). Into st->mapped; returns its length, or -1 when out of
 * memory. */
static inline long tokenrace_llama_window(struct tokenrace_llama_state *st, size_t n, const int32_t *index_of,
                                          llama_token max_id) {
    int64_t last_n = tokenrace_llama_kept_window(&st->params);
    if (last_n == 0 || st->history_len == 0) {
        return 0;
    }
    size_t from = (last_n > 0 && st->history_len > (size_t)last_n) ? st->history_len - (size_t)last_n : 0;
    if (!tokenrace_llama_grow((void **)&st->mapped, &st->mapped_cap, st->history_len - from, sizeof(int32_t))) {
        return -1;
    }
    size_t m = 0;
    for (size_t j = from; j < st->history_len; j++) {
        int32_t t = st->history[j];
        /* A token that is not a candidate cannot be drawn: nothing to penalise. */
        int32_t at = !index_of ? ((t >= 0 && (size_t)t < n) ? t : -1) : ((t >= 0 && t <= max_id) ? index_of[t] : -1);
        if (at >= 0) {
            st->mapped[m++] = at;
        }
    }
    return (long)m;
}

/* The fused draw of one row of `n` logits with the sequence's parameters, position and the
 * `history` window positions in the row (`history_n` of them); the drawn index, or -1 (with a
 * message on stderr) when the call fails, which only a host out of memory makes it do (the
 * parameters were checked when the sampler was made). `breakers`: DRY's breakers as positions
 * in the row (laid out as st->breaker_offsets says). */
static inline int32_t tokenrace_llama_draw_row(struct tokenrace_llama_state *st, const float *row, size_t n,
                                               long history_n, const int32_t *breakers) {
    const struct tokenrace_llama_params *p = &st->params;
    if (n == 0 || n > UINT32_MAX) {
        fprintf(stderr, "tokenrace_llama: %zu candidates: a draw takes 1 to 2^32 - 1\n", n);
        return -1;
    }
    /* llama.cpp's "keep only the most probable" cases (top_p <= 0, min_p > 1) are top-k 1. */
    int keep_one = p->top_p <= 0.0f || p->min_p > 1.0f;
    /* llama.cpp's mirostat chain is the temperature then mirostat: no filter, no penalty. */
    int32_t mirostat = p->mirostat;
    float temp = p->temp > 0.0f ? p->temp : 0.0f;
    int32_t top_k = mirostat ? 0 : keep_one ? 1 : p->top_k;
    float top_p = (mirostat || keep_one || p->top_p >= 1.0f) ? 1.0f : p->top_p;
    float min_p = (mirostat || keep_one || p->min_p <= 0.0f) ? 0.0f : p->min_p;
    float nsigma = mirostat ? -1.0f : p->top_n_sigma;
    float mu_after = NAN;
    uint64_t seed = p->seed, offset = st->position;
    uint64_t output_offsets[2] = {0, (uint64_t)history_n};
    int penalised = !mirostat && history_n > 0 && p->penalty_last_n != 0 &&
                    (p->penalty_repeat != 1.0f || p->penalty_freq != 0.0f || p->penalty_present != 0.0f);
    int dry = history_n > 0 && tokenrace_llama_dry_on(p);
    /* The history holds the longer window; each reads its own (tokenrace's 0: all of it). */
    int32_t penalty_window = p->penalty_last_n > 0 ? p->penalty_last_n : 0;

    struct tokenrace_batch b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.dtype = TOKENRACE_DTYPE_F32;
    b.logits = row;
    b.rows = 1;
    b.vocab = (uint32_t)n;
    b.temperature = &temp;
    b.top_k = &top_k;
    b.top_p = &top_p;
    b.min_p = &min_p;
    b.top_n_sigma = &nsigma;
    /* llama.cpp's default chain (common's samplers "penalties;dry;top_n_sigma;top_k;typ_p;top_p;
     * min_p;xtc;temperature"): each filter on what the ones before it kept, then the temperature. */
    static const uint32_t chain_order[] = {TOKENRACE_STAGE_TOP_N_SIGMA, TOKENRACE_STAGE_TOP_K, TOKENRACE_STAGE_TOP_P,
                                           TOKENRACE_STAGE_MIN_P, TOKENRACE_STAGE_TEMPERATURE};
    b.order = chain_order;
    b.order_len = sizeof chain_order / sizeof chain_order[0];
    if (seed != LLAMA_DEFAULT_SEED) {
        b.seeds = &seed;
        b.offsets = &offset;
    }
    if (penalised || dry) {
        b.output_ids = st->mapped;
        b.output_offsets = output_offsets;
    }
    if (penalised) {
        b.repetition_penalty = &p->penalty_repeat;
        b.frequency_penalty = &p->penalty_freq;
        b.presence_penalty = &p->penalty_present;
        b.penalty_last_n = &penalty_window;
    }
    if (dry) {
        b.dry_multiplier = &p->dry_multiplier;
        b.dry_base = &p->dry_base;
        b.dry_allowed_length = &p->dry_allowed_length;
        b.dry_penalty_last_n = &p->dry_penalty_last_n;
        if (p->dry_breaker_count) {
            b.dry_breaker_ids = breakers;
            b.dry_breaker_offsets = st->breaker_offsets;
            b.dry_breakers_row_offsets = st->breaker_rows;
        }
    }
    int32_t token = -1;
    struct tokenrace_output o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.tokens = &token;
    if (mirostat) {
        /* n_vocab is the row's length: llama_sampler_sample's candidates are the vocabulary. */
        b.mirostat = &mirostat;
        b.mirostat_tau = &p->mirostat_tau;
        b.mirostat_eta = &p->mirostat_eta;
        b.mirostat_mu = &st->mirostat_mu;
        o.mirostat_mu = &mu_after;
    }
    if (tokenrace_draw(st->sampler, &b, &o) != TOKENRACE_STATUS_OK) {
        fprintf(stderr, "tokenrace_llama: %s\n", tokenrace_last_error());
        return -1;
    }
    if (mirostat) {
        st->mirostat_mu = mu_after;
    }
    return token;
}

/* A draw with DRY on: DRY matches sequences of token ids, so an accepted token that is not a
 * candidate must still break or extend a repeat. Candidates in id order that cover every id of
 * the history and breakers draw as they are; otherwise each id of the history and breakers
 * that is not a candidate gets a slot of its own after the candidates (-inf: never drawn), and
 * the history and breakers are mapped onto the slots (the candidates keep their order, and so
 * llama.cpp's tie rule). `st->row` holds the candidates' logits in the order given. Returns the
 * candidate index drawn, or -1 when out of memory. */
static inline int32_t tokenrace_llama_apply_dry(struct tokenrace_llama_state *st, const llama_token_data *d,
                                                size_t n, int out_of_order) {
    const struct tokenrace_llama_params *p = &st->params;
    uint64_t breaker_tokens = p->dry_breaker_count ? st->breaker_offsets[p->dry_breaker_count] : 0;
    llama_token max_id = (llama_token)n - 1;
    for (size_t i = 0; out_of_order && i < n; i++) {
        max_id = d[i].id > max_id ? d[i].id : max_id;
    }
    for (size_t j = 0; j < st->history_len; j++) {
        max_id = st->history[j] > max_id ? st->history[j] : max_id;
    }
    for (uint64_t j = 0; j < breaker_tokens; j++) {
        max_id = st->breaker_ids[j] > max_id ? st->breaker_ids[j] : max_id;
    }
    if (!out_of_order && (size_t)max_id < n) {
        long history_n = tokenrace_llama_window(st, n, NULL, 0);
        return history_n < 0 ? -1 : tokenrace_llama_draw_row(st, st->row, n, history_n, st->breaker_ids);
    }
    if (!tokenrace_llama_grow((void **)&st->index_of, &st->index_cap, (size_t)max_id + 1, sizeof(int32_t)) ||
        !tokenrace_llama_grow((void **)&st->breakers_mapped, &st->breakers_mapped_cap, (size_t)breaker_tokens,
                              sizeof(int32_t))) {
        return -1;
    }
    for (llama_token id = 0; id <= max_id; id++) {
        st->index_of[id] = -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (d[i].id >= 0) {
            st->index_of[d[i].id] = (int32_t)i;
        }
    }
    size_t len = n;
    for (size_t j = 0; j < st->history_len; j++) {
        if (st->index_of[st->history[j]] < 0) {
            st->index_of[st->history[j]] = (int32_t)len++;
        }
    }
    for (uint64_t j = 0; j < breaker_tokens; j++) {
        int32_t *at = &st->index_of[st->breaker_ids[j]];
        if (*at < 0) {
            *at = (int32_t)len++;
        }
        st->breakers_mapped[j] = *at;
    }
    if (!tokenrace_llama_grow((void **)&st->row, &st->row_cap, len, sizeof(float))) {
        return -1;
    }
    for (size_t i = n; i < len; i++) {
        st->row[i] = -INFINITY;
    }
    long history_n = tokenrace_llama_window(st, len, st->index_of, max_id);
    return history_n < 0 ? -1 : tokenrace_llama_draw_row(st, st->row, len, history_n, st->breakers_mapped);
}

/* The candidates as a row: their logits copied in the order given (llama.cpp's candidates are
 * (id, logit, p) records), the history mapped onto their positions. */
static inline void tokenrace_llama_apply(struct llama_sampler *smpl, llama_token_data_array *cur_p) {
    struct tokenrace_llama_state *st = (struct tokenrace_llama_state *)smpl->ctx;
    size_t n = cur_p->size;
    if (n == 0) {
        return;
    }
    if (!tokenrace_llama_grow((void **)&st->row, &st->row_cap, n, sizeof(float))) {
        fprintf(stderr, "tokenrace_llama: out of memory for %zu candidates\n", n);
        abort();
    }
    const llama_token_data *d = cur_p->data;
    uint32_t out_of_order = 0;
    for (size_t i = 0; i < n; i++) {
        st->row[i] = d[i].logit;
        out_of_order |= (uint32_t)d[i].id ^ (uint32_t)i;
    }
    const int32_t *index_of = NULL;
    llama_token max_id = 0;
    if (out_of_order) {
        for (size_t i = 0; i < n; i++) {
            max_id = d[i].id > max_id ? d[i].id : max_id;
        }
        if (!tokenrace_llama_grow((void **)&st->index_of, &st->index_cap, (size_t)max_id + 1, sizeof(int32_t))) {
            fprintf(stderr, "tokenrace_llama: out of memory for %zu candidates\n", n);
            abort();
        }
        for (llama_token id = 0; id <= max_id; id++) {
            st->index_of[id] = -1;
        }
        for (size_t i = 0; i < n; i++) {
            if (d[i].id >= 0) {
                st->index_of[d[i].id] = (int32_t)i;
            }
        }
        index_of = st->index_of;
    }
    int32_t token;
    if (tokenrace_llama_dry_on(&st->params)) {
        token = tokenrace_llama_apply_dry(st, d, n, out_of_order != 0);
    } else {
        long history_n = tokenrace_llama_window(st, n, index_of, max_id);
        token = history_n < 0 ? -1 : tokenrace_llama_draw_row(st, st->row, n, history_n, NULL);
    }
    if (token < 0) {
        /* llama.cpp's samplers have no error path: its own abort on what they cannot do. */
        abort();
    }
    cur_p->selected = token;
}

static inline void tokenrace_llama_reset(struct llama_sampler *smpl) {
    struct tokenrace_llama_state *st = (struct tokenrace_llama_state *)smpl->ctx;
    st->history_len = 0;
    st->position = 0;
    st->mirostat_mu = 2.0f * st->params.mirostat_tau;
}

static inline void tokenrace_llama_free_state(struct tokenrace_llama_state *st) {
    if (!st) {
        return;
    }
    tokenrace_sampler_free(st->sampler);
    free(st->history);
    free(st->row);
    free(st->mapped);
    free(st->index_of);
    free(st->breaker_ids);
    free(st->breaker_offsets);
    free(st->breakers_mapped);
    free(st);
}

static inline void tokenrace_llama_free(struct llama_sampler *smpl) {
    tokenrace_llama_free_state((struct tokenrace_llama_state *)smpl->ctx);
}

static inline struct llama_sampler *tokenrace_llama_make(const struct tokenrace_llama_params *params,
                                                         const struct tokenrace_llama_state *copy_from);

/* A clone keeps the history, position and mirostat's mu (a seeded clone draws what the original
 * would); an unseeded clone draws from a stream of its own. */
static inline struct llama_sampler *tokenrace_llama_clone(const struct llama_sampler *smpl) {
    const struct tokenrace_llama_state *st = (const struct tokenrace_llama_state *)smpl->ctx;
    return tokenrace_llama_make(&st->params, st);
}


static inline struct llama_sampler *tokenrace_llama_make(const struct tokenrace_llama_params *params,
                                                         const struct tokenrace_llama_state *copy_from) {
    if (!tokenrace_llama_params_valid(params)) {
        return NULL;
    }
    struct tokenrace_llama_state *st = (struct tokenrace_llama_state *)calloc(1, sizeof *st);
    if (!st) {
        return NULL;
    }
    st->params = *params;
    st->sampler = tokenrace_llama_new_sampler(params);
    if (!st->sampler) {
        free(st);
        return NULL;
    }
    size_t breakers = params->dry_breaker_count;
    if (breakers) {
        /* The breakers are copied, rebased to start at 0, so the caller's arrays may go. */
        uint64_t first = params->dry_breaker_offsets[0], tokens = params->dry_breaker_offsets[breakers] - first;
        st->breaker_ids = (int32_t *)malloc((size_t)tokens * sizeof(int32_t));
        st->breaker_offsets = (uint64_t *)malloc((breakers + 1) * sizeof(uint64_t));
        if (!st->breaker_ids || !st->breaker_offsets) {
            tokenrace_llama_free_state(st);
            return NULL;
        }
        memcpy(st->breaker_ids, params->dry_breaker_ids + first, (size_t)tokens * sizeof(int32_t));
        for (size_t k = 0; k <= breakers; k++) {
            st->breaker_offsets[k] = params->dry_breaker_offsets[k] - first;
        }
        st->breaker_rows[0] = 0;
        st->breaker_rows[1] = breakers;
        st->params.dry_breaker_ids = st->breaker_ids;
        st->params.dry_breaker_offsets = st->breaker_offsets;
    }
    if (copy_from && copy_from->history_len) {
        if (!tokenrace_llama_grow((void **)&st->history, &st->history_cap, copy_from->history_len, sizeof(int32_t))) {
            tokenrace_llama_free_state(st);
            return NULL;
        }
        memcpy(st->history, copy_from->history, copy_from->history_len * sizeof(int32_t));
        st->history_len = copy_from->history_len;
    }
    st->position = copy_from ? copy_from->position : 0;
    st->mirostat_mu = copy_from ? copy_from->mirostat_mu : 2.0f * params->mirostat_tau;
    memset(&st->iface, 0, sizeof st->iface);
    st->iface.name = tokenrace_llama_name;
    st->iface.accept = tokenrace_llama_accept;
    st->iface.apply = tokenrace_llama_apply;
    st->iface.reset = tokenrace_llama_reset;
    st->iface.clone = tokenrace_llama_clone;
    st->iface.free = tokenrace_llama_free;
    return llama_sampler_init(&st->iface, st);
}

/* A llama.cpp sampler running the fused draw with `params` (copied); NULL, with a message on
 * stderr, when a parameter cannot be honoured or a tokenrace sampler cannot be made. Free it as
 * any llama.cpp sampler (`llama_sampler_free`, or with the chain that holds it). */
static inline struct llama_sampler *tokenrace_llama_sampler_init(const struct tokenrace_llama_params *params) {
    return tokenrace_llama_make(params, NULL);
}

/* The token of a row of `n_vocab` logits (contiguous floats, indexed by token id), drawn as
 * `apply` would draw it from those logits as candidates in id order, without building the
 * candidates; it does not accept the token. -1 (and a message on stderr) only when the host is
 * out of memory. `smpl` must come from tokenrace_llama_sampler_init (not a chain). */
static inline llama_token tokenrace_llama_draw_logits(struct llama_sampler *smpl, const float *logits,
                                                      int32_t n_vocab) {
    struct tokenrace_llama_state *st = (struct tokenrace_llama_state *)smpl->ctx;
    if (n_vocab <= 0) {
        return -1;
    }
    long history_n = tokenrace_llama_window(st, (size_t)n_vocab, NULL, 0);
    return history_n < 0 ? -1 : tokenrace_llama_draw_row(st, logits, (size_t)n_vocab, history_n, st->breaker_ids);
}

#ifndef TOKENRACE_LLAMA_NO_CONTEXT
/* llama_sampler_sample for a sampler of tokenrace_llama_sampler_init: draws from the context's
 * logits of output `idx` in place (no candidates array: llama_sampler_sample builds one of the
 * whole vocabulary every token, which costs more than the draw) and accepts the token. Aborts,
 * as llama_sampler_sample does, on what it cannot do. */
static inline llama_token tokenrace_llama_sample(struct llama_sampler *smpl, struct llama_context *ctx,
                                                 int32_t idx) {
    const float *logits = llama_get_logits_ith(ctx, idx);
    int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx)));
    llama_token token = logits ? tokenrace_llama_draw_logits(smpl, logits, n_vocab) : -1;
    if (token < 0) {
        fprintf(stderr, "tokenrace_llama_sample: no token for output %d\n", idx);
        abort();
    }
    llama_sampler_accept(smpl, token);
    return token;
}
#endif

#ifdef __cplusplus
}
#endif

#endif /* TOKENRACE_LLAMA_H */
