// include/tokenrace_llama.h against a real libllama (scripts/llama-check.sh builds it from
// llama.cpp's source): llama.cpp's own samplers and the adapter on the same candidates.
//
//   check:  greedy and penalties + greedy give the same tokens; each sampling chain's token lies
//           in the set llama.cpp's filters keep, and its draws follow llama.cpp's probabilities
//           over that set (chi-square); mirostat v1 and v2 keep llama.cpp's set and give its mu
//           at the same mu (within the documented differences; check_mirostat);
//   bench:  the time of one draw, llama.cpp's chain (its candidates filled from the logits, as
//           llama_sampler_sample does) against the fused call (tokenrace_draw on the logits),
//           the adapter's fast path (tokenrace_llama_draw_logits, what tokenrace_llama_sample
//           does besides accepting) and the adapter in a llama.cpp chain (candidates filled,
//           then copied into a row), the same logits, interleaved, one core.
//
//   llama_check check            exit status 1 on a failed check
//   llama_check bench VOCAB REPS
#include "llama.h"
#include "tokenrace.h"
#include "tokenrace_llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

// llama.cpp's DRY with breakers given as token ids (exported by libllama for its own tests).
struct llama_sampler *llama_sampler_init_dry_testing(float dry_multiplier, float dry_base, int32_t dry_allowed_length,
                                                     int32_t dry_penalty_last_n,
                                                     const std::vector<std::vector<llama_token>> &seq_breakers);

