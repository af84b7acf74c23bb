// The checks of the C++ wrapper, one body for both modes: test_cpp.cpp runs them on the linked
// library, test_cpp_dlopen.cpp on the library loaded with tokenrace::Library. Every check goes
// through the Library it is given, so the two runs differ only in how the functions are reached.
#pragma once
#include "tokenrace.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

namespace checks {

inline int failures = 0;

#define CHECK(cond)                                                                     \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);    \
      checks::failures++;                                                               \
    }                                                                                   \
  } while (0)

// `statement` must throw tokenrace::Error with `status` and a message containing `needle`.
#define CHECK_THROWS(statement, status, needle) \
  checks::expect_error([&] { statement; }, status, needle, __FILE__, __LINE__, #statement)

template <class Statement>
void expect_error(Statement statement, tokenrace_status status, const char* needle, const char* file, int line,
                  const char* text) {
  try {
    statement();
    std::fprintf(stderr, "%s:%d: %s: no exception\n", file, line, text);
  } catch (const tokenrace::Error& e) {
    if (e.status() == status && std::strstr(e.what(), needle)) return;
    std::fprintf(stderr, "%s:%d: %s: status %d, message \"%s\"; wanted status %d and \"%s\"\n", file, line, text,
                 int(e.status()), e.what(), int(status), needle);
  }
  failures++;
}

// ---- inputs ---------------------------------------------------------------------------------

// Deterministic logits k/8, k in [-32, 32]: exact in f32, bf16 and f16 alike.
inline std::vector<float> eighths(size_t n, uint32_t salt) {
  std::vector<float> v(n);
  uint32_t state = 2463534242u ^ salt;
  for (float& x : v) {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    x = float(int(state % 65) - 32) / 8.0f;
  }
  return v;
}

inline uint16_t to_bf16(float x) {  // exact for the values above: the top half of the f32
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return uint16_t(bits >> 16);
}

inline uint16_t to_f16(float x) {  // exact for normal values with 10 mantissa bits, and 0
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  if ((bits & 0x7fffffffu) == 0) return uint16_t(sign);
  const uint32_t exponent = ((bits >> 23) & 0xffu) - 127u + 15u;
  return uint16_t(sign | (exponent << 10) | ((bits >> 13) & 0x3ffu));
}

template <class T>
std::vector<T> iota_from(size_t n, T first, T step) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; i++) v[i] = T(first + T(i) * step);
  return v;
}

// ---- the float64 reference of docs/semantics.md (Filters, Logprobs) --------------------------

struct RowFilter {
  float temperature;
  int32_t top_k;
  float top_p;
  float min_p;
};

inline double inverse_temperature(float t) { return double(1.0f / t); }  // fl32(1/T), as the library

// The tokens the filters keep: min-p, then top-k, then top-p, each on what the previous kept.
inline std::vector<bool> reference_kept(const std::vector<float>& x, const RowFilter& f) {
  const size_t n = x.size();
  const double m = *std::max_element(x.begin(), x.end());
  std::vector<double> w(n);
  for (size_t i = 0; i < n; i++) w[i] = std::exp((x[i] - m) * inverse_temperature(f.temperature));
  std::vector<bool> kept(n, true);
  for (size_t i = 0; i < n; i++)
    if (w[i] < f.min_p) kept[i] = false;
  if (f.top_k > 0 && size_t(f.top_k) < n) {
    std::vector<float> kept_logits;
    for (size_t i = 0; i < n; i++)
      if (kept[i]) kept_logits.push_back(x[i]);
    std::sort(kept_logits.rbegin(), kept_logits.rend());
    if (kept_logits.size() > size_t(f.top_k))
      for (size_t i = 0; i < n; i++) kept[i] = kept[i] && x[i] >= kept_logits[f.top_k - 1];
  }
  if (f.top_p < 1.0f) {
    std::vector<size_t> order;
    double z = 0;
    for (size_t i = 0; i < n; i++)
      if (kept[i]) order.push_back(i), z += w[i];
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return w[a] > w[b]; });
    std::vector<bool> prefix(n, false);
    double mass = 0;
    for (size_t i : order) {
      prefix[i] = true;
      mass += w[i];
      if (mass >= f.top_p * z) break;
    }
    kept = prefix;
  }
  return kept;
}

// log_softmax of (x - m) * scale over `kept`, -inf elsewhere.
inline std::vector<double> reference_logprobs(const std::vector<float>& x, double scale,
                                              const std::vector<bool>& kept) {
  const double m = *std::max_element(x.begin(), x.end());
  double z = 0;
  for (size_t i = 0; i < x.size(); i++)
    if (kept[i]) z += std::exp((x[i] - m) * scale);
  std::vector<double> out(x.size(), -std::numeric_limits<double>::infinity());
  for (size_t i = 0; i < x.size(); i++)
    if (kept[i]) out[i] = (x[i] - m) * scale - std::log(z);
  return out;
}

inline bool logprob_close(double a, double b) { return std::isinf(a) ? a == b : std::fabs(a - b) <= 1e-5; }

// ---- the checks -----------------------------------------------------------------------------

inline void versions_and_levels(const tokenrace::Library& lib) {
  CHECK(lib.abi_version() == TOKENRACE_ABI_VERSION);
  CHECK(!lib.version().empty() && lib.version().find('.') != std::string::npos);
  const std::string level = lib.simd_level();
  CHECK(level == "avx512" || level == "avx2" || level == "portable" || level == "scalar");
}

// Every setter lands in its tokenrace_config / tokenrace_pool_config field, and the sampler
// runs with them.
inline void config_setters(const tokenrace::Library& lib) {
  const tokenrace_config c = tokenrace::Config()
                                 .vocab_size(64)
                                 .max_rows(7)
                                 .threads(1)
                                 .seed(5)
                                 .simd(TOKENRACE_SIMD_SCALAR)
                                 .greedy_below(0.01f)
                                 .log_level(TOKENRACE_LOG_LEVEL_ERROR)
                                 .noise(TOKENRACE_NOISE_SOURCE_INLINE)
                                 .pool_rows(32)
                                 .resolve(lib);
  CHECK(c.struct_size == sizeof c && c.vocab_size == 64 && c.max_rows == 7 && c.threads == 1);
  CHECK(c.seed == 5 && c.has_seed == 1 && c.simd == TOKENRACE_SIMD_SCALAR && c.greedy_below == 0.01f);
  CHECK(c.log_level == TOKENRACE_LOG_LEVEL_ERROR && c.noise == TOKENRACE_NOISE_SOURCE_INLINE && c.pool_rows == 32);
  const tokenrace_config defaults = lib.api().config_default();
  const tokenrace_config plain = tokenrace::Config().use_environment(false).resolve(lib);
  CHECK(std::memcmp(&defaults, &plain, sizeof plain) == 0);

  tokenrace::Sampler sampler(
      lib, tokenrace::Config().vocab_size(64).max_rows(7).simd(TOKENRACE_SIMD_SCALAR).greedy_below(0.01f));
  CHECK(sampler.simd_level() == "scalar" && sampler.config().max_rows == 7);
  std::vector<float> logits = eighths(2 * 64, 1);
  logits[5] = 9.0f;  // row 0's maximum, drawn greedily at T = 0.005 < greedy_below
  std::vector<int32_t> tokens(2);
  std::vector<uint32_t> flags(2);
  const std::vector<float> temps = {0.005f, 1.0f};
  sampler.draw(tokenrace::Logits::f32(logits.data(), 2, 64), tokenrace::DrawOptions().temperature(temps), tokens.data(),
               flags.data());
  CHECK(tokens[0] == 5 && (flags[0] & TOKENRACE_FLAG_GREEDY) && !(flags[1] & TOKENRACE_FLAG_GREEDY));

  const tokenrace_pool_config p = tokenrace::PoolConfig()
                                      .vocab_size(64)
                                      .rows(16)
                                      .kind(TOKENRACE_NOISE_KIND_EXP)
                                      .threads(2)
                                      .seed(9)
                                      .policy(TOKENRACE_POOL_POLICY_BLOCK)
                                      .timeout_ms(250)
                                      .resolve(lib);
  CHECK(p.vocab == 64 && p.rows == 16 && p.kind == TOKENRACE_NOISE_KIND_EXP && p.threads == 2);
  CHECK(p.seed == 9 && p.has_seed == 1 && p.policy == TOKENRACE_POOL_POLICY_BLOCK && p.timeout_ms == 250);
  const tokenrace_pool_config pool_defaults = lib.api().pool_config_default();
  const tokenrace_pool_config pool_plain = tokenrace::PoolConfig().use_environment(false).resolve(lib);
  CHECK(std::memcmp(&pool_defaults, &pool_plain, sizeof pool_plain) == 0);
}

// The per-row inputs of a draw, as arrays for the bare C call (null: off).
struct RowInputs {
  const float* temperature = nullptr;
  const uint64_t* seeds = nullptr;
  const uint64_t* offsets = nullptr;
  const int32_t* top_k = nullptr;
  const float* top_p = nullptr;
  const float* min_p = nullptr;
};

// A sampler made and driven through the bare function table, as a C caller would: the
// independent side of the comparisons below (nothing of the wrapper fills its batch).
struct api_sampler {
  explicit api_sampler(const tokenrace::Library& lib) : api(lib.api()) {
    tokenrace_config c = api.config_default();
    c.max_rows = 64;
    if (api.sampler_new(&c, &sampler) != TOKENRACE_STATUS_OK) sampler = nullptr;
    CHECK(sampler != nullptr);
  }
  ~api_sampler() { api.sampler_free(sampler); }
  api_sampler(const api_sampler&) = delete;
  api_sampler& operator=(const api_sampler&) = delete;

  std::vector<int32_t> draw(tokenrace_dtype dtype, const void* logits, uint32_t rows, uint32_t vocab,
                            const RowInputs& in) const {
    tokenrace_batch b;
    std::memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.dtype = dtype;
    b.logits = logits;
    b.rows = rows;
    b.vocab = vocab;
    b.temperature = in.temperature;
    b.seeds = in.seeds;
    b.offsets = in.offsets;
    b.top_k = in.top_k;
    b.top_p = in.top_p;
    b.min_p = in.min_p;
    std::vector<int32_t> tokens(rows, -1);
    tokenrace_output o;
    std::memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.tokens = tokens.data();
    CHECK(api.draw(sampler, &b, &o) == TOKENRACE_STATUS_OK);
    return tokens;
  }

  const tokenrace::Api& api;
  tokenrace_sampler* sampler = nullptr;
};

