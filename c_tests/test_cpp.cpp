// The C++ wrapper: RAII, exceptions carrying the library's message.
#include "tokenrace.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

int main() {
  int failures = 0;
  tokenrace::Sampler sampler(tokenrace::Config().max_rows(16).seed(3));
  std::vector<float> logits(2 * 300, 0.0f);
  logits[42] = 25.0f;
  logits[300 + 299] = 25.0f;
  std::vector<float> temps = {0.0f, 0.8f};
  auto tokens = sampler.draw(logits.data(), 2, 300, temps.data());
  if (tokens[0] != 42 || tokens[1] != 299) failures++;
  try {
    std::vector<float> bad = {1.0f, std::nanf("")};
    sampler.draw(logits.data(), 2, 300, bad.data());
    failures++;
  } catch (const tokenrace::Error& e) {
    if (e.status() != TOKENRACE_STATUS_INVALID_ARGUMENT || !std::strstr(e.what(), "temperature[1]")) failures++;
  }
  tokenrace::Sampler moved = std::move(sampler);
  if (moved.simd_level().empty()) failures++;
  std::printf("test_cpp: %s\n", failures ? "FAILED" : "ok");
  return failures != 0;
}