namespace {

int failures = 0;
#define EXPECT(cond, ...)                                   \
    do {                                                    \
        if (!(cond)) {                                      \
            std::fprintf(stderr, "FAILED %s: ", #cond);     \
            std::fprintf(stderr, __VA_ARGS__);              \
            std::fprintf(stderr, "\n");                     \
            failures++;                                     \
        }                                                   \
    } while (0)

// A model's usual row: N(0, 2) and a few logits near 15; `ties` rounds to a grid of 0.5.
std::vector<float> make_row(std::mt19937_64 &rng, int vocab, bool ties) {
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::vector<float> x(vocab);
    for (auto &v : x) {
        v = normal(rng);
        if (ties) v = std::round(v * 2.0f) / 2.0f;
    }
    std::uniform_int_distribution<int> at(0, vocab - 1);
    for (int i = 0; i < 3; i++) x[at(rng)] = 12.0f + normal(rng);
    return x;
}

void fill(std::vector<llama_token_data> &cur, const std::vector<float> &x) {
    cur.resize(x.size());
    for (size_t i = 0; i < x.size(); i++) cur[i] = llama_token_data{(llama_token)i, x[i], 0.0f};
}

// The token a sampler (chain) picks from the row.
llama_token pick(llama_sampler *s, std::vector<llama_token_data> &cur, const std::vector<float> &x) {
    fill(cur, x);
    llama_token_data_array arr{cur.data(), cur.size(), -1, false};
    llama_sampler_apply(s, &arr);
    return arr.selected >= 0 ? arr.data[arr.selected].id : -1;
}

struct Chain {
    float temp = 1.0f, top_p = 1.0f, min_p = 0.0f;
    int top_k = 0;
    int last_n = 0;
    float repeat = 1.0f, freq = 0.0f, present = 0.0f;
    float dry = 0.0f, dry_base = 1.75f;
    int dry_allowed = 2, dry_last_n = 1024;
    std::vector<std::vector<llama_token>> breakers;
    float xtc_p = 0.0f, xtc_t = 0.1f;
    float typical = 1.0f;
    std::string name;
    // Breakers flattened for the adapter and the fused call.
    std::vector<int32_t> breaker_ids;
    std::vector<uint64_t> breaker_offsets{0};
    void flatten() {
        breaker_ids.clear();
        breaker_offsets.assign(1, 0);
        for (const auto &b : breakers) {
            breaker_ids.insert(breaker_ids.end(), b.begin(), b.end());
            breaker_offsets.push_back(breaker_ids.size());
        }
    }
};

// llama.cpp's chain for `c` (common_sampler's order), with `tail` as its last sampler.
llama_sampler *llama_chain(const Chain &c, int vocab, llama_sampler *tail) {
    llama_sampler *s = llama_sampler_chain_init(llama_sampler_chain_default_params());
    if (c.last_n != 0)
        llama_sampler_chain_add(s, llama_sampler_init_penalties(vocab, c.last_n, c.repeat, c.freq, c.present));
    if (c.dry > 0.0f)
        llama_sampler_chain_add(s, llama_sampler_init_dry_testing(c.dry, c.dry_base, c.dry_allowed, c.dry_last_n,
                                                                  c.breakers));
    if (c.top_k > 0) llama_sampler_chain_add(s, llama_sampler_init_top_k(c.top_k));
    if (c.typical < 1.0f) llama_sampler_chain_add(s, llama_sampler_init_typical(c.typical, 1));
    if (c.top_p < 1.0f) llama_sampler_chain_add(s, llama_sampler_init_top_p(c.top_p, 1));
    if (c.min_p > 0.0f) llama_sampler_chain_add(s, llama_sampler_init_min_p(c.min_p, 1));
    if (c.xtc_p > 0.0f) llama_sampler_chain_add(s, llama_sampler_init_xtc(c.xtc_p, c.xtc_t, 1, 3));
    if (c.temp != 1.0f || tail == nullptr) llama_sampler_chain_add(s, llama_sampler_init_temp(c.temp));
    if (tail) llama_sampler_chain_add(s, tail);
    return s;
}

tokenrace_llama_params adapter_params(const Chain &c, uint32_t seed) {
    tokenrace_llama_params p = tokenrace_llama_params_default();
    p.temp = c.temp;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    p.penalty_last_n = c.last_n;
    p.penalty_repeat = c.repeat;
    p.penalty_freq = c.freq;
    p.penalty_present = c.present;
    p.seed = seed;
    p.dry_multiplier = c.dry;
    p.dry_base = c.dry_base;
    p.dry_allowed_length = c.dry_allowed;
    p.dry_penalty_last_n = c.dry_last_n;
    if (!c.breakers.empty()) {
        p.dry_breaker_ids = c.breaker_ids.data();
        p.dry_breaker_offsets = c.breaker_offsets.data();
        p.dry_breaker_count = c.breakers.size();
    }
    return p;
}

llama_sampler *adapter_chain(const Chain &c, uint32_t seed) {
    llama_sampler *s = llama_sampler_chain_init(llama_sampler_chain_default_params());
    tokenrace_llama_params p = adapter_params(c, seed);
    llama_sampler_chain_add(s, tokenrace_llama_sampler_init(&p));
    return s;
}

// Greedy, alone and after penalties, over sequences where each step's token is accepted by
// both chains: the same tokens.
void check_greedy(std::mt19937_64 &rng, int vocab) {
    for (bool ties : {false, true}) {
        for (int with_penalties = 0; with_penalties < 2; with_penalties++) {
            Chain c;
            c.temp = 0.0f;
            if (with_penalties) {
                c.last_n = 16;
                c.repeat = 1.3f;
                c.freq = 0.25f;
                c.present = 0.5f;
            }
            llama_sampler *ref = llama_chain(c, vocab, llama_sampler_init_greedy());
            llama_sampler *ours = adapter_chain(c, 7);
            std::vector<llama_token_data> cur;
            // One row for the whole sequence, so that the penalties decide every step.
            std::vector<float> x = make_row(rng, vocab, ties);
            int same = 0, steps = 200;
            for (int i = 0; i < steps; i++) {
                llama_token a = pick(ref, cur, x), b = pick(ours, cur, x);
                same += a == b;
                if (a != b) std::fprintf(stderr, "greedy%s step %d: llama %d, tokenrace %d\n",
                                         with_penalties ? "+penalties" : "", i, a, b);
                llama_sampler_accept(ref, a);
                llama_sampler_accept(ours, a);
            }
            EXPECT(same == steps, "greedy (ties %d, penalties %d): %d of %d the same", ties, with_penalties, same,
                   steps);
            llama_sampler_free(ref);
            llama_sampler_free(ours);
        }
    }
    std::printf("check greedy: ok\n");
}

// DRY, alone and after penalties, greedy, over sequences where each step's token is accepted by
// both chains: the same tokens. A row whose few top tokens are close, so that DRY's penalties
// reorder them as the sequence repeats; with breakers (one of one token, one of two), and with
// the candidates cut and sorted by llama.cpp's top-k before the adapter (its by-id path).
void check_dry_greedy(std::mt19937_64 &rng, int vocab) {
    for (int variant = 0; variant < 4; variant++) {
        Chain c;
        c.temp = 0.0f;
        c.dry = 0.8f;
        c.dry_base = 1.5f;
        c.dry_allowed = variant == 3 ? 1 : 2;
        c.dry_last_n = variant == 2 ? 24 : 1024;
        std::vector<float> x = make_row(rng, vocab, false);
        std::vector<int> order(vocab);
        for (int i = 0; i < vocab; i++) order[i] = i;
        std::partial_sort(order.begin(), order.begin() + 6, order.end(), [&](int a, int b) { return x[a] > x[b]; });
        for (int j = 0; j < 6; j++) x[order[j]] = 10.0f - 0.3f * j;
        if (variant >= 1) {
            c.breakers = {{order[2]}, {order[4], order[0]}};
            c.flatten();
        }
        if (variant == 1) {
            c.last_n = 32;
            c.repeat = 1.2f;
        }
        llama_sampler *ref = llama_chain(c, vocab, llama_sampler_init_greedy());
        llama_sampler *ours = llama_sampler_chain_init(llama_sampler_chain_default_params());
        if (variant == 2) llama_sampler_chain_add(ours, llama_sampler_init_top_k(1000));
        tokenrace_llama_params p = adapter_params(c, 7);
        llama_sampler_chain_add(ours, tokenrace_llama_sampler_init(&p));
        std::vector<llama_token_data> cur;
        int same = 0, steps = 300, distinct = 0;
        std::vector<int> seen(vocab, 0);
        for (int i = 0; i < steps; i++) {
            llama_token a = pick(ref, cur, x), b = pick(ours, cur, x);
            same += a == b;
            distinct += seen[a]++ == 0;
            if (a != b) std::fprintf(stderr, "dry variant %d step %d: llama %d, tokenrace %d\n", variant, i, a, b);
            llama_sampler_accept(ref, a);
            llama_sampler_accept(ours, a);
        }
        EXPECT(same == steps, "dry greedy variant %d: %d of %d the same", variant, same, steps);
        EXPECT(distinct >= 3, "dry greedy variant %d: DRY moved greedy to only %d tokens", variant, distinct);
        llama_sampler_free(ref);
        llama_sampler_free(ours);
    }
    std::printf("check dry greedy: ok\n");
}

// Judges `draws` draws (`counts` per token, `outside` of them outside the kept set) against the
// probabilities `q` (chi-square at p = 1e-4, tokens with an expected count below 5 pooled into
// one cell), and, for the power check, against `q_wrong`, which must fail.
void judge_draws(const std::string &name, const std::vector<int> &counts, int draws, int outside, size_t kept,
                 const std::vector<double> &q, const std::vector<double> &q_wrong) {
    const int vocab = (int)counts.size();
    auto chi_square = [&](const std::vector<double> &p, int &cells) {
        double x2 = 0.0, pooled_e = 0.0, pooled_n = 0.0;
        cells = 0;
        for (int i = 0; i < vocab; i++) {
            double e = p[i] * draws;
            if (e == 0.0) continue;
            if (e < 5.0) {
                pooled_e += e;
                pooled_n += counts[i];
                continue;
            }
            x2 += (counts[i] - e) * (counts[i] - e) / e;
            cells++;
        }
        if (pooled_e > 0.0) {
            x2 += (pooled_n - pooled_e) * (pooled_n - pooled_e) / pooled_e;
            cells++;
        }
        return x2;
    };
    int cells = 0, cells_wrong = 0;
    double x2 = chi_square(q, cells);
    double x2_wrong = chi_square(q_wrong, cells_wrong);
    // Wilson-Hilferty: the chi-square quantile at p = 1e-4 for cells - 1 degrees of freedom.
    double k = std::max(cells - 1, 1), zq = 3.719;
    double limit = k * std::pow(1.0 - 2.0 / (9.0 * k) + zq * std::sqrt(2.0 / (9.0 * k)), 3.0);
    EXPECT(outside == 0, "%s: %d draws outside llama.cpp's kept set (%zu tokens)", name.c_str(), outside, kept);
    EXPECT(x2 < limit, "%s: chi-square %.1f over %d cells, limit %.1f", name.c_str(), x2, cells, limit);
    EXPECT(x2_wrong >= limit, "%s: the power check: %.1f against a wrong temperature, under the limit %.1f",
           name.c_str(), x2_wrong, limit);
    std::printf("check %-24s kept %6zu  chi-square %8.1f  limit %8.1f  (%d cells)  wrong T: %9.1f\n", name.c_str(),
                kept, x2, limit, cells, x2_wrong);
}

// A sampling chain: the kept set is llama.cpp's (the chain without dist leaves the kept
// candidates), and the adapter's draws follow softmax over it (chi-square over the kept tokens
// with an expected count of at least 5; a draw outside the set fails at once).
void check_sampling(std::mt19937_64 &rng, int vocab, const Chain &c) {
    // A flat row, N(0, 1.5): many tokens carry mass (and, as floats drawn at random, none tie at
    // a filter's boundary, where llama.cpp's top-k keeps exactly k and tokenrace every tie).
    std::normal_distribution<float> normal(0.0f, 1.5f);
    std::vector<float> x(vocab);
    for (auto &v : x) v = normal(rng);
    // With DRY: a history repeating the row's top tokens, so that DRY moves mass that counts.
    std::vector<llama_token> history;
    if (c.dry > 0.0f) {
        std::vector<int> order(vocab);
        for (int i = 0; i < vocab; i++) order[i] = i;
        std::partial_sort(order.begin(), order.begin() + 8, order.end(), [&](int a, int b) { return x[a] > x[b]; });
        for (int j : {0, 1, 2, 3, 5, 0, 1, 2, 4, 6, 0, 1, 2}) history.push_back(order[j]);
    }
    llama_sampler *filters = llama_chain(c, vocab, nullptr);
    for (llama_token t : history) llama_sampler_accept(filters, t);
    std::vector<llama_token_data> cur;
    fill(cur, x);
    llama_token_data_array arr{cur.data(), cur.size(), -1, false};
    llama_sampler_apply(filters, &arr);
    // llama.cpp's probabilities over its kept set, and, for the power check, those of a sampler
    // whose temperature is 1.25 times too high.
    std::vector<double> q(vocab, 0.0), q_wrong(vocab, 0.0);
    double m = -INFINITY, z = 0.0, z_wrong = 0.0;
    for (size_t i = 0; i < arr.size; i++) m = std::max(m, (double)arr.data[i].logit);
    for (size_t i = 0; i < arr.size; i++) {
        double a = (double)arr.data[i].logit - m;
        q[arr.data[i].id] = std::exp(a);
        q_wrong[arr.data[i].id] = std::exp(a / 1.25);
        z += q[arr.data[i].id];
        z_wrong += q_wrong[arr.data[i].id];
    }
    for (int i = 0; i < vocab; i++) {
        q[i] /= z;
        q_wrong[i] /= z_wrong;
    }
    llama_sampler_free(filters);

    llama_sampler *ours = adapter_chain(c, LLAMA_DEFAULT_SEED);
    for (llama_token t : history) llama_sampler_accept(ours, t);
    const int draws = 20000;
    std::vector<int> counts(vocab, 0);
    int outside = 0;
    for (int i = 0; i < draws; i++) {
        llama_token t = pick(ours, cur, x);
        if (t < 0 || q[t] == 0.0) outside++;
        else counts[t]++;
    }
    llama_sampler_free(ours);
    judge_draws(c.name, counts, draws, outside, arr.size, q, q_wrong);
}

// llama.cpp's mirostat state, as src/llama-sampler.cpp lays out llama_sampler_mirostat and
// llama_sampler_mirostat_v2 (the members before the generator): the check sets mu through it,
// so that llama.cpp and tokenrace judge the same mu at every step. mirostat_mu_of checks the
// layout against the parameters the sampler was made with before handing out mu.
struct llama_mirostat_view {
    int32_t n_vocab;
    uint32_t seed, seed_cur;
    float tau, eta;
    int32_t m;
    float mu;
};
struct llama_mirostat_v2_view {
    uint32_t seed, seed_cur;
    float tau, eta;
    float mu;
};

struct Mirostat {
    std::string name;
    int version = 2;
    float tau = 5.0f, eta = 0.1f;
    int m = 100;
    float temp = 1.0f;
    bool flat = false, ties = false;
};

float *mirostat_mu_of(llama_sampler *s, const Mirostat &c, int vocab, uint32_t seed) {
    if (c.version == 1) {
        auto *v = (llama_mirostat_view *)s->ctx;
        bool same = v->n_vocab == vocab && v->seed == seed && v->tau == c.tau && v->eta == c.eta && v->m == c.m &&
                    v->mu == 2.0f * c.tau;
        return same ? &v->mu : nullptr;
    }
    auto *v = (llama_mirostat_v2_view *)s->ctx;
    bool same = v->seed == seed && v->tau == c.tau && v->eta == c.eta && v->mu == 2.0f * c.tau;
    return same ? &v->mu : nullptr;
}

// One mirostat draw of the fused call on row `x` with mu in: the token and mu out (with `tau`
// and `eta` in place of the configuration's, for kept_by_probe).
bool fused_mirostat(tokenrace_sampler *sampler, const std::vector<float> &x, const Mirostat &c, float mu,
                    uint64_t seed, uint64_t offset, int32_t &token, float &mu_out, float tau_in, float eta_in) {
    float temp = c.temp, tau = tau_in, eta = eta_in;
    int32_t version = c.version, m = c.m;
    tokenrace_batch b;
    std::memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.dtype = TOKENRACE_DTYPE_F32;
    b.logits = x.data();
    b.rows = 1;
    b.vocab = (uint32_t)x.size();
    b.temperature = &temp;
    b.seeds = &seed;
    b.offsets = &offset;
    b.mirostat = &version;
    b.mirostat_tau = &tau;
    b.mirostat_eta = &eta;
    b.mirostat_m = &m;
    b.mirostat_mu = &mu;
    tokenrace_output o;
    std::memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.tokens = &token;
    o.mirostat_mu = &mu_out;
    if (tokenrace_draw(sampler, &b, &o) != TOKENRACE_STATUS_OK) {
        std::fprintf(stderr, "%s: %s\n", c.name.c_str(), tokenrace_last_error());
        failures++;
        return false;
    }
    return true;
}

bool fused_mirostat(tokenrace_sampler *sampler, const std::vector<float> &x, const Mirostat &c, float mu,
                    uint64_t seed, uint64_t offset, int32_t &token, float &mu_out) {
    return fused_mirostat(sampler, x, c, mu, seed, offset, token, mu_out, c.tau, c.eta);
}

// The row in float64 as both samplers see it: ids sorted by scaled value, descending, their
// weights exp((x - max) / T) and the weights' prefix sums.
struct Sorted {
    std::vector<int> ids;
    std::vector<double> z, w, prefix;
    std::vector<int> rank;
    Sorted(const std::vector<float> &x, float temp) : ids(x.size()), z(x.size()), w(x.size()), prefix(x.size() + 1),
                                                      rank(x.size()) {
        for (size_t i = 0; i < x.size(); i++) ids[i] = (int)i;
        std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return x[a] > x[b]; });
        const double inv_t = (double)(1.0f / temp);
        prefix[0] = 0.0;
        for (size_t i = 0; i < x.size(); i++) {
            z[i] = ((double)x[ids[i]] - (double)x[ids[0]]) * inv_t;
            w[i] = std::exp(z[i]);
            prefix[i + 1] = prefix[i] + w[i];
            rank[ids[i]] = (int)i;
        }
    }
};

