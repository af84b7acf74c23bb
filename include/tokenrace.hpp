// tokenrace.hpp: a header-only C++17 wrapper over the C ABI in tokenrace.h.
//
//   tokenrace::Sampler sampler(tokenrace::Config().vocab(vocab).max_rows(64).seed(1));
//   std::vector<int32_t> tokens = sampler.draw(logits.data(), rows, vocab, temperatures.data());
//
// Errors throw tokenrace::Error, whose what() is tokenrace_last_error() and whose status() is
// the tokenrace_status of the failed call.
#pragma once
#include "tokenrace.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tokenrace {

class Error : public std::runtime_error {
 public:
  Error(tokenrace_status status, const char* message) : std::runtime_error(message), status_(status) {}
  tokenrace_status status() const noexcept { return status_; }

 private:
  tokenrace_status status_;
};

inline void check(tokenrace_status status) {
  if (status != TOKENRACE_STATUS_OK) throw Error(status, tokenrace_last_error());
}

// Sampler settings, starting from the defaults overridden by TOKENRACE_* variables.
class Config {
 public:
  Config() {
    c_.struct_size = sizeof c_;
    check(tokenrace_config_from_env(&c_));
  }
  Config& vocab(uint32_t v) { c_.vocab_size = v; return *this; }
  Config& max_rows(uint32_t v) { c_.max_rows = v; return *this; }
  Config& threads(uint32_t v) { c_.threads = v; return *this; }
  Config& seed(uint64_t v) { c_.seed = v; c_.has_seed = 1; return *this; }
  Config& simd(tokenrace_simd v) { c_.simd = v; return *this; }
  Config& greedy_below(float v) { c_.greedy_below = v; return *this; }
  const tokenrace_config& c() const noexcept { return c_; }

 private:
  tokenrace_config c_{};
};

// Owns a tokenrace_sampler; movable, not copyable; safe to share across threads by reference.
class Sampler {
 public:
  explicit Sampler(const Config& config = Config()) { check(tokenrace_sampler_new(&config.c(), &s_)); }
  ~Sampler() { tokenrace_sampler_free(s_); }
  Sampler(Sampler&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Sampler& operator=(Sampler&& o) noexcept { std::swap(s_, o.s_); return *this; }
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // The general call: fill a tokenrace_batch and tokenrace_output yourself.
  void draw(const tokenrace_batch& batch, tokenrace_output& out) { check(tokenrace_draw(s_, &batch, &out)); }

  // Contiguous f32 rows; temperatures may be null (1.0 for every row).
  std::vector<int32_t> draw(const float* logits, uint32_t rows, uint32_t vocab, const float* temperatures = nullptr) {
    tokenrace_batch b{};
    b.struct_size = sizeof b;
    b.dtype = TOKENRACE_DTYPE_F32;
    b.logits = logits;
    b.rows = rows;
    b.vocab = vocab;
    b.temperature = temperatures;
    std::vector<int32_t> tokens(rows);
    tokenrace_output o{};
    o.struct_size = sizeof o;
    o.tokens = tokens.data();
    draw(b, o);
    return tokens;
  }

  std::string simd_level() const { return tokenrace_sampler_simd_level(s_); }
  tokenrace_sampler* get() const noexcept { return s_; }

 private:
  tokenrace_sampler* s_ = nullptr;
};

}  // namespace tokenrace