// The wrapper's draws are the C API's: the same seeded rows give the same tokens, for every
// dtype and with the filters, and f32, bf16 and f16 encodings of the same values agree.
inline void draws_equal_the_c_api(const tokenrace::Library& lib) {
  const uint32_t rows = 16, vocab = 1000;
  const std::vector<float> logits = eighths(size_t(rows) * vocab, 2);
  std::vector<uint16_t> bf16(logits.size()), f16(logits.size());
  std::transform(logits.begin(), logits.end(), bf16.begin(), to_bf16);
  std::transform(logits.begin(), logits.end(), f16.begin(), to_f16);
  std::vector<float> temps = iota_from<float>(rows, 0.6f, 0.05f);
  temps[3] = 0.0f;  // one greedy row
  const std::vector<uint64_t> seeds = iota_from<uint64_t>(rows, 101, 7), offsets = iota_from<uint64_t>(rows, 0, 1);
  const std::vector<int32_t> top_k = iota_from<int32_t>(rows, 0, 20);
  const std::vector<float> top_p = iota_from<float>(rows, 1.0f, -0.03f), min_p = iota_from<float>(rows, 0.0f, 0.01f);
  RowInputs plain_rows;
  plain_rows.temperature = temps.data(), plain_rows.seeds = seeds.data(), plain_rows.offsets = offsets.data();
  RowInputs filtered_rows = plain_rows;
  filtered_rows.top_k = top_k.data(), filtered_rows.top_p = top_p.data(), filtered_rows.min_p = min_p.data();

  const api_sampler raw(lib);
  tokenrace::Sampler sampler(lib, tokenrace::Config().max_rows(rows).seed(77));
  const tokenrace::DrawOptions plain = tokenrace::DrawOptions().temperature(temps).seeds(seeds).offsets(offsets);
  tokenrace::DrawOptions filtered = plain;
  filtered.top_k(top_k).top_p(top_p).min_p(min_p);

  const std::vector<int32_t> f32_tokens = sampler.draw(tokenrace::Logits::f32(logits.data(), rows, vocab), plain);
  CHECK(f32_tokens == raw.draw(TOKENRACE_DTYPE_F32, logits.data(), rows, vocab, plain_rows));
  CHECK(sampler.draw(tokenrace::Logits::bf16(bf16.data(), rows, vocab), plain) == f32_tokens);
  CHECK(sampler.draw(tokenrace::Logits::f16(f16.data(), rows, vocab), plain) == f32_tokens);
  CHECK(raw.draw(TOKENRACE_DTYPE_BF16, bf16.data(), rows, vocab, plain_rows) == f32_tokens);
  CHECK(std::count(f32_tokens.begin(), f32_tokens.end(), f32_tokens[0]) < int(rows));  // not a constant
  RowInputs unshifted = plain_rows;
  unshifted.offsets = nullptr;
  CHECK(raw.draw(TOKENRACE_DTYPE_F32, logits.data(), rows, vocab, unshifted) != f32_tokens);  // offsets matter

  const std::vector<int32_t> filtered_tokens = sampler.draw(tokenrace::Logits::f16(f16.data(), rows, vocab), filtered);
  CHECK(filtered_tokens == raw.draw(TOKENRACE_DTYPE_F32, logits.data(), rows, vocab, filtered_rows));
  CHECK(filtered_tokens != f32_tokens);  // the filters reached the library

  // llama.cpp's XTC at threshold 0 (every token is above it) keeps the least probable tokens
  // alone: each sampling row draws one of its smallest logits. typical_p and min_keep reach the
  // library too (a bad min_keep is refused).
  tokenrace::DrawOptions xtc = plain;
  xtc.xtc_probability(1.0f).xtc_threshold(0.0f).typical_p(1.0f).min_keep(0);
  const std::vector<int32_t> least = sampler.draw(tokenrace::Logits::f32(logits.data(), rows, vocab), xtc);
  for (uint32_t r = 0; r < rows; r++) {
    if (temps[r] == 0.0f) continue;
    const float* row = &logits[size_t(r) * vocab];
    CHECK(row[least[r]] == *std::min_element(row, row + vocab));
  }
  tokenrace::DrawOptions bad_keep = plain;
  bad_keep.min_keep(-1);
  CHECK_THROWS(sampler.draw(tokenrace::Logits::f32(logits.data(), rows, vocab), bad_keep), TOKENRACE_STATUS_INVALID_ARGUMENT,
               "min_keep[0]");
  CHECK(sampler.draw(tokenrace::Logits::f32(logits.data(), rows, vocab), tokenrace::DrawOptions(plain).typical_p(0.3f)) !=
        f32_tokens);

  // llama.cpp's DRY: each row's history "x m x" (m its most probable token) makes m extend a
  // repeat of one token; at allowed length 1 and a multiplier of 1e30 m is out of every greedy
  // row's reach. A one-token breaker m shields it again; a bad breaker id is refused.
  {
    std::vector<int32_t> history, breaker_ids;
    std::vector<uint64_t> history_offsets{0}, breaker_offsets{0}, breaker_rows{0};
    std::vector<int32_t> argmax(rows);
    for (uint32_t r = 0; r < rows; r++) {
      const float* row = &logits[size_t(r) * vocab];
      argmax[r] = int32_t(std::max_element(row, row + vocab) - row);
      const int32_t other = (argmax[r] + 1) % int32_t(vocab);
      history.insert(history.end(), {other, argmax[r], other});
      history_offsets.push_back(history.size());
      breaker_ids.push_back(argmax[r]);
      breaker_offsets.push_back(breaker_ids.size());
      breaker_rows.push_back(breaker_offsets.size() - 1);
    }
    tokenrace::DrawOptions dry = plain;
    dry.output_tokens(history, history_offsets).dry_multiplier(1e30f).dry_allowed_length(1);
    const std::vector<int32_t> dried = sampler.draw(tokenrace::Logits::f32(logits.data(), rows, vocab), dry);
    for (uint32_t r = 0; r < rows; r++) {
      if (temps[r] == 0.0f) CHECK(dried[r] != argmax[r]);
    }
    tokenrace::DrawOptions shielded = dry;
    shielded.dry_sequence_breakers(breaker_ids, breaker_offsets, breaker_rows);
    tokenrace::DrawOptions undried = plain;
    undried.output_tokens(history, history_offsets);
    CHECK(sampler.draw(tokenrace::Logits::f32(logits.data(), rows, vocab), shielded) ==
          sampler.draw(tokenrace::Logits::f32(logits.data(), rows, vocab), undried));
    breaker_ids[0] = int32_t(vocab);
    CHECK_THROWS(sampler.draw(tokenrace::Logits::f32(logits.data(), rows, vocab), shielded),
                 TOKENRACE_STATUS_INVALID_ARGUMENT, "dry_breaker_ids[0]");
  }

  // llama.cpp's mirostat: v2 at mu -100 keeps each row's maximum alone, with its ties (the
  // surprise of one of c tied tokens is log2 c; a greedy row keeps its first maximum: 0), so
  // every row draws a maximum and its mu becomes -100 - 0.1 * (surprise - 5) (the default eta
  // and tau); the mu goes to DrawResult::mirostat_mu, or to the caller's memory; a bad mode is
  // refused.
  {
    tokenrace::DrawOptions miro = plain;
    miro.mirostat(2).mirostat_mu(-100.0f);
    const tokenrace::DrawResult got = sampler.draw_full(tokenrace::Logits::f32(logits.data(), rows, vocab), miro);
    CHECK(got.mirostat_mu.size() == rows);
    for (uint32_t r = 0; r < rows; r++) {
      const float* row = &logits[size_t(r) * vocab];
      const float top = *std::max_element(row, row + vocab);
      const double ties = temps[r] == 0.0f ? 1.0 : double(std::count(row, row + vocab, top));
      CHECK(row[got.tokens[r]] == top);
      const double want = -100.0 - double(0.1f) * (std::log2(ties) - 5.0);
      CHECK(std::fabs(got.mirostat_mu[r] - want) < 1e-4);
    }
    std::vector<float> mu(rows, 7.0f);
    miro.mirostat_mu_out(mu.data());
    CHECK(sampler.draw(tokenrace::Logits::f32(logits.data(), rows, vocab), miro) == got.tokens);
    CHECK(mu == got.mirostat_mu);
    std::fill(mu.begin(), mu.end(), 7.0f);
    CHECK_THROWS(sampler.draw(tokenrace::Logits::f32(logits.data(), rows, vocab), miro.mirostat(3)),
                 TOKENRACE_STATUS_INVALID_ARGUMENT, "mirostat[0]");
    CHECK(mu == std::vector<float>(rows, 7.0f));
  }

  // Strided rows: the same rows with padding between them.
  const uint64_t stride = vocab + 24;
  std::vector<float> padded(rows * stride, std::numeric_limits<float>::infinity());
  for (uint32_t r = 0; r < rows; r++) std::copy_n(&logits[size_t(r) * vocab], vocab, &padded[r * stride]);
  CHECK(sampler.draw(tokenrace::Logits::f32(padded.data(), rows, vocab, stride), plain) == f32_tokens);

  // The pointer overloads and the old contiguous-f32 call.
  CHECK(sampler.draw(tokenrace::Logits::f32(logits.data(), rows, vocab),
                     tokenrace::DrawOptions().temperature(temps.data()).seeds(seeds.data()).offsets(offsets.data())) ==
        f32_tokens);
  std::vector<float> greedy(rows, 0.0f);
  RowInputs greedy_rows;
  greedy_rows.temperature = greedy.data();
  CHECK(sampler.draw(logits.data(), rows, vocab, greedy.data()) ==
        raw.draw(TOKENRACE_DTYPE_F32, logits.data(), rows, vocab, greedy_rows));
}

// `n` seeded draws of one filtered row: only kept tokens, each within 5 sigma of its reference
// probability.
inline void sampled_frequencies_match(tokenrace::Sampler& sampler, const std::vector<float>& x, const RowFilter& f) {
  const uint32_t vocab = uint32_t(x.size()), n = 4096;
  std::vector<float> logits;
  for (uint32_t r = 0; r < n; r++) logits.insert(logits.end(), x.begin(), x.end());
  const std::vector<float> temps(n, f.temperature), top_p(n, f.top_p), min_p(n, f.min_p);
  const std::vector<int32_t> top_k(n, f.top_k);
  const std::vector<uint64_t> seeds = iota_from<uint64_t>(n, 1000, 1);
  const std::vector<int32_t> tokens =
      sampler.draw(tokenrace::Logits::f32(logits.data(), n, vocab),
                   tokenrace::DrawOptions().temperature(temps).top_k(top_k).top_p(top_p).min_p(min_p).seeds(seeds));
  const std::vector<bool> kept = reference_kept(x, f);
  const std::vector<double> logprob = reference_logprobs(x, inverse_temperature(f.temperature), kept);
  std::vector<int> count(vocab, 0);
  for (int32_t t : tokens) count[t]++;
  for (uint32_t i = 0; i < vocab; i++) {
    const double p = std::exp(logprob[i]), sigma = std::sqrt(p * (1 - p) / n);
    const double seen = double(count[i]) / n;
    const bool within = std::fabs(seen - p) <= 5 * sigma + 1e-9;
    CHECK(within);
    if (!within) std::fprintf(stderr, "  token %u: %.4f drawn, %.4f expected\n", i, seen, p);
  }
}

// The float64 race on external noise (E, or ln E as `kind` says): argmax (x - m) / T - ln E.
inline int32_t race_on(const float* x, const float* noise, tokenrace_noise_kind kind, uint32_t vocab,
                       float temperature) {
  const double m = *std::max_element(x, x + vocab);
  int32_t best = 0;
  double best_key = -std::numeric_limits<double>::infinity();
  for (uint32_t i = 0; i < vocab; i++) {
    const double log_e = kind == TOKENRACE_NOISE_KIND_EXP ? std::log(double(noise[i])) : double(noise[i]);
    const double key = (x[i] - m) * inverse_temperature(temperature) - log_e;
    if (key > best_key) best_key = key, best = int32_t(i);
  }
  return best;
}

// draw_full's kept sets, logprobs, ranks and top-n against the float64 reference on a small
// vocabulary, and the sampled frequencies against the reference probabilities.
inline void filters_and_logprobs_match_the_reference(const tokenrace::Library& lib) {
  const std::vector<float> x = {0.5f, 2.0f, -1.0f, 1.0f, -3.0f, 1.5f, 0.0f, -0.5f};
  const uint32_t vocab = uint32_t(x.size());
  const std::vector<RowFilter> filters = {
      {1.0f, 0, 1.0f, 0.0f},   {0.7f, 3, 1.0f, 0.0f},    {1.0f, 0, 0.6f, 0.0f},
      {1.3f, 0, 1.0f, 0.2f},   {0.9f, 5, 0.8f, 0.05f},   {0.0f, 2, 0.5f, 0.0f},  // greedy: filters ignored
  };
  const uint32_t rows = uint32_t(filters.size());
  std::vector<float> logits, temps, top_p, min_p;
  std::vector<int32_t> top_k;
  for (const RowFilter& f : filters) {
    logits.insert(logits.end(), x.begin(), x.end());
    temps.push_back(f.temperature), top_k.push_back(f.top_k), top_p.push_back(f.top_p), min_p.push_back(f.min_p);
  }
  const std::vector<uint64_t> seeds = iota_from<uint64_t>(rows, 1, 1);
  const tokenrace::DrawOptions options =
      tokenrace::DrawOptions().temperature(temps).top_k(top_k).top_p(top_p).min_p(min_p).seeds(seeds);
  tokenrace::Sampler sampler(lib, tokenrace::Config().max_rows(4096).seed(3));
  const tokenrace::Logits batch = tokenrace::Logits::f32(logits.data(), rows, vocab);

  const tokenrace::DrawResult processed = sampler.draw_full(batch, options, vocab, TOKENRACE_LOGPROB_MODE_PROCESSED);
  const tokenrace::DrawResult raw = sampler.draw_full(batch, options, 3, TOKENRACE_LOGPROB_MODE_RAW, true);
  CHECK(processed.ranks.empty() && raw.ranks.size() == rows);  // ranks only when asked
  // score: the drawn tokens scored give back the draws' logprobs, bit for bit.
  const tokenrace::DrawResult scored =
      sampler.score(batch, raw.tokens, tokenrace::DrawOptions(options).top_n(3).ranks(true));
  CHECK(scored.tokens == raw.tokens && scored.ranks == raw.ranks && scored.topn_ids == raw.topn_ids);
  CHECK(std::memcmp(scored.logprobs.data(), raw.logprobs.data(), rows * sizeof(float)) == 0);
  CHECK(std::memcmp(scored.topn_logprobs.data(), raw.topn_logprobs.data(), rows * 3 * sizeof(float)) == 0);
  const std::vector<int32_t> short_targets(rows - 1, 0);
  CHECK_THROWS(sampler.score(batch, short_targets, options), TOKENRACE_STATUS_INVALID_ARGUMENT, "target_ids");
  const std::vector<double> raw_ref = reference_logprobs(x, 1.0, std::vector<bool>(vocab, true));
  std::vector<int32_t> by_raw(vocab);
  std::iota(by_raw.begin(), by_raw.end(), 0);
  std::sort(by_raw.begin(), by_raw.end(), [&](int32_t a, int32_t b) { return raw_ref[a] > raw_ref[b]; });
  for (uint32_t r = 0; r < rows; r++) {
    const RowFilter& f = filters[r];
    const bool greedy = f.temperature == 0.0f;
    const std::vector<bool> kept = greedy ? std::vector<bool>(vocab, true) : reference_kept(x, f);
    const std::vector<double> ref = greedy ? raw_ref : reference_logprobs(x, inverse_temperature(f.temperature), kept);
    // Processed, all vocab entries of the top-n: each token's logprob, -inf outside the kept set.
    std::vector<bool> listed(vocab, false);
    for (uint32_t j = 0; j < vocab; j++) {
      const int32_t id = processed.topn_id(r, j);
      CHECK(id >= 0 && uint32_t(id) < vocab && !listed[id] && logprob_close(processed.topn_logprob(r, j), ref[id]));
      if (id >= 0 && uint32_t(id) < vocab) listed[id] = true;
      CHECK(j == 0 || processed.topn_logprob(r, j - 1) >= processed.topn_logprob(r, j));
    }
    const int32_t token = processed.tokens[r];
    CHECK(kept[token] && logprob_close(processed.logprobs[r], ref[token]));
    CHECK(raw.tokens[r] == token);  // seeded rows: the same draw
    // Raw: the sampled token's logprob and rank, and the three most probable tokens.
    const int32_t rank = int32_t(std::find(by_raw.begin(), by_raw.end(), token) - by_raw.begin()) + 1;
    CHECK(logprob_close(raw.logprobs[r], raw_ref[token]) && raw.ranks[r] == rank);
    for (uint32_t j = 0; j < 3; j++)
      CHECK(raw.topn_id(r, j) == by_raw[j] && logprob_close(raw.topn_logprob(r, j), raw_ref[by_raw[j]]));
    CHECK(!greedy || (token == 1 && (raw.flags[r] & TOKENRACE_FLAG_GREEDY)));
  }
  sampled_frequencies_match(sampler, x, filters[1]);
  sampled_frequencies_match(sampler, x, filters[4]);
}

