// include/tokenrace_llama.h against a real libllama (scripts/llama-check.sh builds it from
// llama.cpp's source): llama.cpp's own samplers and the adapter on the same candidates.
//
//   check:  greedy and penalties + greedy give the same tokens; each sampling chain's token lies
//           in the set llama.cpp's filters keep, and its draws follow llama.cpp's probabilities
//           over that set (chi-square);
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
    std::string name;
};

// llama.cpp's chain for `c` (common_sampler's order), with `tail` as its last sampler.
llama_sampler *llama_chain(const Chain &c, int vocab, llama_sampler *tail) {
    llama_sampler *s = llama_sampler_chain_init(llama_sampler_chain_default_params());
    if (c.last_n != 0)
        llama_sampler_chain_add(s, llama_sampler_init_penalties(vocab, c.last_n, c.repeat, c.freq, c.present));
    if (c.top_k > 0) llama_sampler_chain_add(s, llama_sampler_init_top_k(c.top_k));
    if (c.top_p < 1.0f) llama_sampler_chain_add(s, llama_sampler_init_top_p(c.top_p, 1));
    if (c.min_p > 0.0f) llama_sampler_chain_add(s, llama_sampler_init_min_p(c.min_p, 1));
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

// A sampling chain: the kept set is llama.cpp's (the chain without dist leaves the kept
// candidates), and the adapter's draws follow softmax over it (chi-square over the kept tokens
// with an expected count of at least 5; a draw outside the set fails at once).
void check_sampling(std::mt19937_64 &rng, int vocab, const Chain &c) {
    // A flat row, N(0, 1.5): many tokens carry mass (and, as floats drawn at random, none tie at
    // a filter's boundary, where llama.cpp's top-k keeps exactly k and tokenrace every tie).
    std::normal_distribution<float> normal(0.0f, 1.5f);
    std::vector<float> x(vocab);
    for (auto &v : x) v = normal(rng);
    llama_sampler *filters = llama_chain(c, vocab, nullptr);
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
    const int draws = 20000;
    std::vector<int> counts(vocab, 0);
    int outside = 0;
    for (int i = 0; i < draws; i++) {
        llama_token t = pick(ours, cur, x);
        if (t < 0 || q[t] == 0.0) outside++;
        else counts[t]++;
    }
    llama_sampler_free(ours);
    // Tokens with an expected count below 5 are pooled into one cell.
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
    EXPECT(outside == 0, "%s: %d draws outside llama.cpp's kept set (%zu tokens)", c.name.c_str(), outside,
           arr.size);
    EXPECT(x2 < limit, "%s: chi-square %.1f over %d cells, limit %.1f", c.name.c_str(), x2, cells, limit);
    EXPECT(x2_wrong >= limit, "%s: the power check: %.1f against a wrong temperature, under the limit %.1f",
           c.name.c_str(), x2_wrong, limit);
    std::printf("check %-24s kept %6zu  chi-square %8.1f  limit %8.1f  (%d cells)  wrong T: %9.1f\n",
                c.name.c_str(), arr.size, x2, limit, cells, x2_wrong);
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
    std::mt19937_64 rng(11);
    std::vector<std::vector<float>> rows;
    for (int i = 0; i < 8; i++) rows.push_back(make_row(rng, vocab, false));
    std::vector<int32_t> history(64);
    for (auto &t : history) t = (int32_t)(rng() % vocab);
    std::printf("# vocab %d, %d rounds, one draw each way a round, medians in us; llama.cpp's chain fills its\n"
                "# candidates from the logits (as llama_sampler_sample does), the fused call reads the logits\n",
                vocab, reps);
    std::printf("%-24s %10s %10s %10s %10s %9s %9s %9s\n", "chain", "llama.cpp", "fused", "sample", "in chain",
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
    for (const Chain &c : chains) {
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
            if (c.last_n != 0) {
                b.output_ids = history.data();
                b.output_offsets = out_offsets;
                b.repetition_penalty = &c.repeat;
                b.frequency_penalty = &c.freq;
                b.presence_penalty = &c.present;
            }
            int32_t token = -1;
            tokenrace_output o;
            std::memset(&o, 0, sizeof o);
            o.struct_size = sizeof o;
            o.tokens = &token;
            double t2 = seconds();
            if (tokenrace_draw(sampler, &b, &o) != TOKENRACE_STATUS_OK) failures++;
            double t3 = seconds();
            sink += token + pick(ours, cur, x);
            double t4 = seconds();
            sink += tokenrace_llama_draw_logits(alone, x.data(), vocab);
            double t5 = seconds();
            t_ref.push_back(t1 - t0);
            t_fused.push_back(t3 - t2);
            t_adapter.push_back(t4 - t3);
            t_sample.push_back(t5 - t4);
        }
        double a = median(t_ref) * 1e6, f = median(t_fused) * 1e6, d = median(t_adapter) * 1e6;
        double e = median(t_sample) * 1e6;
        std::printf("%-24s %10.1f %10.1f %10.1f %10.1f %8.1fx %8.1fx %8.1fx\n", c.name.c_str(), a, f, e, d, a / f,
                    a / e, a / d);
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
    }
    if (failures) {
        std::fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    return 0;
}