// v1's k in float64 over the sorted row (docs/semantics.md, Mirostat).
double mirostat_k(const Sorted &r, const Mirostat &c, float mu) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i + 1 < (size_t)c.m && i + 1 < r.w.size(); i++) {
        double t = std::log((i + 2.0) / (i + 1.0));
        num += t * (r.z[i] - r.z[i + 1]);
        den += t * t;
    }
    double s_hat = num / den, e = s_hat - 1.0;
    return std::pow(e * std::exp2((double)mu) / (1.0 - std::pow((double)r.w.size(), -e)), 1.0 / s_hat);
}

// The most llama.cpp's f32 surprise -log2 p can be off, in bits, when its softmax sums n
// candidates in f32: the sum's relative error bound (n - 1) 2^-24, then a few ulps of f32
// arithmetic around `mu` (expf, the division, log2f).
double llama_surprise_error(size_t n, float mu) {
    return ((double)n * std::ldexp(1.0, -24) + 1e-6) / std::log(2.0) +
           4.0 * (std::nextafter(std::fabs(mu), INFINITY) - std::fabs(mu));
}

struct MirostatTally {
    int steps = 0, same_count = 0, within_resolution = 0, ties = 0, boundary = 0, k_overflow = 0, unexplained = 0,
        same_token = 0, searched = 0,
        not_found = 0, adapter_same = 0;
    size_t kept_min = SIZE_MAX, kept_max = 0;
    double mu_diff_max = 0.0, mu_limit_max = 0.0;
};