inline void noise_pool_and_leases(const tokenrace::Library& lib) {
  const uint32_t vocab = 64;
  const tokenrace::PoolConfig exp_pool =
      tokenrace::PoolConfig().vocab_size(vocab).rows(8).kind(TOKENRACE_NOISE_KIND_EXP).seed(11);
  tokenrace::NoisePool pool(lib, exp_pool);
  tokenrace::NoisePool twin(lib, exp_pool);
  CHECK(pool.config().vocab == vocab && pool.config().rows == 8 && pool.get() != nullptr);
  {
    tokenrace::Lease lease = pool.borrow(2);
    tokenrace::Lease same = twin.borrow(2);
    CHECK(lease.rows() == 2 && lease.vocab() == vocab && lease.kind() == TOKENRACE_NOISE_KIND_EXP);
    CHECK(lease.first_seq() == 0 && !lease.released() && lease.row(1) == lease.values() + vocab);
    CHECK(std::all_of(lease.values(), lease.values() + 2 * vocab, [](float e) { return e > 0 && std::isfinite(e); }));
    CHECK(std::memcmp(lease.values(), same.values(), 2 * vocab * sizeof(float)) == 0);  // seeded

    // The lease's noise in a draw: the float64 race on it.
    tokenrace::Sampler sampler(lib, tokenrace::Config().vocab_size(vocab).max_rows(8));
    const std::vector<float> logits = eighths(2 * vocab, 3);
    const std::vector<int32_t> tokens =
        sampler.draw(tokenrace::Logits::f32(logits.data(), 2, vocab), tokenrace::DrawOptions().noise(lease));
    for (uint32_t r = 0; r < 2; r++)
      CHECK(tokens[r] == race_on(&logits[r * vocab], lease.row(r), lease.kind(), vocab, 1.0f));
    CHECK(sampler.stats().external_noise_rows == 2);
    CHECK_THROWS(sampler.draw(tokenrace::Logits::f32(logits.data(), 1, 32), tokenrace::DrawOptions().noise(lease)),
                 TOKENRACE_STATUS_INVALID_ARGUMENT, "values per row");

    lease.release();
    CHECK(lease.released());
    lease.release();  // idempotent
    tokenrace::Lease moved = std::move(same);
    CHECK(same.released() && !moved.released());
  }
  const tokenrace_pool_stats st = pool.stats();
  CHECK(st.rows_borrowed == 2 && st.struct_size == sizeof st);
  CHECK_THROWS(pool.borrow(0), TOKENRACE_STATUS_INVALID_ARGUMENT, "n_rows");
  CHECK_THROWS(pool.borrow(9), TOKENRACE_STATUS_INVALID_ARGUMENT, "n_rows");

  // A lease outlives its pool, and stays readable until released.
  std::vector<tokenrace::Lease> kept;
  {
    tokenrace::NoisePool short_lived(lib, exp_pool);
    kept.push_back(short_lived.borrow(3));
  }
  CHECK(kept[0].values()[3 * vocab - 1] > 0);
  kept[0].release();

  pool.shutdown();
  pool.shutdown();  // idempotent
  CHECK_THROWS(pool.borrow(1), TOKENRACE_STATUS_CLOSED, "");

  tokenrace::NoisePool moved_from(lib, exp_pool);
  tokenrace::NoisePool owner = std::move(moved_from);
  CHECK_THROWS(moved_from.borrow(1), TOKENRACE_STATUS_CLOSED, "moved from");
  owner.borrow(1).release();
}

// A sampler with a pool attached draws its unseeded rows on the pool's noise: the tokens are
// those of the same noise passed explicitly (a twin pool, same seed, same borrow sizes).
inline void attached_pool_feeds_the_draws(const tokenrace::Library& lib) {
  const uint32_t vocab = 64, rows = 4;
  const tokenrace::PoolConfig config = tokenrace::PoolConfig().vocab_size(vocab).rows(16).seed(13);
  tokenrace::NoisePool pool(lib, config), twin(lib, config);
  tokenrace::Sampler sampler(lib, tokenrace::Config().vocab_size(vocab).max_rows(rows));
  sampler.attach_pool(pool);
  const std::vector<float> logits = eighths(rows * vocab, 4);
  const tokenrace::Logits batch = tokenrace::Logits::f32(logits.data(), rows, vocab);
  const std::vector<int32_t> tokens = sampler.draw(batch);
  CHECK(sampler.stats().pool_rows == rows && pool.stats().rows_borrowed == rows);

  tokenrace::Lease lease = twin.borrow(rows);
  CHECK(lease.kind() == TOKENRACE_NOISE_KIND_LOG_EXP);  // the default kind
  tokenrace::Sampler plain(lib, tokenrace::Config().vocab_size(vocab).max_rows(rows));
  CHECK(plain.draw(batch, tokenrace::DrawOptions().noise(lease)) == tokens);

  tokenrace::NoisePool other_vocab(lib, tokenrace::PoolConfig().vocab_size(32).rows(4));
  CHECK_THROWS(sampler.attach_pool(other_vocab), TOKENRACE_STATUS_INVALID_ARGUMENT, "vocab");
}

// Failures throw Error with the status and the library's message naming the argument, and
// write nothing.
inline void errors_name_the_argument(const tokenrace::Library& lib) {
  tokenrace::Sampler sampler(lib, tokenrace::Config().max_rows(4).seed(1));
  std::vector<float> logits = eighths(2 * 300, 5);
  const tokenrace::Logits two_rows = tokenrace::Logits::f32(logits.data(), 2, 300);
  std::vector<int32_t> untouched = {-7, -7};
  const std::vector<float> nan_temperature = {1.0f, std::nanf("")}, bad_top_p = {0.9f, 1.5f}, bad_min_p = {-0.1f, 0.0f};
  CHECK_THROWS(sampler.draw(two_rows, tokenrace::DrawOptions().temperature(nan_temperature), untouched.data()),
               TOKENRACE_STATUS_INVALID_ARGUMENT, "temperature[1]");
  CHECK(untouched[0] == -7 && untouched[1] == -7);
  CHECK_THROWS(sampler.draw(two_rows, tokenrace::DrawOptions().top_p(bad_top_p)), TOKENRACE_STATUS_INVALID_ARGUMENT,
               "top_p[1]");
  CHECK_THROWS(sampler.draw(two_rows, tokenrace::DrawOptions().min_p(bad_min_p)), TOKENRACE_STATUS_INVALID_ARGUMENT,
               "min_p[0]");
  CHECK_THROWS(sampler.draw(tokenrace::Logits::f32(logits.data(), 5, 100)), TOKENRACE_STATUS_INVALID_ARGUMENT,
               "max_rows");
  CHECK_THROWS(sampler.draw_full(two_rows, tokenrace::DrawOptions(), 301), TOKENRACE_STATUS_INVALID_ARGUMENT, "top_n");
  // Checked by the wrapper before the call: a vector of the wrong length.
  const std::vector<uint64_t> three_seeds = {1, 2, 3};
  CHECK_THROWS(sampler.draw(two_rows, tokenrace::DrawOptions().seeds(three_seeds)), TOKENRACE_STATUS_INVALID_ARGUMENT,
               "seeds has 3 values for 2 rows");
  CHECK(sampler.stats().rejected_calls == 5);

  CHECK_THROWS(tokenrace::Sampler(lib, tokenrace::Config().max_rows(0)), TOKENRACE_STATUS_INVALID_CONFIG, "max_rows");
  CHECK_THROWS(tokenrace::Sampler(lib, tokenrace::Config().simd(tokenrace_simd(42))), TOKENRACE_STATUS_INVALID_CONFIG,
               "simd");
  // A pool's vocab has no usable default.
  CHECK_THROWS(tokenrace::NoisePool(lib, tokenrace::PoolConfig().use_environment(false)),
               TOKENRACE_STATUS_INVALID_CONFIG, "vocab");

  tokenrace::Sampler owner = std::move(sampler);
  CHECK_THROWS(sampler.draw(two_rows), TOKENRACE_STATUS_CLOSED, "moved from");
  CHECK(owner.draw(two_rows).size() == 2 && owner.stats().calls == 1);
}

// One sampler shared by several threads: every thread's seeded draws are the single-threaded
// ones.
inline void a_sampler_is_shared_by_threads(const tokenrace::Library& lib) {
  const uint32_t rows = 8, vocab = 512;
  tokenrace::Sampler sampler(lib, tokenrace::Config().max_rows(rows).threads(2));
  const std::vector<float> logits = eighths(rows * vocab, 6);
  const tokenrace::Logits batch = tokenrace::Logits::f32(logits.data(), rows, vocab);
  const int rounds = 10;
  std::vector<std::vector<int32_t>> expected;
  for (int r = 0; r < rounds; r++) {
    const std::vector<uint64_t> seeds = iota_from<uint64_t>(rows, uint64_t(r) * 100, 1);
    const std::vector<uint64_t> offsets = iota_from<uint64_t>(rows, uint64_t(r), 0);
    expected.push_back(sampler.draw(batch, tokenrace::DrawOptions().seeds(seeds).offsets(offsets)));
  }
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; t++) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < rounds; r++) {
        const std::vector<uint64_t> seeds = iota_from<uint64_t>(rows, uint64_t(r) * 100, 1);
        const std::vector<uint64_t> offsets = iota_from<uint64_t>(rows, uint64_t(r), 0);
        if (sampler.draw(batch, tokenrace::DrawOptions().seeds(seeds).offsets(offsets)) != expected[r]) mismatches[t]++;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(std::accumulate(mismatches.begin(), mismatches.end(), 0) == 0);
  CHECK(sampler.stats().calls == uint64_t(5 * rounds));
}

// ---- verify (speculative decoding) ------------------------------------------------------------

// What a bare tokenrace_verify call wrote, as a C caller makes it (the independent side of the
// comparisons below: nothing of the wrapper fills its structs).
struct CVerified {
  tokenrace_status status = TOKENRACE_STATUS_INTERNAL;
  std::vector<int32_t> tokens, counts;
  std::vector<uint32_t> flags;
  std::vector<float> logprobs;
};

// The inputs of a verify call, as arrays for the bare C call (null: unset).
struct VerifyInputs {
  const void* logits = nullptr;
  tokenrace_dtype dtype = TOKENRACE_DTYPE_F32;
  uint32_t rows = 0, vocab = 0;
  std::vector<int32_t> counts, drafts;
  const float* temperature = nullptr;
  const int32_t* top_k = nullptr;
  const float* top_p = nullptr;
  const uint64_t* seeds = nullptr;
  const uint64_t* offsets = nullptr;
  const uint8_t* seeded = nullptr;
  const double* uniforms = nullptr;
  const float* draft_probs = nullptr;
  const float* noise = nullptr;
};

inline CVerified c_verify(const tokenrace::Api& api, tokenrace_sampler* sampler, const VerifyInputs& in,
                          uint32_t width, tokenrace_logprob_mode mode) {
  tokenrace_verify_batch b;
  std::memset(&b, 0, sizeof b);
  b.struct_size = sizeof b;
  b.dtype = in.dtype;
  b.logits = in.logits;
  b.rows = in.rows;
  b.vocab = in.vocab;
  b.requests = uint32_t(in.counts.size());
  b.draft_counts = in.counts.data();
  b.draft_tokens = in.drafts.data();
  b.temperature = in.temperature;
  b.top_k = in.top_k;
  b.top_p = in.top_p;
  b.seeds = in.seeds;
  b.offsets = in.offsets;
  b.seeded = in.seeded;
  b.uniforms = in.uniforms;
  b.draft_probs = in.draft_probs;
  b.noise = in.noise;
  b.noise_kind = TOKENRACE_NOISE_KIND_EXP;
  b.noise_row_stride = in.vocab;
  const size_t n = in.counts.size();
  CVerified v;
  v.tokens.assign(n * width, -7);
  v.counts.assign(n, -7);
  v.flags.assign(n, 77);
  v.logprobs.assign(n * width, 12345.0f);
  tokenrace_verify_output o;
  std::memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.logprob_mode = mode;
  o.tokens = v.tokens.data();
  o.counts = v.counts.data();
  o.flags = v.flags.data();
  o.logprobs = v.logprobs.data();
  v.status = api.verify(sampler, &b, &o);
  return v;
}

inline bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); i++)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
  return true;
}

inline int32_t argmax_of(const float* x, uint32_t vocab) {
  return int32_t(std::max_element(x, x + vocab) - x);
}

// The wrapper's verify is the C call on the same inputs: greedy, seeded and externally driven
// requests with filters and draft probabilities give the same tokens, counts, flags and logprobs
// (on samplers of different streams: every request's randomness is its seed's or the caller's),
// for f32, bf16 and f16 encodings of the same values and strided rows.
inline void verify_equals_the_c_api(const tokenrace::Library& lib) {
  const uint32_t vocab = 300;
  const std::vector<int32_t> counts = {3, 0, 2, 1, 4};
  const uint32_t requests = uint32_t(counts.size()), drafts = 10, rows = drafts + requests;
  std::vector<float> logits = eighths(size_t(rows) * vocab, 21);
  for (uint32_t r = 0; r < rows; r++) logits[size_t(r) * vocab + (r * 37) % vocab] = 3.5f;  // a likely token
  std::vector<uint16_t> bf16(logits.size()), f16(logits.size());
  std::transform(logits.begin(), logits.end(), bf16.begin(), to_bf16);
  std::transform(logits.begin(), logits.end(), f16.begin(), to_f16);
  // Drafts: the argmax of their rows (request 0 greedy: all accepted), else a mix.
  std::vector<int32_t> draft_tokens;
  uint32_t row = 0;
  for (uint32_t i = 0; i < requests; i++, row++)
    for (int32_t j = 0; j < counts[i]; j++, row++)
      draft_tokens.push_back(i != 0 && (i + uint32_t(j)) % 3 == 2 ? int32_t((row * 11) % vocab)
                                                         : argmax_of(&logits[size_t(row) * vocab], vocab));
  // q: a softmax of other values per draft row, normalised in float64.
  std::vector<float> q = eighths(size_t(drafts) * vocab, 22);
  for (uint32_t d = 0; d < drafts; d++) {
    double z = 0;
    for (uint32_t i = 0; i < vocab; i++) z += std::exp(double(q[size_t(d) * vocab + i]));
    for (uint32_t i = 0; i < vocab; i++) q[size_t(d) * vocab + i] = float(std::exp(double(q[size_t(d) * vocab + i])) / z);
  }
  const std::vector<float> temps = {0.0f, 0.8f, 1.0f, 1.2f, 0.9f}, top_p = {1.0f, 0.9f, 1.0f, 0.95f, 1.0f};
  const std::vector<int32_t> top_k = {0, 50, 0, 0, 100};
  const std::vector<uint64_t> seeds = {1, 2, 3, 4, 5}, offsets = {10, 20, 30, 40, 50};
  const std::vector<uint8_t> seeded = {1, 1, 0, 1, 0};  // requests 2 and 4: the caller's uniforms and noise
  const std::vector<double> uniforms = {0.5, 0.1, 0.9, 0.3, 0.6, 0.2, 0.7, 0.4, 0.8, 0.05};
  std::vector<float> noise(size_t(rows) * vocab);
  uint64_t state = 99;
  for (float& e : noise) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    e = float(-std::log((double(state >> 11) + 0.5) / 9007199254740992.0));
  }

  const tokenrace::VerifyOptions options = tokenrace::VerifyOptions()
                                               .temperature(temps)
                                               .top_k(top_k)
                                               .top_p(top_p)
                                               .seeds(seeds)
                                               .offsets(offsets)
                                               .seeded(seeded)
                                               .uniforms(uniforms)
                                               .draft_probs(q)
                                               .noise(noise.data(), TOKENRACE_NOISE_KIND_EXP, vocab);
  tokenrace::Sampler sampler(lib, tokenrace::Config().max_rows(64).seed(5));
  const tokenrace::Logits target = tokenrace::Logits::f32(logits.data(), rows, vocab);
  const tokenrace::VerifyResult full = sampler.verify_full(target, counts, draft_tokens, options,
                                                           TOKENRACE_LOGPROB_MODE_PROCESSED);
  CHECK(full.requests == requests && full.width == 5 && full.tokens.size() == requests * 5);

  const api_sampler raw(lib);  // another stream
  VerifyInputs in;
  in.logits = logits.data(), in.rows = rows, in.vocab = vocab, in.counts = counts, in.drafts = draft_tokens;
  in.temperature = temps.data(), in.top_k = top_k.data(), in.top_p = top_p.data();
  in.seeds = seeds.data(), in.offsets = offsets.data(), in.seeded = seeded.data();
  in.uniforms = uniforms.data(), in.draft_probs = q.data(), in.noise = noise.data();
  const CVerified c = c_verify(lib.api(), raw.sampler, in, 5, TOKENRACE_LOGPROB_MODE_PROCESSED);
  CHECK(c.status == TOKENRACE_STATUS_OK);
  CHECK(full.tokens == c.tokens && full.counts == c.counts && full.flags == c.flags);
  CHECK(same_floats(full.logprobs, c.logprobs));
  // The chains given as trees (parent i - 1): the same outputs; the accepted nodes 0, 1, ...
  std::vector<int32_t> chain;
  for (int32_t n : counts)
    for (int32_t j = 0; j < n; j++) chain.push_back(j - 1);
  tokenrace::VerifyOptions as_tree = options;
  as_tree.draft_parents(chain);
  const tokenrace::VerifyResult tree =
      sampler.verify_full(target, counts, draft_tokens, as_tree, TOKENRACE_LOGPROB_MODE_PROCESSED);
  CHECK(tree.tokens == full.tokens && tree.counts == full.counts && same_floats(tree.logprobs, full.logprobs));
  for (uint32_t i = 0; i < requests; i++)
    for (uint32_t j = 0; j < full.width; j++)
      CHECK(tree.accepted_nodes[size_t(i) * full.width + j] == (int32_t(j) < tree.accepted(i) ? int32_t(j) : -1));
  // The greedy request accepted its drafts (the argmax of each row) and then the bonus row's.
  CHECK(full.counts[0] == 4 && full.accepted(0) == 3 && (full.flags[0] & TOKENRACE_FLAG_GREEDY));
  CHECK(full.token(0, 3) == argmax_of(&logits[3 * vocab], vocab));
  for (uint32_t i = 0; i < requests; i++) {
    CHECK(full.counts[i] >= 1 && full.counts[i] <= counts[i] + 1);
    const std::vector<int32_t> emitted = full.emitted(i);
    CHECK(emitted.size() == size_t(full.counts[i]));
    for (uint32_t j = 0; j < full.width; j++) {
      const bool padding = j >= uint32_t(full.counts[i]);
      CHECK(padding ? full.token(i, j) == -1 && std::isnan(full.logprob(i, j))
                    : full.token(i, j) >= 0 && std::isfinite(full.logprob(i, j)) && emitted[j] == full.token(i, j));
    }
  }

  // verify() is verify_full() without the logprobs; the other encodings and strided rows agree.
  const tokenrace::VerifyResult plain = sampler.verify(target, counts, draft_tokens, options);
  CHECK(plain.tokens == full.tokens && plain.counts == full.counts && plain.flags == full.flags);
  CHECK(plain.logprobs.empty());
  CHECK(sampler.verify(tokenrace::Logits::bf16(bf16.data(), rows, vocab), counts, draft_tokens, options).tokens ==
        full.tokens);
  CHECK(sampler.verify(tokenrace::Logits::f16(f16.data(), rows, vocab), counts, draft_tokens, options).tokens ==
        full.tokens);
  in.logits = f16.data(), in.dtype = TOKENRACE_DTYPE_F16;
  CHECK(c_verify(lib.api(), raw.sampler, in, 5, TOKENRACE_LOGPROB_MODE_PROCESSED).tokens == full.tokens);
  const uint64_t stride = vocab + 9;
  std::vector<float> padded(size_t(rows) * stride, std::numeric_limits<float>::infinity());
  for (uint32_t r = 0; r < rows; r++) std::copy_n(&logits[size_t(r) * vocab], vocab, &padded[r * stride]);
  const tokenrace::VerifyResult strided =
      sampler.verify_full(tokenrace::Logits::f32(padded.data(), rows, vocab, stride), counts, draft_tokens, options,
                          TOKENRACE_LOGPROB_MODE_PROCESSED);
  CHECK(strided.tokens == full.tokens && strided.flags == full.flags && same_floats(strided.logprobs, full.logprobs));

  // The general call takes the wrapper's batch as it is.
  const tokenrace::VerifyBatch prepared = options.batch(target, counts, draft_tokens);
  const tokenrace_verify_batch& batch = prepared.c();
  CHECK(batch.struct_size == sizeof batch && batch.requests == requests && batch.rows == rows);
  CHECK(batch.uniforms == uniforms.data() && batch.draft_probs == q.data() && batch.seeded == seeded.data());
  std::vector<int32_t> tokens(requests * 6, -7), emitted(requests, -7);
  tokenrace_verify_output out{};
  out.struct_size = sizeof out;
  out.tokens = tokens.data();
  out.tokens_stride = 6;
  out.counts = emitted.data();
  sampler.verify(batch, out);
  CHECK(emitted == full.counts);
  for (uint32_t i = 0; i < requests; i++)
    CHECK(std::equal(tokens.begin() + i * 6, tokens.begin() + i * 6 + 5, full.tokens.begin() + i * 5) &&
          tokens[i * 6 + 5] == -1);
  CHECK(sampler.stats().calls == 7);  // six verify calls and the chains given as trees
}

// The sampling step inside verification through the wrapper: a presence penalty counts the
// accepted draft in the bonus row's history, so a greedy request's bonus token moves from the
// draft's token to the next best; the wrapper refuses offsets of the wrong length.
inline void verify_with_the_step(const tokenrace::Library& lib) {
  const uint32_t vocab = 64;
  std::vector<float> logits(2 * vocab, 0.0f);
  logits[7] = 5.0f;          // row 0: the draft's row, argmax 7
  logits[vocab + 7] = 3.0f;  // row 1 (bonus): 7 first, 9 second
  logits[vocab + 9] = 2.5f;
  const std::vector<int32_t> counts = {1}, drafts = {7};
  const tokenrace::Logits target = tokenrace::Logits::f32(logits.data(), 2, vocab);
  tokenrace::Sampler sampler(lib, tokenrace::Config().max_rows(8).seed(2));
  const std::vector<int32_t> no_ids;
  const std::vector<uint64_t> empty_output = {0, 0};
  const tokenrace::VerifyResult plain = sampler.verify(target, counts, drafts, tokenrace::VerifyOptions().temperature(0.0f));
  CHECK(plain.emitted(0) == std::vector<int32_t>({7, 7}));
  const tokenrace::VerifyOptions step =
      tokenrace::VerifyOptions().temperature(0.0f).output_tokens(no_ids, empty_output).presence_penalty(1.0f);
  CHECK(sampler.verify(target, counts, drafts, step).emitted(0) == std::vector<int32_t>({7, 9}));
  const std::vector<uint64_t> three_offsets = {0, 0, 0};
  CHECK_THROWS(sampler.verify(target, counts, drafts, tokenrace::VerifyOptions().output_tokens(no_ids, three_offsets)),
               TOKENRACE_STATUS_INVALID_ARGUMENT, "output_offsets has 3 values for 1 requests");
  const std::vector<float> bad_penalty = {-1.0f};
  CHECK_THROWS(sampler.verify(target, counts, drafts, tokenrace::VerifyOptions().repetition_penalty(bad_penalty)),
               TOKENRACE_STATUS_INVALID_ARGUMENT, "batch.repetition_penalty[0]");
}

// Greedy requests through the wrapper, its own checks of the vectors, and the library's
// messages for bad input.
inline void verify_greedy_and_errors(const tokenrace::Library& lib) {
  const uint32_t vocab = 64;
  const std::vector<int32_t> counts = {2, 0, 1};
  const uint32_t rows = 6;
  const std::vector<float> logits = eighths(rows * vocab, 23);
  std::vector<int32_t> a(rows);
  for (uint32_t r = 0; r < rows; r++) a[r] = argmax_of(&logits[r * vocab], vocab);
  // Request 0: both drafts the argmax; request 2: a mismatch.
  const std::vector<int32_t> drafts = {a[0], a[1], (a[4] + 1) % int32_t(vocab)};
  const std::vector<float> greedy = {0.0f, 0.0f, 0.0f};
  tokenrace::Sampler sampler(lib, tokenrace::Config().max_rows(8).seed(2));
  const tokenrace::Logits target = tokenrace::Logits::f32(logits.data(), rows, vocab);
  const tokenrace::VerifyResult r =
      sampler.verify(target, counts, drafts, tokenrace::VerifyOptions().temperature(greedy));
  CHECK(r.width == 3 && r.emitted(0) == std::vector<int32_t>({a[0], a[1], a[2]}));
  CHECK(r.emitted(1) == std::vector<int32_t>({a[3]}) && r.emitted(2) == std::vector<int32_t>({a[4]}));
  CHECK(r.token(1, 1) == -1 && r.token(1, 2) == -1 && r.token(2, 1) == -1 && r.accepted(2) == 0);
  CHECK(std::all_of(r.flags.begin(), r.flags.end(), [](uint32_t f) { return f == TOKENRACE_FLAG_GREEDY; }));
  // No requests at all.
  const std::vector<int32_t> none;
  const tokenrace::VerifyResult empty = sampler.verify(tokenrace::Logits::f32(nullptr, 0, vocab), none, none);
  CHECK(empty.requests == 0 && empty.tokens.empty() && empty.counts.empty());

  // The library's checks: the message names the field, request and position.
  const std::vector<int32_t> out_of_range = {a[0], int32_t(vocab), a[4]};
  CHECK_THROWS(sampler.verify(target, counts, out_of_range), TOKENRACE_STATUS_INVALID_ARGUMENT,
               "tokenrace_verify: batch.draft_tokens[1]: request 0, draft 1: 64 is not a token id");
  CHECK_THROWS(sampler.verify(tokenrace::Logits::f32(logits.data(), rows - 1, vocab), counts, drafts),
               TOKENRACE_STATUS_INVALID_ARGUMENT, "rows is 5");
  const std::vector<double> bad_uniforms = {0.5, 1.0, 0.5};
  CHECK_THROWS(sampler.verify(target, counts, drafts, tokenrace::VerifyOptions().uniforms(bad_uniforms)),
               TOKENRACE_STATUS_INVALID_ARGUMENT, "batch.uniforms[1]: request 0, draft 1: 1 is not in (0, 1)");
  std::vector<float> q(3 * vocab, 1.0f / float(vocab));
  q[2 * vocab + 5] = 0.5f;
  CHECK_THROWS(sampler.verify(target, counts, drafts, tokenrace::VerifyOptions().draft_probs(q)),
               TOKENRACE_STATUS_INVALID_ARGUMENT, "batch.draft_probs[2]: request 2, draft 0");
  // ... which greedy requests ignore.
  CHECK(sampler.verify(target, counts, drafts, tokenrace::VerifyOptions().temperature(greedy).draft_probs(q)).tokens ==
        r.tokens);
  CHECK(sampler.stats().rejected_calls == 4);

  // The wrapper's own: vectors that do not match the requests or the drafts (not sent).
  const std::vector<int32_t> two_drafts = {a[0], a[1]};
  CHECK_THROWS(sampler.verify(target, counts, two_drafts), TOKENRACE_STATUS_INVALID_ARGUMENT,
               "tokenrace::VerifyOptions: draft_tokens has 2 values, draft_counts add up to 3");
  const std::vector<int32_t> negative_count = {2, -1, 1};
  CHECK_THROWS(sampler.verify(target, negative_count, drafts), TOKENRACE_STATUS_INVALID_ARGUMENT,
               "tokenrace::VerifyOptions: draft_counts[1]: -1 is negative");
  const std::vector<uint64_t> one_seed = {1};
  CHECK_THROWS(sampler.verify(target, counts, drafts, tokenrace::VerifyOptions().seeds(one_seed)),
               TOKENRACE_STATUS_INVALID_ARGUMENT, "seeds has 1 values for 3 requests");
  const std::vector<double> two_uniforms = {0.5, 0.5};
  CHECK_THROWS(sampler.verify(target, counts, drafts, tokenrace::VerifyOptions().uniforms(two_uniforms)),
               TOKENRACE_STATUS_INVALID_ARGUMENT, "uniforms has 2 values for 3 draft tokens");
  const std::vector<float> short_q(2 * vocab + 10, 1.0f / float(vocab));
  CHECK_THROWS(sampler.verify(target, counts, drafts, tokenrace::VerifyOptions().draft_probs(short_q)),
               TOKENRACE_STATUS_INVALID_ARGUMENT, "draft_probs has 138 values for 3 draft rows of 64 values, 64 apart");
  CHECK(sampler.stats().rejected_calls == 4);

  // A lease's noise: one lease row per target row, as the same values passed by pointer.
  tokenrace::NoisePool pool(lib, tokenrace::PoolConfig().vocab_size(vocab).rows(8).seed(3));
  const std::vector<double> uniforms = {0.9, 0.2, 0.95};
  {
    tokenrace::Lease lease = pool.borrow(rows);
    const tokenrace::VerifyResult leased =
        sampler.verify(target, counts, drafts, tokenrace::VerifyOptions().uniforms(uniforms).noise(lease));
    const tokenrace::VerifyResult pointed = sampler.verify(
        target, counts, drafts, tokenrace::VerifyOptions().uniforms(uniforms).noise(lease.values(), lease.kind(), vocab));
    CHECK(leased.tokens == pointed.tokens && leased.counts == pointed.counts);
    tokenrace::Lease short_lease = pool.borrow(2);
    CHECK_THROWS(sampler.verify(target, counts, drafts, tokenrace::VerifyOptions().noise(short_lease)),
                 TOKENRACE_STATUS_INVALID_ARGUMENT, "the noise lease has 2 rows for 6 target rows");
  }
  tokenrace::NoisePool wide(lib, tokenrace::PoolConfig().vocab_size(2 * vocab).rows(8));
  tokenrace::Lease wide_lease = wide.borrow(rows);
  CHECK_THROWS(sampler.verify(target, counts, drafts, tokenrace::VerifyOptions().noise(wide_lease)),
               TOKENRACE_STATUS_INVALID_ARGUMENT, "the noise lease has 128 values per row, the target rows 64");
  CHECK(sampler.stats().rejected_calls == 4);

  tokenrace::Sampler owner = std::move(sampler);
  CHECK_THROWS(sampler.verify(target, counts, drafts), TOKENRACE_STATUS_CLOSED, "moved from");
  CHECK(owner.verify(target, counts, drafts, tokenrace::VerifyOptions().temperature(greedy)).tokens == r.tokens);
}