// The weight of the set tokenrace keeps at `mu`, read back from its mu out: the kept set depends
// on mu alone (not on tau or eta), and a seeded draw's token on the kept set, so a draw with the
// same seed and offset draws `token` again, here with tau and eta chosen to make mu out precise:
// mu' = mu - eta (s - tau) with eta = 1e4 and tau the surprise `token` has in the `guess` most
// probable tokens, so that mu' is mu plus 1e4 times the error of the guess, and
// s = tau + (mu - mu') / eta is known to about 1e-10 bits. The kept set's weight is then
// w_token 2^s; `consistent(n)` says whether the n most probable tokens weigh that.
struct KeptProbe {
    double log_z = NAN, err = 0.0;
    bool consistent(const Sorted &r, size_t n) const {
        return n >= 1 && n < r.prefix.size() && std::fabs(std::log(r.prefix[n]) - log_z) <= 2.0 * err;
    }
    // The n whose weight is nearest, or -1 when a neighbour is consistent too.
    long nearest(const Sorted &r) const {
        size_t best = 1;
        for (size_t n = 1; n < r.prefix.size(); n++)
            if (std::fabs(std::log(r.prefix[n]) - log_z) < std::fabs(std::log(r.prefix[best]) - log_z)) best = n;
        if (!consistent(r, best) || consistent(r, best - 1) || consistent(r, best + 1)) return -1;
        return (long)best;
    }
};

KeptProbe kept_by_probe(tokenrace_sampler *sampler, const std::vector<float> &x, const Sorted &r, const Mirostat &c,
                        float mu, uint64_t seed, uint64_t offset, int32_t token, size_t guess) {
    const float eta = 1e4f;
    const double w_token = r.w[r.rank[token]];
    const float tau = (float)(-std::log2(w_token / r.prefix[guess]));
    int32_t again = -1;
    float mu_out = NAN;
    KeptProbe probe;
    if (!fused_mirostat(sampler, x, c, mu, seed, offset, again, mu_out, tau, eta)) return probe;
    EXPECT(again == token, "%s: the probe drew %d, not %d: the kept set depends on tau or eta", c.name.c_str(),
           again, token);
    const double s = (double)tau + ((double)mu - (double)mu_out) / eta;
    probe.log_z = std::log(w_token) + s * std::log(2.0);
    // mu' is rounded to f32: half an ulp of it, over eta, in nats; and the float64 sums.
    probe.err = 0.5 * (std::nextafter(std::fabs(mu_out), INFINITY) - std::fabs(mu_out)) / eta * std::log(2.0) + 1e-12;
    return probe;
}