// Run first in its process (the level is fixed when the first sampler is made): with
// TOKENRACE_LOG_LEVEL=info the sampler's SIMD message reaches the program's log function, on the
// thread that made it, with its level and target; an empty function restores stderr.
inline void log_messages_reach_the_callback(const tokenrace::Library& lib) {
  setenv("TOKENRACE_LOG_LEVEL", "info", 1);
  std::vector<std::string> seen;
  lib.set_log_callback([&seen](tokenrace_log_level level, const std::string& target, const std::string& text) {
    if (level == TOKENRACE_LOG_LEVEL_INFO && target.rfind("tokenrace", 0) == 0) seen.push_back(text);
  });
  { tokenrace::Sampler sampler(lib, tokenrace::Config().max_rows(4)); }
  lib.set_log_callback(nullptr);
  unsetenv("TOKENRACE_LOG_LEVEL");
  bool simd = false;
  for (const std::string& text : seen) simd |= text.find("SIMD level") != std::string::npos;
  CHECK(simd);
  // A throwing function loses its message, never reaches the library.
  lib.set_log_callback([](tokenrace_log_level, const std::string&, const std::string&) { throw std::runtime_error("x"); });
  { tokenrace::NoisePool pool(lib, tokenrace::PoolConfig().vocab_size(8).rows(2).seed(1)); }
  lib.set_log_callback(nullptr);
}

// ---- the sampling step and the outputs through DrawOptions ---------------------------------

// Every input of the sampling step and every output, for `rows` rows of `vocab` logits, as
// vectors that the wrapper's options and the bare C batch both point into.
struct StepInputs {
  uint32_t rows = 6, vocab = 300;
  std::vector<float> logits = eighths(size_t(rows) * vocab, 31);
  std::vector<float> temperature = {0.9f, 0.0f, 1.3f, 0.7f, 1.0f, 0.8f};  // row 1 greedy
  std::vector<uint64_t> seeds = iota_from<uint64_t>(rows, 900, 13), offsets = iota_from<uint64_t>(rows, 40, 3);
  std::vector<int32_t> top_k = {0, 0, 50, 0, 0, 120};
  std::vector<float> top_p = {1.0f, 1.0f, 1.0f, 0.9f, 1.0f, 0.95f}, min_p = {0.0f, 0.0f, 0.0f, 0.0f, 0.02f, 0.0f};
  std::vector<int32_t> prompt_ids = {1, 2, 3, 2, 10, 11, 12, 100, 200, 299};
  std::vector<uint64_t> prompt_offsets = {0, 3, 4, 7, 7, 9, 10};
  std::vector<int32_t> output_ids = {5, 5, 5, 6, 20, 21, 20, 150, 7, 7};
  std::vector<uint64_t> output_offsets = {0, 4, 4, 7, 8, 10, 10};
  std::vector<float> repetition = {1.3f, 1.0f, 2.0f, 1.1f, 1.5f, 1.2f};
  std::vector<float> frequency = {0.5f, 0.0f, 0.25f, 1.0f, 0.0f, 0.3f};
  std::vector<float> presence = {0.25f, 0.0f, 0.5f, 0.0f, 0.75f, 0.1f};
  std::vector<int32_t> bias_ids = {8, 9, 8, 30, 31, 250};
  std::vector<float> bias_values = {3.0f, -std::numeric_limits<float>::infinity(), 1.5f, 6.0f, -2.0f, 4.0f};
  std::vector<uint64_t> bias_offsets = {0, 3, 3, 5, 5, 5, 6};
  std::vector<int32_t> allowed_ids = {40, 41, 42, 43, 44, 45, 46, 47};
  std::vector<uint64_t> allowed_offsets = {0, 0, 0, 4, 4, 8, 8};
  std::vector<uint8_t> allowed_rows = {0, 0, 1, 0, 1, 0};  // rows 2 and 4 draw from their lists
  std::vector<int32_t> banned_ids = {11, 12, 13, 42, 5};
  std::vector<uint64_t> banned_offsets = {0, 3, 3, 4, 4, 4, 5};
  uint64_t mask_stride = (vocab + 31) / 32 + 2;  // padded rows of bitmask words
  std::vector<int32_t> bitmask;

  StepInputs() {
    bitmask.assign(size_t(rows) * mask_stride, -1);
    for (uint32_t w = 0; w < 4; w++) bitmask[5 * mask_stride + w] = 0;  // row 5: no token below 128
  }
};

inline tokenrace::DrawOptions step_options(const StepInputs& in) {
  return tokenrace::DrawOptions()
      .temperature(in.temperature)
      .seeds(in.seeds)
      .offsets(in.offsets)
      .top_k(in.top_k)
      .top_p(in.top_p)
      .min_p(in.min_p)
      .prompt_tokens(in.prompt_ids, in.prompt_offsets)
      .output_tokens(in.output_ids, in.output_offsets)
      .repetition_penalty(in.repetition)
      .frequency_penalty(in.frequency)
      .presence_penalty(in.presence)
      .logit_bias(in.bias_ids, in.bias_values, in.bias_offsets)
      .allowed_tokens(in.allowed_ids, in.allowed_offsets)
      .allowed_rows(in.allowed_rows)
      .banned_tokens(in.banned_ids, in.banned_offsets)
      .token_bitmask(in.bitmask, in.mask_stride);
}

// The same inputs in a tokenrace_batch filled by hand, as a C caller would.
inline tokenrace_batch c_step_batch(const StepInputs& in) {
  tokenrace_batch b;
  std::memset(&b, 0, sizeof b);
  b.struct_size = sizeof b;
  b.dtype = TOKENRACE_DTYPE_F32;
  b.logits = in.logits.data();
  b.rows = in.rows;
  b.vocab = in.vocab;
  b.temperature = in.temperature.data();
  b.seeds = in.seeds.data();
  b.offsets = in.offsets.data();
  b.top_k = in.top_k.data();
  b.top_p = in.top_p.data();
  b.min_p = in.min_p.data();
  b.prompt_ids = in.prompt_ids.data();
  b.prompt_offsets = in.prompt_offsets.data();
  b.output_ids = in.output_ids.data();
  b.output_offsets = in.output_offsets.data();
  b.repetition_penalty = in.repetition.data();
  b.frequency_penalty = in.frequency.data();
  b.presence_penalty = in.presence.data();
  b.bias_ids = in.bias_ids.data();
  b.bias_values = in.bias_values.data();
  b.bias_offsets = in.bias_offsets.data();
  b.allowed_ids = in.allowed_ids.data();
  b.allowed_offsets = in.allowed_offsets.data();
  b.allowed_rows = in.allowed_rows.data();
  b.banned_ids = in.banned_ids.data();
  b.banned_offsets = in.banned_offsets.data();
  b.token_bitmask = in.bitmask.data();
  b.bitmask_row_stride = in.mask_stride;
  return b;
}

// A bare C draw of `b` with every output: the independent side of the comparisons below.
inline tokenrace::DrawResult c_draw_all(const tokenrace::Api& api, tokenrace_sampler* sampler,
                                        const tokenrace_batch& b, uint32_t top_n, tokenrace_logprob_mode mode,
                                        tokenrace_full_mode full_mode, size_t given_ids = 0) {
  tokenrace::DrawResult r;
  const size_t rows = b.rows;
  r.rows = b.rows, r.top_n = top_n, r.vocab = b.vocab;
  r.tokens.assign(rows, -7), r.flags.assign(rows, 77), r.logprobs.assign(rows, 7.0f), r.ranks.assign(rows, -7);
  r.topn_ids.assign(rows * top_n, -7), r.topn_logprobs.assign(rows * top_n, 7.0f);
  r.full_logprobs.assign(rows * b.vocab, 7.0f);
  tokenrace_output o;
  std::memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.logprob_mode = mode;
  o.tokens = r.tokens.data(), o.flags = r.flags.data(), o.logprobs = r.logprobs.data(), o.ranks = r.ranks.data();
  o.top_n = top_n, o.topn_ids = r.topn_ids.data(), o.topn_logprobs = r.topn_logprobs.data();
  o.full_logprobs = r.full_logprobs.data(), o.full_mode = full_mode;
  if (given_ids) {  // the logprobs and ranks of the batch's logprob_token_ids
    r.token_logprobs.assign(given_ids, 7.0f), r.token_ranks.assign(given_ids, -7);
    o.token_logprobs = r.token_logprobs.data(), o.token_ranks = r.token_ranks.data();
  }
  CHECK(api.draw(sampler, &b, &o) == TOKENRACE_STATUS_OK);
  return r;
}

inline bool same_draws(const tokenrace::DrawResult& a, const tokenrace::DrawResult& b) {
  return a.tokens == b.tokens && a.flags == b.flags && same_floats(a.logprobs, b.logprobs) && a.ranks == b.ranks &&
         a.topn_ids == b.topn_ids && same_floats(a.topn_logprobs, b.topn_logprobs) &&
         same_floats(a.full_logprobs, b.full_logprobs) && same_floats(a.token_logprobs, b.token_logprobs) &&
         a.token_ranks == b.token_ranks && same_floats(a.kept_threshold, b.kept_threshold) &&
         a.kept_count == b.kept_count && a.kept_mass == b.kept_mass && a.kept_bitmask == b.kept_bitmask;
}

// The whole step through DrawOptions is the C call on the same arrays: tokens, flags, logprobs,
// ranks, top-n and full-vocabulary values alike, bit for bit (every sampling row is seeded, so
// two samplers of different streams agree); the outputs go into the caller's memory when it
// gives some, and the step reaches the library (the draw differs without it).
inline void the_whole_step_equals_the_c_api(const tokenrace::Library& lib) {
  const StepInputs in;
  const api_sampler raw(lib);
  tokenrace::Sampler sampler(lib, tokenrace::Config().max_rows(in.rows).seed(5));
  const tokenrace::Logits logits = tokenrace::Logits::f32(in.logits.data(), in.rows, in.vocab);
  const uint32_t top_n = 4;
  for (tokenrace_logprob_mode mode : {TOKENRACE_LOGPROB_MODE_RAW, TOKENRACE_LOGPROB_MODE_PROCESSED}) {
    for (tokenrace_full_mode full : {TOKENRACE_FULL_MODE_RAW, TOKENRACE_FULL_MODE_PROCESSED,
                                     TOKENRACE_FULL_MODE_PROCESSED_LOGITS}) {
      tokenrace::DrawOptions options = step_options(in);
      options.logprob_mode(mode).top_n(top_n).ranks(true).full_logprobs(full);
      const tokenrace::DrawResult wrapped = sampler.draw_full(logits, options);
      CHECK(same_draws(wrapped, c_draw_all(lib.api(), raw.sampler, c_step_batch(in), top_n, mode, full)));
    }
  }
  tokenrace::DrawOptions options = step_options(in);
  const tokenrace::DrawResult step = sampler.draw_full(logits, options.full_logprobs(TOKENRACE_FULL_MODE_PROCESSED));
  // What each input does, seen in the processed row: the step reached the library.
  const float minus_inf = -std::numeric_limits<float>::infinity();
  CHECK(step.full_logprob(0, 9) == minus_inf && step.full_logprob(0, 11) == minus_inf);  // bias -inf, banned
  CHECK(step.tokens[2] >= 40 && step.tokens[2] <= 43 && step.tokens[4] >= 44 && step.tokens[4] <= 47);  // allowed
  CHECK(step.full_logprob(5, 127) == minus_inf && step.full_logprob(5, 128) != minus_inf);  // the bitmask
  CHECK(step.full_logprob(3, 30) == step.full_logprobs[3 * in.vocab + 30]);
  const tokenrace::DrawOptions without_step = tokenrace::DrawOptions()
                                                  .temperature(in.temperature)
                                                  .seeds(in.seeds)
                                                  .offsets(in.offsets)
                                                  .full_logprobs(TOKENRACE_FULL_MODE_PROCESSED);
  CHECK(!same_floats(sampler.draw_full(logits, without_step).full_logprobs, step.full_logprobs));

  // Full-vocabulary values into the caller's padded rows, by the plain draw too: no copy.
  const uint64_t stride = in.vocab + 5;
  std::vector<float> full(size_t(in.rows - 1) * stride + in.vocab, 7.0f);
  tokenrace::DrawOptions into_caller = step_options(in);
  into_caller.full_logprobs(full, TOKENRACE_FULL_MODE_PROCESSED, stride);
  std::vector<int32_t> tokens(in.rows, -7);
  sampler.draw(logits, into_caller, tokens.data());
  CHECK(tokens == step.tokens && full[in.vocab] == 7.0f);  // the padding untouched
  for (uint32_t r = 0; r < in.rows; r++)
    CHECK(std::equal(full.begin() + std::ptrdiff_t(r * stride), full.begin() + std::ptrdiff_t(r * stride + in.vocab),
                     step.full_logprobs.begin() + std::ptrdiff_t(r * in.vocab)));
  const tokenrace::DrawResult into_caller_full = sampler.draw_full(logits, into_caller);
  CHECK(into_caller_full.full_logprobs.empty() && into_caller_full.tokens == step.tokens);

  // Spans of a pointer and a length, and bare pointers, are the vectors' draw.
  tokenrace::DrawOptions spans = step_options(in);
  spans.prompt_tokens({in.prompt_ids.data(), in.prompt_ids.size()}, in.prompt_offsets.data())
      .logit_bias(in.bias_ids.data(), {in.bias_values.data(), in.bias_values.size()}, in.bias_offsets.data())
      .token_bitmask(in.bitmask.data(), in.mask_stride)
      .repetition_penalty(in.repetition.data())
      .full_logprobs(TOKENRACE_FULL_MODE_PROCESSED);
  CHECK(same_draws(sampler.draw_full(logits, spans), step));
}