// Mirostat v1/v2 against llama.cpp's chain (temperature, then llama_sampler_init_mirostat or
// _v2, common's mirostat chain), over `steps` rows, both at the same mu each step (llama.cpp's
// mu is set to tokenrace's, which follows tokenrace's own draws):
//   - the kept set: llama.cpp's (the candidates its apply leaves) against tokenrace's (read
//     back from its mu out, kept_by_probe); every tokenrace token lies in llama.cpp's set;
//   - mu out for the same token (where the kept sets agree): tokenrace's draw at other offsets
//     until it picks llama.cpp's token, then both mu out;
//   - the adapter (m = 100, what it passes): token and mu out bit-identical to the fused call;
//   - at two steps, 20,000 draws at that mu against llama.cpp's kept probabilities.
void check_mirostat(std::mt19937_64 &rng, int vocab, const Mirostat &c, int steps) {
    const uint32_t llama_seed = 1234;
    const uint64_t seed = 77, search_seed = 78, chi_seed = 79;
    llama_sampler *ref = llama_sampler_chain_init(llama_sampler_chain_default_params());
    llama_sampler_chain_add(ref, llama_sampler_init_temp(c.temp));
    llama_sampler_chain_add(ref, c.version == 1
                                     ? llama_sampler_init_mirostat(vocab, llama_seed, c.tau, c.eta, c.m)
                                     : llama_sampler_init_mirostat_v2(llama_seed, c.tau, c.eta));
    float *llama_mu = mirostat_mu_of(llama_sampler_chain_get(ref, 1), c, vocab, llama_seed);
    EXPECT(llama_mu != nullptr, "%s: llama.cpp's mirostat state is not laid out as this check reads it",
           c.name.c_str());
    if (!llama_mu) {
        llama_sampler_free(ref);
        return;
    }
    tokenrace_config cfg = tokenrace_config_default();
    cfg.max_rows = 1;
    cfg.threads = 1;
    cfg.greedy_below = FLT_MIN;
    cfg.filter_order = TOKENRACE_FILTER_ORDER_FILTERS_FIRST;
    tokenrace_sampler *sampler = nullptr;
    if (tokenrace_sampler_new(&cfg, &sampler) != TOKENRACE_STATUS_OK) {
        std::fprintf(stderr, "%s\n", tokenrace_last_error());
        failures++;
        llama_sampler_free(ref);
        return;
    }
    llama_sampler *adapter = nullptr;
    if (c.m == 100) {
        tokenrace_llama_params p = tokenrace_llama_params_default();
        p.temp = c.temp;
        p.mirostat = c.version;
        p.mirostat_tau = c.tau;
        p.mirostat_eta = c.eta;
        p.seed = (uint32_t)seed;
        adapter = tokenrace_llama_sampler_init(&p);
    }
    MirostatTally tally;
    std::normal_distribution<float> normal(0.0f, 1.5f);
    std::vector<llama_token_data> cur, adapter_cur;
    float mu = 2.0f * c.tau;
    int chi_checks = 0;
    for (int i = 0; i < steps; i++) {
        std::vector<float> x;
        if (c.flat) {
            x.resize(vocab);
            for (auto &v : x) v = normal(rng);
        } else {
            x = make_row(rng, vocab, c.ties);
        }
        const Sorted r(x, c.temp);
        // llama.cpp at tokenrace's mu: its kept set, token and mu out.
        *llama_mu = mu;
        fill(cur, x);
        llama_token_data_array arr{cur.data(), cur.size(), -1, false};
        llama_sampler_apply(ref, &arr);
        const llama_token a = arr.data[arr.selected].id;
        const float llama_mu_out = *llama_mu;
        const size_t kept = arr.size;
        std::vector<char> in_llama(vocab, 0);
        for (size_t j = 0; j < kept; j++) in_llama[arr.data[j].id] = 1;
        tally.kept_min = std::min(tally.kept_min, kept);
        tally.kept_max = std::max(tally.kept_max, kept);
        // tokenrace at the same mu.
        int32_t t = -1;
        float mu_out = NAN;
        if (!fused_mirostat(sampler, x, c, mu, seed, (uint64_t)i, t, mu_out)) break;
        if (adapter) {
            ((tokenrace_llama_state *)adapter->ctx)->mirostat_mu = mu;
            // Its own candidates: `arr` (llama.cpp's kept set) is read below.
            llama_token u = pick(adapter, adapter_cur, x);
            float adapter_mu = ((tokenrace_llama_state *)adapter->ctx)->mirostat_mu;
            bool same = u == t && std::memcmp(&adapter_mu, &mu_out, sizeof mu_out) == 0;
            tally.adapter_same += same;
            EXPECT(same, "%s step %d: the adapter drew %d (mu %.9g), the fused call %d (mu %.9g)", c.name.c_str(), i, u,
                   adapter_mu, t, mu_out);
            llama_sampler_accept(adapter, t);
        }
        // The kept sets: llama.cpp's size against the prefix tokenrace's mu out implies.
        const KeptProbe probe = kept_by_probe(sampler, x, r, c, mu, seed, (uint64_t)i, t, kept);
        const long ours = probe.nearest(r);
        const bool same_set = probe.consistent(r, kept) && ours == (long)kept;
        bool documented = false;
        if (same_set) {
            tally.same_count++;
        } else if (probe.consistent(r, kept)) {
            // llama.cpp's count weighs what tokenrace keeps, but so does a neighbouring count: the
            // tokens at the cut weigh less than mu out's resolution (about 1e-10 of the set).
            tally.within_resolution++;
        } else if (c.version == 1 && kept == 1 && mirostat_k(r, c, mu) > 2.2e9 && probe.consistent(r, r.w.size())) {
            // k past INT_MAX: llama.cpp's int(k) is undefined; on x86-64 it is INT_MIN, so
            // llama.cpp keeps one token, tokenrace every one.
            tally.k_overflow++;
            documented = true;
        } else if (ours < 0) {
            tally.unexplained++;
            EXPECT(false, "%s step %d: llama.cpp keeps %zu tokens, tokenrace's kept set weighs otherwise (mu %.9g)",
                   c.name.c_str(), i, kept, mu);
        } else {
            const size_t lo = std::min((size_t)ours, kept), hi = std::max((size_t)ours, kept);
            if (c.version == 1 && (size_t)ours > kept && r.z[ours - 1] == r.z[kept - 1]) {
                // Tokens tied with the k-th stay in tokenrace; llama.cpp's sort keeps k.
                tally.ties++;
                documented = true;
            } else if (c.version == 2) {
                // A cut may move where a surprise is within llama.cpp's f32 error of mu: its softmax
                // sums the row in f32 (a relative error up to (n - 1) 2^-24, n the candidates;
                // the terms under half an ulp of the sum are lost, so its p runs high).
                bool near = true;
                for (size_t j = lo; j < hi; j++)
                    near &= std::fabs(-std::log2(r.w[j] / r.prefix.back()) - mu) <=
                            llama_surprise_error(r.w.size(), mu);
                documented = near;
                tally.boundary += near;
            } else {
                double k = mirostat_k(r, c, mu);
                documented = std::fabs(k - std::round(k)) < 1e-3 * std::max(k, 1.0);
                tally.boundary += documented;
            }
            EXPECT(documented, "%s step %d: llama.cpp keeps %zu tokens, tokenrace %ld (mu %.9g)", c.name.c_str(), i,
                   kept, ours, mu);
        }
        EXPECT(in_llama[t] || documented, "%s step %d: tokenrace's token %d (rank %d) is not in llama.cpp's %zu",
               c.name.c_str(), i, t, r.rank[t], kept);
        // mu out for the same token, where the kept sets are the same (a tie or a boundary moves
        // the kept mass, and so the surprise): tokenrace at other offsets until it draws
        // llama.cpp's token (expected tries: the kept count; at most 4000).
        int32_t u = t;
        float mu_same = mu_out;
        if (same_set && t != a) {
            tally.searched++;
            u = -1;
            for (uint64_t j = 0; j < 4000 && u != a; j++)
                if (!fused_mirostat(sampler, x, c, mu, search_seed, (uint64_t)i * 4000 + j, u, mu_same)) break;
        }
        if (!same_set) {
            // Not compared.
        } else if (u == a) {
            tally.same_token++;
            double d = std::fabs((double)mu_same - (double)llama_mu_out);
            tally.mu_diff_max = std::max(tally.mu_diff_max, d);
            // llama.cpp sums its probabilities in f32, over the row and again over the kept set:
            // its surprise is off by at most llama_surprise_error of both; tokenrace's mu out is
            // float64 rounded once.
            const double limit = std::fabs(c.eta) * llama_surprise_error((size_t)vocab + kept, llama_mu_out);
            tally.mu_limit_max = std::max(tally.mu_limit_max, limit);
            EXPECT(d <= limit, "%s step %d: token %d: mu out %.9g, llama.cpp %.9g (limit %.3g)", c.name.c_str(), i, a,
                   mu_same, llama_mu_out, limit);
        } else {
            tally.not_found++;
        }
        // The distribution at this mu, twice per configuration, where the kept set has at least
        // 4 tokens (so that a wrong temperature moves the expected counts).
        if (same_set && chi_checks < 2 && i >= 5 + 40 * chi_checks && kept >= 4 && kept <= 4000) {
            chi_checks++;
            // llama.cpp's kept tokens, weighed in float64.
            std::vector<double> q(vocab, 0.0), q_wrong(vocab, 0.0);
            double zq = 0.0, zq_wrong = 0.0;
            for (size_t j = 0; j < kept; j++) {
                const int id = arr.data[j].id;
                q[id] = r.w[r.rank[id]];
                q_wrong[id] = std::exp(r.z[r.rank[id]] / 1.25);
                zq += q[id];
                zq_wrong += q_wrong[id];
            }
            for (int j = 0; j < vocab; j++) {
                q[j] /= zq;
                q_wrong[j] /= zq_wrong;
            }
            const int draws = 20000;
            std::vector<int> counts(vocab, 0);
            int outside = 0;
            for (int j = 0; j < draws; j++) {
                int32_t v = -1;
                float ignored;
                if (!fused_mirostat(sampler, x, c, mu, chi_seed, (uint64_t)i * draws + j, v, ignored)) break;
                if (v < 0 || !in_llama[v]) outside++;
                else counts[v]++;
            }
            judge_draws(c.name + " step " + std::to_string(i), counts, draws, outside, kept, q, q_wrong);
        }
        tally.steps++;
        mu = mu_out;
    }
    EXPECT(chi_checks >= 1, "%s: no step kept the same 4 to 4000 tokens for the chi-square", c.name.c_str());
    EXPECT(tally.same_token >= tally.same_count * 8 / 10, "%s: llama.cpp's token found in only %d of %d steps",
           c.name.c_str(), tally.same_token, tally.same_count);
    std::printf("check %-24s %d steps: llama.cpp kept %zu..%zu; the same kept set %d (%d more to mu out's resolution), "
                "tied with v1's k-th %d, k past "
                "INT_MAX %d, boundary %d, unexplained %d; mu out for llama.cpp's token %d (%d searched, %d not "
                "found), max |diff| %.3g (limit up to %.3g); adapter = fused %d%s\n",
                c.name.c_str(), tally.steps, tally.kept_min, tally.kept_max, tally.same_count, tally.within_resolution,
                tally.ties,
                tally.k_overflow, tally.boundary, tally.unexplained, tally.same_token, tally.searched,
                tally.not_found, tally.mu_diff_max, tally.mu_limit_max, tally.adapter_same,
                adapter ? "" : " (m is not the adapter's)");
    if (adapter) llama_sampler_free(adapter);
    tokenrace_sampler_free(sampler);
    llama_sampler_free(ref);
}

double seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// One draw of each way per round, interleaved, `reps` rounds: medians in microseconds.
void bench(int vocab, int reps) {
    std::vector<Chain> chains;
    auto add = [&](const char *name, std::function<void(Chain &)> set) {
        Chain c;
        c.name = name;
        set(c);
        chains.push_back(c);
    };
    add("greedy", [](Chain &c) { c.temp = 0.0f; });
    add("temp 0.8 + dist", [](Chain &c) { c.temp = 0.8f; });
    add("top-p 0.95", [](Chain &c) { c.temp = 0.8f; c.top_p = 0.95f; });
    add("min-p 0.05", [](Chain &c) { c.temp = 0.8f; c.min_p = 0.05f; });
    add("top-k 40 + top-p 0.95", [](Chain &c) { c.temp = 0.8f; c.top_k = 40; c.top_p = 0.95f; });
    add("llama.cpp defaults", [](Chain &c) { c.temp = 0.8f; c.top_k = 40; c.top_p = 0.95f; c.min_p = 0.05f; });
    add("penalties + defaults", [](Chain &c) {
        c.temp = 0.8f; c.top_k = 40; c.top_p = 0.95f; c.min_p = 0.05f;
        c.last_n = 64; c.repeat = 1.1f; c.freq = 0.1f; c.present = 0.1f;
    });
    add("dry + defaults", [](Chain &c) {
        c.temp = 0.8f; c.top_k = 40; c.top_p = 0.95f; c.min_p = 0.05f;
        c.dry = 0.8f; c.breakers = {{13}, {198}, {25, 26}}; c.flatten();
    });
    add("penalties + dry + defaults", [](Chain &c) {
        c.temp = 0.8f; c.top_k = 40; c.top_p = 0.95f; c.min_p = 0.05f;
        c.last_n = 64; c.repeat = 1.1f; c.freq = 0.1f; c.present = 0.1f;
        c.dry = 0.8f; c.breakers = {{13}, {198}, {25, 26}}; c.flatten();
    });
    add("dry + temp 0.8", [](Chain &c) {
        c.temp = 0.8f; c.dry = 0.8f; c.breakers = {{13}, {198}, {25, 26}}; c.flatten();
    });
    add("xtc + temp 0.8", [](Chain &c) { c.temp = 0.8f; c.xtc_p = 0.5f; c.xtc_t = 0.1f; });
    add("xtc + defaults", [](Chain &c) {
        c.temp = 0.8f; c.top_k = 40; c.top_p = 0.95f; c.min_p = 0.05f; c.xtc_p = 0.5f; c.xtc_t = 0.1f;
    });
    add("typical 0.95 + temp 0.8", [](Chain &c) { c.temp = 0.8f; c.typical = 0.95f; });
    add("typical + defaults", [](Chain &c) {
        c.temp = 0.8f; c.top_k = 40; c.top_p = 0.95f; c.min_p = 0.05f; c.typical = 0.95f;
    });
    // LLAMA_BENCH_ONLY=text keeps the chains whose name holds it (for a profile of one chain).
    if (const char *only = std::getenv("LLAMA_BENCH_ONLY")) {
        chains.erase(std::remove_if(chains.begin(), chains.end(),
                                    [&](const Chain &c) { return c.name.find(only) == std::string::npos; }),
                     chains.end());
    }
    std::mt19937_64 rng(11);
    std::vector<std::vector<float>> rows;
    for (int i = 0; i < 8; i++) rows.push_back(make_row(rng, vocab, false));
    std::vector<int32_t> history(64);
    for (auto &t : history) t = (int32_t)(rng() % vocab);
    // The history ends with a repeat of 24 of its tokens (DRY penalises the token after them).
    std::copy(history.begin() + 8, history.begin() + 32, history.begin() + 40);
    std::printf("# vocab %d, %d rounds, one draw each way a round, medians in us; llama.cpp's chain fills its\n"
                "# candidates from the logits (as llama_sampler_sample does), the fused call reads the logits\n",
                vocab, reps);
    std::printf("%-26s %10s %10s %10s %10s %9s %9s %9s\n", "chain", "llama.cpp", "fused", "sample", "in chain",
                "x fused", "x sample", "x chain");
    tokenrace_config cfg = tokenrace_config_default();
    cfg.max_rows = 1;
    cfg.threads = 1;
    cfg.greedy_below = FLT_MIN;
    cfg.filter_order = TOKENRACE_FILTER_ORDER_FILTERS_FIRST;
    tokenrace_sampler *sampler = nullptr;
    if (tokenrace_sampler_new(&cfg, &sampler) != TOKENRACE_STATUS_OK) {
        std::fprintf(stderr, "%s\n", tokenrace_last_error());
        failures++;
        return;
    }
    for (Chain &c : chains) {
        c.flatten();
        // The adapter has no XTC or typical sampling: its columns are left out for chains with them.
        const bool adapter = c.xtc_p == 0.0f && c.typical == 1.0f;
        llama_sampler *ref = llama_chain(c, vocab, c.temp > 0 ? llama_sampler_init_dist(1) : llama_sampler_init_greedy());
        llama_sampler *ours = adapter_chain(c, 1);
        tokenrace_llama_params ap = adapter_params(c, 1);
        llama_sampler *alone = tokenrace_llama_sampler_init(&ap);
        for (int32_t t : history) {
            llama_sampler_accept(ref, t);
            llama_sampler_accept(ours, t);
            llama_sampler_accept(alone, t);
        }
        std::vector<llama_token_data> cur;
        std::vector<double> t_ref, t_fused, t_adapter, t_sample;
        uint64_t out_offsets[2] = {0, history.size()};
        int sink = 0;
        for (int r = 0; r < reps; r++) {
            const std::vector<float> &x = rows[r % rows.size()];
            double t0 = seconds();
            sink += pick(ref, cur, x);
            double t1 = seconds();
            float temp = c.temp, top_p = c.top_p, min_p = c.min_p;
            int32_t top_k = c.top_k;
            tokenrace_batch b;
            std::memset(&b, 0, sizeof b);
            b.struct_size = sizeof b;
            b.dtype = TOKENRACE_DTYPE_F32;
            b.logits = x.data();
            b.rows = 1;
            b.vocab = (uint32_t)vocab;
            b.temperature = &temp;
            b.top_k = &top_k;
            b.top_p = &top_p;
            b.min_p = &min_p;
            if (c.last_n != 0 || c.dry > 0.0f) {
                b.output_ids = history.data();
                b.output_offsets = out_offsets;
            }
            if (c.last_n != 0) {
                b.repetition_penalty = &c.repeat;
                b.frequency_penalty = &c.freq;
                b.presence_penalty = &c.present;
            }
            uint64_t breaker_rows[2] = {0, c.breakers.size()};
            if (c.dry > 0.0f) {
                b.dry_multiplier = &c.dry;
                b.dry_base = &c.dry_base;
                b.dry_allowed_length = &c.dry_allowed;
                b.dry_penalty_last_n = &c.dry_last_n;
                b.dry_breaker_ids = c.breaker_ids.data();
                b.dry_breaker_offsets = c.breaker_offsets.data();
                b.dry_breakers_row_offsets = breaker_rows;
            }
            if (c.xtc_p > 0.0f) {
                b.xtc_probability = &c.xtc_p;
                b.xtc_threshold = &c.xtc_t;
            }
            if (c.typical < 1.0f) b.typical_p = &c.typical;
            int32_t token = -1;
            tokenrace_output o;
            std::memset(&o, 0, sizeof o);
            o.struct_size = sizeof o;
            o.tokens = &token;
            double t2 = seconds();
            if (tokenrace_draw(sampler, &b, &o) != TOKENRACE_STATUS_OK) failures++;
            double t3 = seconds();
            if (adapter) sink += token + pick(ours, cur, x);
            double t4 = seconds();
            if (adapter) sink += tokenrace_llama_draw_logits(alone, x.data(), vocab);
            double t5 = seconds();
            t_ref.push_back(t1 - t0);
            t_fused.push_back(t3 - t2);
            t_adapter.push_back(t4 - t3);
            t_sample.push_back(t5 - t4);
        }
        double a = median(t_ref) * 1e6, f = median(t_fused) * 1e6, d = median(t_adapter) * 1e6;
        double e = median(t_sample) * 1e6;
        if (adapter) {
            std::printf("%-26s %10.1f %10.1f %10.1f %10.1f %8.1fx %8.1fx %8.1fx\n", c.name.c_str(), a, f, e, d,
                        a / f, a / e, a / d);
        } else {
            std::printf("%-26s %10.1f %10.1f %10s %10s %8.1fx %9s %9s\n", c.name.c_str(), a, f, "-", "-", a / f, "-",
                        "-");
        }
        if (sink == 42) std::printf(" ");
        llama_sampler_free(ref);
        llama_sampler_free(ours);
        llama_sampler_free(alone);
    }
    tokenrace_sampler_free(sampler);
}

}  // namespace