// One value for every row is that value in a per-row array, for each per-row option.
inline void scalars_equal_per_row_values(const tokenrace::Library& lib) {
  const StepInputs in;
  tokenrace::Sampler sampler(lib, tokenrace::Config().max_rows(16).seed(6));
  const tokenrace::Logits logits = tokenrace::Logits::f32(in.logits.data(), in.rows, in.vocab);
  const std::vector<float> temperature(in.rows, 0.8f), top_p(in.rows, 0.9f), min_p(in.rows, 0.01f);
  const std::vector<float> repetition(in.rows, 1.4f), frequency(in.rows, 0.3f), presence(in.rows, 0.6f);
  const std::vector<int32_t> top_k(in.rows, 60), last_n(in.rows, 3), min_tokens(in.rows, 50);
  const std::vector<uint64_t> seeds(in.rows, 77), offsets(in.rows, 12);
  const std::vector<uint8_t> ones(in.rows, 1);
  tokenrace::DrawOptions per_row = step_options(in);
  per_row.temperature(temperature)
      .seeds(seeds)
      .offsets(offsets)
      .seeded(ones)
      .top_k(top_k)
      .top_p(top_p)
      .min_p(min_p)
      .repetition_penalty(repetition)
      .frequency_penalty(frequency)
      .presence_penalty(presence)
      .penalty_last_n(last_n)
      .min_tokens(min_tokens)
      .stop_tokens(in.banned_ids, in.banned_offsets)
      .allowed_rows(ones)
      .top_n(3)
      .full_logprobs(TOKENRACE_FULL_MODE_PROCESSED);
  tokenrace::DrawOptions scalars = per_row;
  scalars.temperature(0.8f)
      .seeds(77)
      .offsets(12)
      .seeded(true)
      .top_k(60)
      .top_p(0.9f)
      .min_p(0.01f)
      .repetition_penalty(1.4f)
      .frequency_penalty(0.3f)
      .presence_penalty(0.6f)
      .penalty_last_n(3)
      .min_tokens(50)
      .allowed_rows(1);
  const tokenrace::DrawResult expected = sampler.draw_full(logits, per_row);
  CHECK(same_draws(sampler.draw_full(logits, scalars), expected));
  // A span after a scalar replaces it, and the other way round.
  scalars.temperature(in.temperature);
  CHECK(same_draws(sampler.draw_full(logits, scalars), sampler.draw_full(logits, per_row.temperature(in.temperature))));
  // A scalar batch owns its expanded values: its copies and the C call can use them.
  const tokenrace::DrawBatch prepared = tokenrace::DrawOptions().temperature(0.0f).batch(logits);
  const tokenrace::DrawBatch copy = prepared;
  CHECK(copy.c().temperature == prepared.c().temperature && copy.c().temperature[in.rows - 1] == 0.0f);

  // Verify's per-request scalars.
  const uint32_t vocab = 64;
  const std::vector<int32_t> counts = {2, 0, 3};
  const uint32_t requests = 3, rows = 5 + requests;
  const std::vector<float> target = eighths(size_t(rows) * vocab, 32);
  const std::vector<int32_t> drafts = {4, 9, 17, 3, 60};
  const std::vector<float> v_temperature(requests, 0.9f), v_top_p(requests, 0.95f), v_min_p(requests, 0.01f);
  const std::vector<int32_t> v_top_k(requests, 40);
  const std::vector<uint64_t> v_seeds(requests, 5), v_offsets(requests, 100);
  const std::vector<uint8_t> v_seeded(requests, 1);
  const tokenrace::Logits target_rows = tokenrace::Logits::f32(target.data(), rows, vocab);
  const tokenrace::VerifyResult by_request = sampler.verify_full(
      target_rows, counts, drafts,
      tokenrace::VerifyOptions().temperature(v_temperature).seeds(v_seeds).offsets(v_offsets).seeded(v_seeded)
          .top_k(v_top_k).top_p(v_top_p).min_p(v_min_p));
  const tokenrace::VerifyResult by_scalar = sampler.verify_full(
      target_rows, counts, drafts,
      tokenrace::VerifyOptions().temperature(0.9f).seeds(5).offsets(100).seeded(1).top_k(40).top_p(0.95f).min_p(
          0.01f));
  CHECK(by_scalar.tokens == by_request.tokens && by_scalar.counts == by_request.counts &&
        same_floats(by_scalar.logprobs, by_request.logprobs));
}

// Spans of known length that do not fit the rows or the lists' offsets are refused by the
// wrapper (the library cannot know their length), nothing written; the rest is the library's to
// judge, and its messages come through as they are.
inline void step_errors_name_the_argument(const tokenrace::Library& lib) {
  const StepInputs in;
  tokenrace::Sampler sampler(lib, tokenrace::Config().max_rows(in.rows).seed(7));
  const tokenrace::Logits logits = tokenrace::Logits::f32(in.logits.data(), in.rows, in.vocab);
  const auto invalid = TOKENRACE_STATUS_INVALID_ARGUMENT;
  std::vector<int32_t> untouched(in.rows, -7);
  const std::vector<uint64_t> short_offsets(in.prompt_offsets.begin(), in.prompt_offsets.end() - 1);
  CHECK_THROWS(sampler.draw(logits, step_options(in).prompt_tokens(in.prompt_ids, short_offsets), untouched.data()),
               invalid, "tokenrace::DrawOptions: prompt_offsets has 6 values for 6 rows (rows + 1 wanted)");
  CHECK(std::all_of(untouched.begin(), untouched.end(), [](int32_t t) { return t == -7; }));
  const std::vector<int32_t> few_ids(in.output_ids.begin(), in.output_ids.end() - 2);
  CHECK_THROWS(sampler.draw(logits, step_options(in).output_tokens(few_ids, in.output_offsets)), invalid,
               "output_ids has 8 values, output_offsets[6] says 10");
  const std::vector<float> few_values(in.bias_values.begin(), in.bias_values.end() - 1);
  CHECK_THROWS(sampler.draw(logits, step_options(in).logit_bias(in.bias_ids, few_values, in.bias_offsets)), invalid,
               "bias_values has 5 values, bias_offsets[6] says 6");
  CHECK_THROWS(sampler.draw(logits, step_options(in).banned_tokens(in.banned_ids, {in.banned_offsets.data(), 3})),
               invalid, "banned_offsets has 3 values");
  const std::vector<float> two_penalties = {1.0f, 1.0f};
  CHECK_THROWS(sampler.draw(logits, step_options(in).presence_penalty(two_penalties)), invalid,
               "presence_penalty has 2 values for 6 rows");
  const std::vector<uint8_t> nine_flags(9, 1);
  CHECK_THROWS(sampler.draw(logits, step_options(in).allowed_rows(nine_flags), untouched.data()), invalid,
               "allowed_rows has 9 values for 6 rows");
  // The last row needs only its own words, not the padding after them.
  const size_t mask_words = (in.rows - 1) * in.mask_stride + (in.vocab + 31) / 32;
  CHECK(sampler.draw(logits, step_options(in).token_bitmask({in.bitmask.data(), mask_words}, in.mask_stride)) ==
        sampler.draw(logits, step_options(in)));
  CHECK_THROWS(sampler.draw(logits, step_options(in).token_bitmask({in.bitmask.data(), mask_words - 1},
                                                                   in.mask_stride)),
               invalid, "token_bitmask has 69 words for 6 rows of 10 words, 12 apart");
  std::vector<float> small(in.vocab * in.rows - 1);
  CHECK_THROWS(sampler.draw(logits, tokenrace::DrawOptions().full_logprobs(small, TOKENRACE_FULL_MODE_RAW)), invalid,
               "full_logprobs has 1799 values for 6 rows of 300 values");
  CHECK(sampler.stats().rejected_calls == 0 && sampler.stats().calls == 2);  // none reached the library

  // The library's own checks, named as it names them.
  std::vector<float> bad_repetition = in.repetition;
  bad_repetition[4] = 0.0f;
  CHECK_THROWS(sampler.draw(logits, step_options(in).repetition_penalty(bad_repetition), untouched.data()), invalid,
               "tokenrace_draw: batch.repetition_penalty[4]: 0 is not a finite number > 0");
  std::vector<int32_t> out_of_range = in.banned_ids;
  out_of_range[3] = int32_t(in.vocab);
  CHECK_THROWS(sampler.draw(logits, step_options(in).banned_tokens(out_of_range, in.banned_offsets)), invalid,
               "banned_ids");
  std::vector<uint64_t> unordered = in.bias_offsets;
  std::swap(unordered[2], unordered[3]);
  CHECK_THROWS(sampler.draw(logits, step_options(in).logit_bias(in.bias_ids, in.bias_values, unordered)), invalid,
               "bias_offsets");
  CHECK_THROWS(sampler.draw(logits, step_options(in).prompt_tokens(in.prompt_ids, nullptr)), invalid,
               "prompt_offsets: is NULL while prompt_ids is given");
  CHECK_THROWS(sampler.draw(logits, step_options(in).token_bitmask(in.bitmask, 3)), invalid, "bitmask_row_stride");
  CHECK(std::all_of(untouched.begin(), untouched.end(), [](int32_t t) { return t == -7; }));
  CHECK(sampler.stats().rejected_calls == 5);
}

// The filter order set in Config reaches the sampler: its draws are a C sampler's of that
// order, and the kept sets differ from the other order's.
inline void filter_order_reaches_the_sampler(const tokenrace::Library& lib) {
  const tokenrace_config c = tokenrace::Config().filter_order(TOKENRACE_FILTER_ORDER_FILTERS_FIRST).resolve(lib);
  CHECK(c.filter_order == TOKENRACE_FILTER_ORDER_FILTERS_FIRST);
  CHECK(tokenrace::Config().resolve(lib).filter_order == lib.api().config_default().filter_order);
  const StepInputs in;
  const tokenrace::Logits logits = tokenrace::Logits::f32(in.logits.data(), in.rows, in.vocab);
  const tokenrace::DrawOptions options =
      tokenrace::DrawOptions().temperature(2.0f).top_p(0.5f).seeds(in.seeds).full_logprobs(
          TOKENRACE_FULL_MODE_PROCESSED);
  tokenrace::Sampler filters_first(lib, tokenrace::Config().max_rows(in.rows).filter_order(
                                            TOKENRACE_FILTER_ORDER_FILTERS_FIRST));
  tokenrace::Sampler temperature_first(lib, tokenrace::Config().max_rows(in.rows));
  const tokenrace::DrawResult first = filters_first.draw_full(logits, options);
  CHECK(!same_floats(first.full_logprobs, temperature_first.draw_full(logits, options).full_logprobs));

  tokenrace_config raw_config = lib.api().config_default();
  raw_config.max_rows = in.rows;
  raw_config.filter_order = TOKENRACE_FILTER_ORDER_FILTERS_FIRST;
  tokenrace_sampler* raw = nullptr;
  CHECK(lib.api().sampler_new(&raw_config, &raw) == TOKENRACE_STATUS_OK);
  const tokenrace::DrawBatch prepared = options.batch(logits);
  const tokenrace::DrawResult bare =
      c_draw_all(lib.api(), raw, prepared.c(), 0, TOKENRACE_LOGPROB_MODE_RAW, TOKENRACE_FULL_MODE_PROCESSED);
  lib.api().sampler_free(raw);
  CHECK(bare.tokens == first.tokens && same_floats(bare.full_logprobs, first.full_logprobs));
}

// The caller's order of filter stages through DrawOptions: a list in a fixed order's relative
// order draws what a sampler configured with it draws, whatever the sampler's own order; a stage
// listed twice is refused naming its position.
inline void stage_order_reaches_the_library(const tokenrace::Library& lib) {
  const StepInputs in;
  const tokenrace::Logits logits = tokenrace::Logits::f32(in.logits.data(), in.rows, in.vocab);
  tokenrace::Sampler filters_first(lib, tokenrace::Config().max_rows(in.rows).filter_order(
                                            TOKENRACE_FILTER_ORDER_FILTERS_FIRST));
  tokenrace::Sampler temperature_first(lib, tokenrace::Config().max_rows(in.rows));
  const tokenrace::DrawOptions base = tokenrace::DrawOptions().temperature(0.4f).top_p(0.6f).seeds(in.seeds);
  // The two orders draw differently here, so the checks below tell the lists apart.
  CHECK(filters_first.draw(logits, base) != temperature_first.draw(logits, base));
  tokenrace::DrawOptions after = base, before = base, twice = base;
  after.order({TOKENRACE_STAGE_TEMPERATURE, TOKENRACE_STAGE_TOP_P});
  before.order({TOKENRACE_STAGE_TOP_P, TOKENRACE_STAGE_TEMPERATURE});
  CHECK(filters_first.draw(logits, after) == temperature_first.draw(logits, base));
  CHECK(temperature_first.draw(logits, before) == filters_first.draw(logits, base));
  twice.order({TOKENRACE_STAGE_TOP_P, TOKENRACE_STAGE_TEMPERATURE, TOKENRACE_STAGE_TOP_P});
  CHECK_THROWS(temperature_first.draw(logits, twice), TOKENRACE_STATUS_INVALID_ARGUMENT, "order[2]");
}

// Bad words, forced tokens and the logprobs of given ids through DrawOptions: a one-token bad word
// draws what the banned list draws, a forced row returns its token and leaves the other row as
// drawn, and a given id's logprob is the sampled one's when it is the sampled token.
inline void parity_options_reach_the_library(const tokenrace::Library& lib) {
  const uint32_t rows = 2, vocab = 40;
  std::vector<float> x(rows * vocab);
  for (size_t i = 0; i < x.size(); i++) x[i] = float((i * 7) % 13) * 0.5f;
  const tokenrace::Logits logits = tokenrace::Logits::f32(x.data(), rows, vocab);
  const std::vector<int32_t> words = {5, 6, 7}, banned = {7, 7};
  const std::vector<uint64_t> word_offsets = {0, 1, 3}, row_offsets = {0, 1, 2}, banned_offsets = {0, 1, 2};
  const std::vector<int32_t> output = {6, 6};
  const std::vector<uint64_t> output_offsets = {0, 1, 2};
  tokenrace::Sampler sampler(lib, tokenrace::Config().max_rows(4).seed(9));
  tokenrace::DrawOptions base;
  base.temperature(0.9f).seeds(3).output_tokens(output, output_offsets);
  // Row 0's word [5] bans 5 (not 7); row 1's word [6, 7] bans 7 after its output 6.
  tokenrace::DrawOptions with_words = base;
  with_words.bad_words(words, word_offsets, row_offsets);
  const std::vector<int32_t> bans = {5, 7};
  tokenrace::DrawOptions with_bans = base;
  with_bans.banned_tokens(bans, banned_offsets);
  CHECK(same_draws(sampler.draw_full(logits, with_words), sampler.draw_full(logits, with_bans)));
  const tokenrace::DrawResult drawn = sampler.draw_full(logits, base);
  const std::vector<int32_t> forced = {int32_t((drawn.tokens[0] + 1) % vocab), -1};
  tokenrace::DrawOptions with_forced = base;
  with_forced.forced_tokens(forced);
  const tokenrace::DrawResult got = sampler.draw_full(logits, with_forced);
  CHECK(got.tokens[0] == forced[0] && got.tokens[1] == drawn.tokens[1]);
  const std::vector<int32_t> ids = {drawn.tokens[0], drawn.tokens[1]};
  const std::vector<uint64_t> id_offsets = {0, 1, 2};
  std::vector<float> id_logprobs(2, 1.0f);
  std::vector<int32_t> id_ranks(2, -1);
  tokenrace::DrawOptions with_ids = base;
  with_ids.token_logprobs(ids, id_offsets, id_logprobs.data(), id_ranks.data()).ranks(true);
  const tokenrace::DrawResult again = sampler.draw_full(logits, with_ids);
  CHECK(again.tokens == drawn.tokens);
  CHECK(id_logprobs[0] == again.logprobs[0] && id_logprobs[1] == again.logprobs[1]);
  CHECK(id_ranks[0] == again.ranks[0] && id_ranks[1] == again.ranks[1]);
  // The kept set of rows without filters: every finite value (all 40, the least 0), mass 1.
  std::vector<float> kept_threshold(rows, -1.0f);
  std::vector<int32_t> kept_count(rows, -1), kept_bits(rows * 2, 7);
  std::vector<double> kept_mass(rows, -1.0);
  tokenrace::DrawOptions with_kept = base;
  with_kept.kept_set(kept_threshold.data(), kept_count.data(), kept_mass.data(), kept_bits.data());
  CHECK(sampler.draw_full(logits, with_kept).tokens == drawn.tokens);
  for (uint32_t r = 0; r < rows; r++) {
    CHECK(kept_count[r] == 40 && kept_threshold[r] == 0.0f && kept_mass[r] == 1.0);
    CHECK(kept_bits[2 * r] == -1 && kept_bits[2 * r + 1] == 0xFF);
  }
}

// Inputs for every field of tokenrace_batch at once: 5 draw rows over 3 logits rows (row_index),
// each per-row value a span of the caller's, each list CSR over the 5 rows.
struct EveryField {
  static constexpr uint32_t logits_rows = 3, rows = 5, vocab = 64;
  std::vector<float> logits = eighths(size_t(logits_rows) * vocab, 41);
  std::vector<int32_t> row_index = {0, 2, 1, 0, 2};
  std::vector<float> temperature = {0.9f, 1.1f, 0.0f, 0.7f, 1.3f};
  std::vector<uint64_t> seeds = {3, 5, 7, 11, 13}, offsets = {0, 1, 2, 3, 4};
  std::vector<uint8_t> seeded = {1, 1, 1, 1, 1};
  std::vector<int32_t> top_k = {0, 40, 30, 50, 0};
  std::vector<float> top_p = {1.0f, 0.95f, 0.9f, 1.0f, 0.97f}, min_p = {0.0f, 0.01f, 0.0f, 0.02f, 0.0f};
  std::vector<float> top_n_sigma = {0.0f, 3.0f, 0.0f, 2.5f, 0.0f};
  std::vector<int32_t> min_keep = {0, 2, 1, 0, 3};
  std::vector<float> typical_p = {1.0f, 0.9f, 1.0f, 0.95f, 1.0f};
  std::vector<float> xtc_probability = {0.0f, 0.5f, 0.0f, 1.0f, 0.0f}, xtc_threshold = {0.6f, 0.1f, 0.6f, 0.2f, 0.6f};
  std::vector<float> dynatemp_range = {0.0f, 0.0f, 0.0f, 0.5f, 0.3f}, dynatemp_exponent = {1.0f, 1.0f, 1.0f, 2.0f, 1.5f};
  std::vector<int32_t> prompt_ids = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<uint64_t> prompt_offsets = {0, 2, 4, 6, 8, 9};
  std::vector<int32_t> output_ids = {3, 4, 3, 4, 3, 10, 11, 10, 20, 21, 22};
  std::vector<uint64_t> output_offsets = {0, 5, 8, 8, 10, 11};
  std::vector<float> repetition = {1.2f, 1.0f, 1.5f, 1.1f, 1.0f}, frequency = {0.2f, 0.0f, 0.4f, 0.1f, 0.3f};
  std::vector<float> presence = {0.1f, 0.3f, 0.0f, 0.2f, 0.1f};
  std::vector<int32_t> penalty_last_n = {0, 3, 0, 2, 1};
  std::vector<int32_t> bias_ids = {8, 9, 30};
  std::vector<float> bias_values = {2.0f, -std::numeric_limits<float>::infinity(), 1.5f};
  std::vector<uint64_t> bias_offsets = {0, 2, 2, 3, 3, 3};
  std::vector<int32_t> allowed_ids = {40, 41, 42, 43};
  std::vector<uint64_t> allowed_offsets = {0, 0, 0, 4, 4, 4};
  std::vector<uint8_t> allowed_rows = {0, 0, 1, 0, 0};
  std::vector<int32_t> banned_ids = {12, 13};
  std::vector<uint64_t> banned_offsets = {0, 1, 1, 1, 2, 2};
  std::vector<int32_t> bitmask = std::vector<int32_t>(size_t(rows) * 2, -1);
  std::vector<int32_t> min_tokens = {0, 10, 0, 0, 10};
  std::vector<int32_t> stop_ids = {0, 1, 2};
  std::vector<uint64_t> stop_offsets = {0, 1, 2, 2, 2, 3};
  std::vector<int32_t> bad_words_ids = {5, 10, 11};  // row 0: [5]; row 1: [10, 11]
  std::vector<uint64_t> bad_word_offsets = {0, 1, 3}, bad_words_row_offsets = {0, 1, 2, 2, 2, 2};
  std::vector<int32_t> forced_tokens = {-1, -1, -1, 17, -1};
  std::vector<int32_t> given_ids = {1, 2, 60, 33};
  std::vector<uint64_t> given_offsets = {0, 2, 2, 3, 3, 4};
  std::vector<tokenrace_stage> order = {TOKENRACE_STAGE_TOP_N_SIGMA, TOKENRACE_STAGE_TOP_K, TOKENRACE_STAGE_TYPICAL,
                                        TOKENRACE_STAGE_TOP_P,       TOKENRACE_STAGE_MIN_P, TOKENRACE_STAGE_XTC,
                                        TOKENRACE_STAGE_TEMPERATURE};
  std::vector<float> dry_multiplier = {0.0f, 0.8f, 0.0f, 1.5f, 0.5f}, dry_base = {1.75f, 1.75f, 2.0f, 1.5f, 1.75f};
  std::vector<int32_t> dry_allowed_length = {2, 1, 2, 2, 0}, dry_penalty_last_n = {-1, -1, 4, -1, 3};
  std::vector<int32_t> dry_breaker_ids = {7, 20, 21};
  std::vector<uint64_t> dry_breaker_offsets = {0, 1, 3}, dry_breakers_row_offsets = {0, 0, 1, 1, 2, 2};

  EveryField() { bitmask[2 * 4 + 1] = 0; }  // row 4: no token from 32 on

  tokenrace::Logits rows_of_logits() const { return tokenrace::Logits::f32(logits.data(), logits_rows, vocab); }
};

inline tokenrace::DrawOptions every_option(const EveryField& in) {
  tokenrace::DrawOptions o;
  o.row_index(in.row_index).temperature(in.temperature).seeds(in.seeds).offsets(in.offsets).seeded(in.seeded);
  o.top_k(in.top_k).top_p(in.top_p).min_p(in.min_p).top_n_sigma(in.top_n_sigma).min_keep(in.min_keep);
  o.typical_p(in.typical_p).xtc_probability(in.xtc_probability).xtc_threshold(in.xtc_threshold);
  o.dynatemp_range(in.dynatemp_range).dynatemp_exponent(in.dynatemp_exponent);
  o.prompt_tokens(in.prompt_ids, in.prompt_offsets).output_tokens(in.output_ids, in.output_offsets);
  o.repetition_penalty(in.repetition).frequency_penalty(in.frequency).presence_penalty(in.presence);
  o.penalty_last_n(in.penalty_last_n).logit_bias(in.bias_ids, in.bias_values, in.bias_offsets);
  o.allowed_tokens(in.allowed_ids, in.allowed_offsets).allowed_rows(in.allowed_rows);
  o.banned_tokens(in.banned_ids, in.banned_offsets).token_bitmask(in.bitmask);
  o.min_tokens(in.min_tokens).stop_tokens(in.stop_ids, in.stop_offsets);
  o.bad_words(in.bad_words_ids, in.bad_word_offsets, in.bad_words_row_offsets).forced_tokens(in.forced_tokens);
  o.token_logprobs(in.given_ids, in.given_offsets).order(in.order.data(), in.order.size());
  o.dry_multiplier(in.dry_multiplier).dry_base(in.dry_base).dry_allowed_length(in.dry_allowed_length);
  o.dry_penalty_last_n(in.dry_penalty_last_n);
  o.dry_sequence_breakers(in.dry_breaker_ids, in.dry_breaker_offsets, in.dry_breakers_row_offsets);
  return o;
}

// The same fields by hand, as a C caller fills them.
inline tokenrace_batch every_field_by_hand(const EveryField& in) {
  tokenrace_batch b;
  std::memset(&b, 0, sizeof b);
  b.struct_size = sizeof b, b.dtype = TOKENRACE_DTYPE_F32, b.logits = in.logits.data();
  b.rows = in.rows, b.vocab = in.vocab, b.noise_kind = TOKENRACE_NOISE_KIND_EXP;
  b.temperature = in.temperature.data(), b.seeds = in.seeds.data(), b.offsets = in.offsets.data();
  b.seeded = in.seeded.data(), b.top_k = in.top_k.data(), b.top_p = in.top_p.data(), b.min_p = in.min_p.data();
  b.prompt_ids = in.prompt_ids.data(), b.prompt_offsets = in.prompt_offsets.data();
  b.output_ids = in.output_ids.data(), b.output_offsets = in.output_offsets.data();
  b.repetition_penalty = in.repetition.data(), b.frequency_penalty = in.frequency.data();
  b.presence_penalty = in.presence.data();
  b.bias_ids = in.bias_ids.data(), b.bias_values = in.bias_values.data(), b.bias_offsets = in.bias_offsets.data();
  b.allowed_ids = in.allowed_ids.data(), b.allowed_offsets = in.allowed_offsets.data();
  b.allowed_rows = in.allowed_rows.data();
  b.banned_ids = in.banned_ids.data(), b.banned_offsets = in.banned_offsets.data();
  b.token_bitmask = in.bitmask.data();
  b.penalty_last_n = in.penalty_last_n.data(), b.min_tokens = in.min_tokens.data();
  b.stop_ids = in.stop_ids.data(), b.stop_offsets = in.stop_offsets.data();
  b.top_n_sigma = in.top_n_sigma.data(), b.min_keep = in.min_keep.data(), b.typical_p = in.typical_p.data();
  b.xtc_probability = in.xtc_probability.data(), b.xtc_threshold = in.xtc_threshold.data();
  b.dynatemp_range = in.dynatemp_range.data(), b.dynatemp_exponent = in.dynatemp_exponent.data();
  b.bad_words_ids = in.bad_words_ids.data(), b.bad_word_offsets = in.bad_word_offsets.data();
  b.bad_words_row_offsets = in.bad_words_row_offsets.data();
  b.forced_tokens = in.forced_tokens.data();
  b.logprob_token_ids = in.given_ids.data(), b.logprob_token_offsets = in.given_offsets.data();
  b.order = reinterpret_cast<const uint32_t*>(in.order.data()), b.order_len = in.order.size();
  b.dry_multiplier = in.dry_multiplier.data(), b.dry_base = in.dry_base.data();
  b.dry_allowed_length = in.dry_allowed_length.data(), b.dry_penalty_last_n = in.dry_penalty_last_n.data();
  b.dry_breaker_ids = in.dry_breaker_ids.data(), b.dry_breaker_offsets = in.dry_breaker_offsets.data();
  b.dry_breakers_row_offsets = in.dry_breakers_row_offsets.data();
  b.row_index = in.row_index.data();
  return b;
}