int main(int argc, char **argv) {
    std::string mode = argc > 1 ? argv[1] : "check";
    if (mode == "bench") {
        bench(argc > 2 ? std::atoi(argv[2]) : 151936, argc > 3 ? std::atoi(argv[3]) : 200);
    } else {
        std::mt19937_64 rng(5);
        const int vocab = 32000;
        check_greedy(rng, vocab);
        Chain c;
        c.name = "temp 0.7";
        c.temp = 0.7f;
        check_sampling(rng, vocab, c);
        c.name = "top-k 40";
        c.top_k = 40;
        check_sampling(rng, vocab, c);
        c.top_k = 0;
        c.name = "top-p 0.9";
        c.top_p = 0.9f;
        check_sampling(rng, vocab, c);
        c.top_p = 1.0f;
        c.name = "min-p 0.1";
        c.min_p = 0.1f;
        check_sampling(rng, vocab, c);
        c.name = "top-k 40 + top-p + min-p";
        c.top_k = 40;
        c.top_p = 0.9f;
        c.min_p = 0.05f;
        check_sampling(rng, vocab, c);
        check_dry_greedy(rng, vocab);
        Chain d;
        d.name = "dry + temp 0.7";
        d.temp = 0.7f;
        d.dry = 1.5f;
        d.dry_allowed = 2;
        check_sampling(rng, vocab, d);
        d.name = "dry + breakers + top-p";
        d.top_p = 0.95f;
        d.breakers = {{7}, {11, 12}};
        d.flatten();
        check_sampling(rng, vocab, d);
        for (int version : {1, 2}) {
            for (int variant = 0; variant < 4; variant++) {
                Mirostat m;
                m.version = version;
                m.flat = variant == 1;
                m.ties = variant == 3 && version == 1;
                m.temp = variant == 2 ? 0.8f : 1.0f;
                if (variant == 2) {
                    m.tau = 3.0f;
                    m.eta = 0.5f;
                }
                if (variant == 3 && version == 2) {
                    m.tau = 8.0f;
                    m.eta = 0.3f;
                }
                if (variant == 3 && version == 1) m.m = 20;
                char name[64];
                std::snprintf(name, sizeof name, "mirostat v%d tau %g eta %g%s%s%s", version, m.tau, m.eta,
                              m.flat ? " flat" : "", m.ties ? " ties" : "", m.m != 100 ? " m 20" : "");
                m.name = name;
                check_mirostat(rng, vocab, m, 100);
            }
        }
    }
    if (failures) {
        std::fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    return 0;
}