// DrawOptions reaches every field of tokenrace_batch: its batch is, byte for byte, the one a C
// caller fills by hand (spans point into the caller's arrays: nothing copied but the stage
// list), and its draw equals that C call's, outputs and all; with row_index each draw row is the
// draw of a copy of its logits row.
inline void every_field_equals_the_c_batch(const tokenrace::Library& lib) {
  const EveryField in;
  const tokenrace::DrawOptions options = every_option(in);
  const tokenrace::DrawBatch prepared = options.batch(in.rows_of_logits());
  tokenrace_batch hand = every_field_by_hand(in);
  CHECK(prepared.c().order != nullptr &&
        std::memcmp(prepared.c().order, hand.order, in.order.size() * sizeof(uint32_t)) == 0);
  hand.order = prepared.c().order;  // the options keep their own copy of the stage list
  CHECK(std::memcmp(&prepared.c(), &hand, sizeof hand) == 0);

  const api_sampler raw(lib);
  tokenrace::Sampler sampler(lib, tokenrace::Config().max_rows(8).seed(3));
  tokenrace::DrawOptions asked = options;
  asked.top_n(3).ranks(true).full_logprobs(TOKENRACE_FULL_MODE_RAW);
  const tokenrace::DrawResult wrapped = sampler.draw_full(in.rows_of_logits(), asked);
  CHECK(wrapped.rows == in.rows && wrapped.tokens.size() == in.rows);
  CHECK(same_draws(wrapped, c_draw_all(lib.api(), raw.sampler, hand, 3, TOKENRACE_LOGPROB_MODE_RAW,
                                       TOKENRACE_FULL_MODE_RAW, in.given_ids.size())));
  CHECK(wrapped.tokens[3] == 17 && wrapped.token_logprobs.size() == 4 && wrapped.token_ranks.size() == 4);
  CHECK(wrapped.token_logprobs[3] == wrapped.full_logprob(4, 33));  // row 4's given id 33
  CHECK(sampler.draw(in.rows_of_logits(), options) == wrapped.tokens);

  // The rows of row_index, copied: the same draw without an index.
  std::vector<float> copied;
  for (int32_t r : in.row_index)
    copied.insert(copied.end(), in.logits.begin() + r * in.vocab, in.logits.begin() + (r + 1) * in.vocab);
  tokenrace::DrawOptions unindexed = asked;
  unindexed.row_index(nullptr);
  CHECK(same_draws(sampler.draw_full(tokenrace::Logits::f32(copied.data(), in.rows, in.vocab), unindexed), wrapped));
  // A scalar forced token is that token in every row.
  tokenrace::DrawOptions forced_scalar = options, forced_rows = options;
  const std::vector<int32_t> sevens(in.rows, 7);
  forced_scalar.forced_tokens(7);
  forced_rows.forced_tokens(sevens);
  CHECK(same_draws(sampler.draw_full(in.rows_of_logits(), forced_scalar), sampler.draw_full(in.rows_of_logits(), forced_rows)));
  CHECK(sampler.draw(in.rows_of_logits(), forced_scalar) == sevens);
}

// The request state and the kept set through DrawOptions: the histories of requests draw what
// the same lists draw and what the C call with `requests` draws; the kept set and the given ids'
// logprobs go into DrawResult or the caller's vectors alike, as the C output's fields.
inline void requests_and_kept_set_equal_the_c_call(const tokenrace::Library& lib) {
  const EveryField in;
  const tokenrace::Api& api = lib.api();
  tokenrace_requests* state = nullptr;
  CHECK(api.requests_new(&state) == TOKENRACE_STATUS_OK);
  const std::vector<uint64_t> request_ids = {14, 10, 12, 11, 13};  // row r: request request_ids[r]
  for (uint32_t r = 0; r < in.rows; r++) {
    const uint64_t id = request_ids[r];
    const int32_t* prompt = in.prompt_ids.data() + in.prompt_offsets[r];
    const int32_t* output = in.output_ids.data() + in.output_offsets[r];
    CHECK(api.requests_add(state, id, prompt, in.prompt_offsets[r + 1] - in.prompt_offsets[r], output,
                           in.output_offsets[r + 1] - in.output_offsets[r]) == TOKENRACE_STATUS_OK);
  }
  tokenrace::DrawOptions lists;
  lists.row_index(in.row_index).temperature(in.temperature).seeds(in.seeds).top_k(in.top_k).top_p(in.top_p);
  lists.repetition_penalty(in.repetition).frequency_penalty(in.frequency).presence_penalty(in.presence);
  lists.ranks(true).token_logprobs(in.given_ids, in.given_offsets).kept_set(true, true);
  tokenrace::DrawOptions from_requests = lists;
  lists.prompt_tokens(in.prompt_ids, in.prompt_offsets).output_tokens(in.output_ids, in.output_offsets);
  from_requests.requests(state, request_ids);
  tokenrace::Sampler sampler(lib, tokenrace::Config().max_rows(8).seed(4));
  const tokenrace::DrawResult by_requests = sampler.draw_full(in.rows_of_logits(), from_requests);
  const tokenrace::DrawResult by_lists = sampler.draw_full(in.rows_of_logits(), lists);
  CHECK(same_draws(by_requests, by_lists) && same_floats(by_requests.token_logprobs, by_lists.token_logprobs));
  CHECK(by_requests.kept_bitmask == by_lists.kept_bitmask && by_requests.kept_count == by_lists.kept_count);

  // The C call with `requests`, outputs and all.
  const tokenrace::DrawBatch prepared = from_requests.batch(in.rows_of_logits());
  CHECK(prepared.c().requests == state && prepared.c().request_ids == request_ids.data());
  CHECK(prepared.c().prompt_ids == nullptr && prepared.c().output_ids == nullptr);
  const size_t words = 2;
  std::vector<int32_t> tokens(in.rows, -7), ranks(in.rows), token_ranks(4), kept_count(in.rows), kept_bits(in.rows * words);
  std::vector<float> logprobs(in.rows), token_logprobs(4), kept_threshold(in.rows);
  std::vector<double> kept_mass(in.rows);
  tokenrace_output out;
  std::memset(&out, 0, sizeof out);
  out.struct_size = sizeof out;
  out.tokens = tokens.data(), out.logprobs = logprobs.data(), out.ranks = ranks.data();
  out.token_logprobs = token_logprobs.data(), out.token_ranks = token_ranks.data();
  out.kept_threshold = kept_threshold.data(), out.kept_count = kept_count.data(), out.kept_mass = kept_mass.data();
  out.kept_bitmask = kept_bits.data();
  const api_sampler raw(lib);
  CHECK(api.draw(raw.sampler, &prepared.c(), &out) == TOKENRACE_STATUS_OK);
  CHECK(tokens == by_requests.tokens && same_floats(logprobs, by_requests.logprobs) && ranks == by_requests.ranks);
  CHECK(same_floats(token_logprobs, by_requests.token_logprobs) && token_ranks == by_requests.token_ranks);
  CHECK(same_floats(kept_threshold, by_requests.kept_threshold) && kept_count == by_requests.kept_count);
  CHECK(kept_mass == by_requests.kept_mass && kept_bits == by_requests.kept_bitmask);
  for (uint32_t r = 0; r < in.rows; r++) CHECK(by_requests.kept(r, uint32_t(by_requests.tokens[r])));
  // The kept set's values without its bitmask, and the caller's vectors: the same values.
  tokenrace::DrawOptions values_only = from_requests;
  const tokenrace::DrawResult no_bits = sampler.draw_full(in.rows_of_logits(), values_only.kept_set(true));
  CHECK(no_bits.kept_bitmask.empty() && no_bits.kept_count == by_requests.kept_count);
  std::vector<float> t2(in.rows), given2(4);
  std::vector<int32_t> c2(in.rows), b2(in.rows * words), ranks2(4);
  std::vector<double> m2(in.rows);
  tokenrace::DrawOptions into_caller = from_requests;
  into_caller.kept_set(t2, c2, m2, b2).token_logprobs(in.given_ids, in.given_offsets, given2, ranks2);
  const tokenrace::DrawResult caller = sampler.draw_full(in.rows_of_logits(), into_caller);
  CHECK(caller.kept_count.empty() && caller.token_logprobs.empty() && caller.tokens == by_requests.tokens);
  CHECK(same_floats(t2, kept_threshold) && c2 == kept_count && m2 == kept_mass && b2 == kept_bits);
  CHECK(same_floats(given2, token_logprobs) && ranks2 == token_ranks);
  api.requests_free(state);
}

// Sizes the wrapper can know and the library cannot are refused before the call, naming the
// argument (nothing written); the rest comes from the library as it words it.
inline void entry_errors_name_the_argument(const tokenrace::Library& lib) {
  const EveryField in;
  const auto invalid = TOKENRACE_STATUS_INVALID_ARGUMENT;
  tokenrace::Sampler sampler(lib, tokenrace::Config().max_rows(8).seed(5));
  const tokenrace::Logits logits = in.rows_of_logits();
  std::vector<int32_t> untouched(in.rows, -7);
  const tokenrace::DrawOptions base = tokenrace::DrawOptions().row_index(in.row_index).seeds(in.seeds);
  CHECK_THROWS(sampler.draw(logits, tokenrace::DrawOptions().row_index(in.row_index.data())), invalid,
               "tokenrace::DrawOptions: row_index needs its length");
  const std::vector<int32_t> past = {0, 3};
  CHECK_THROWS(sampler.draw(logits, tokenrace::DrawOptions().row_index(past), untouched.data()), invalid,
               "row_index[1]: 3 is not a row of the logits (3 rows)");
  const std::vector<float> three(3, 1.0f);
  CHECK_THROWS(sampler.draw(logits, tokenrace::DrawOptions(base).temperature(three)), invalid,
               "temperature has 3 values for 5 rows");
  const std::vector<uint64_t> two_ids = {1, 2};
  CHECK_THROWS(sampler.draw(logits, tokenrace::DrawOptions(base).requests(nullptr, two_ids)), invalid,
               "request_ids has 2 values for 5 rows");
  std::vector<float> threshold(4);
  std::vector<int32_t> count(5), bits(9);
  std::vector<double> mass(5);
  CHECK_THROWS(sampler.draw(logits, tokenrace::DrawOptions(base).kept_set(threshold, count, mass)), invalid,
               "kept_threshold has room for 4 values, the draw writes 5 (5 rows)");
  threshold.resize(5);
  CHECK_THROWS(sampler.draw_full(logits, tokenrace::DrawOptions(base).kept_set(threshold, count, mass, bits)),
               invalid, "kept_bitmask has room for 9 values, the draw writes 10 (5 rows of 2 words)");
  std::vector<float> given(3);
  CHECK_THROWS(sampler.draw(logits, tokenrace::DrawOptions(base).token_logprobs(in.given_ids, in.given_offsets, given)),
               invalid, "token_logprobs has room for 3 values, the draw writes 4");
  const std::vector<int32_t> targets(in.rows - 1, 0);
  CHECK_THROWS(sampler.score(logits, targets, base), invalid, "target_ids has 4 ids for 5 rows");
  CHECK(std::all_of(untouched.begin(), untouched.end(), [](int32_t t) { return t == -7; }));
  CHECK(sampler.stats().rejected_calls == 0);  // none reached the library
  const std::vector<int32_t> negative = {0, -1};
  CHECK_THROWS(sampler.draw(logits, tokenrace::DrawOptions().row_index(negative), untouched.data()), invalid,
               "batch.row_index[1]");
  CHECK(std::all_of(untouched.begin(), untouched.end(), [](int32_t t) { return t == -7; }));
}

// Every check above on `lib`; returns the number of failures (an unexpected exception is one).
inline int run_wrapper_checks(const tokenrace::Library& lib) {
  const std::pair<const char*, void (*)(const tokenrace::Library&)> all[] = {
      {"versions_and_levels", versions_and_levels},
      {"config_setters", config_setters},
      {"draws_equal_the_c_api", draws_equal_the_c_api},
      {"filters_and_logprobs_match_the_reference", filters_and_logprobs_match_the_reference},
      {"noise_pool_and_leases", noise_pool_and_leases},
      {"attached_pool_feeds_the_draws", attached_pool_feeds_the_draws},
      {"errors_name_the_argument", errors_name_the_argument},
      {"a_sampler_is_shared_by_threads", a_sampler_is_shared_by_threads},
      {"verify_equals_the_c_api", verify_equals_the_c_api},
      {"verify_greedy_and_errors", verify_greedy_and_errors},
      {"verify_with_the_step", verify_with_the_step},
      {"the_whole_step_equals_the_c_api", the_whole_step_equals_the_c_api},
      {"scalars_equal_per_row_values", scalars_equal_per_row_values},
      {"step_errors_name_the_argument", step_errors_name_the_argument},
      {"filter_order_reaches_the_sampler", filter_order_reaches_the_sampler},
      {"stage_order_reaches_the_library", stage_order_reaches_the_library},
      {"parity_options_reach_the_library", parity_options_reach_the_library},
      {"every_field_equals_the_c_batch", every_field_equals_the_c_batch},
      {"requests_and_kept_set_equal_the_c_call", requests_and_kept_set_equal_the_c_call},
      {"entry_errors_name_the_argument", entry_errors_name_the_argument},
  };
  for (const auto& [name, check] : all) {
    try {
      check(lib);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: unexpected exception: %s\n", name, e.what());
      failures++;
    }
  }
  return failures;
}

}  // namespace checks
