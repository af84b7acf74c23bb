// A C++ serving loop that loads tokenrace at run time (no -ltokenrace) and samples the next
// token of a batch of requests, each with its own temperature, top-k, top-p and seed.
//
//   g++ -std=c++17 -Iinclude examples/cpp/dlopen_server.cpp -ldl -o dlopen_server
//   ./dlopen_server target/release/libtokenrace.so     # no argument: the default names
//
// Each request's seed, with its position as the offset, makes its tokens a function of the
// request alone: the batch it shares does not change them (checked at the end).
#define TOKENRACE_HPP_NO_LINK  // loader mode only: the program needs no tokenrace symbol
#include "tokenrace.hpp"

#include <cmath>
#include <cstdio>
#include <vector>

struct Request {
  uint64_t seed;
  float temperature;  // 0: greedy
  int32_t top_k;      // 0: off
  float top_p;        // 1: off
  std::vector<int32_t> tokens;
};

constexpr uint32_t vocab = 32000;

// Stands in for the model: the logits of the next token, from the request's last token.
static void forward(const Request& request, float* logits) {
  const int32_t last = request.tokens.empty() ? 1 : request.tokens.back();
  for (uint32_t i = 0; i < vocab; i++) logits[i] = 4.0f * std::sin(0.37f * float(i) + 0.01f * float(last));
}

// One step for `batch`: its logits, the per-row settings, and the draw.
static void step(tokenrace::Sampler& sampler, std::vector<Request*>& batch) {
  const uint32_t rows = uint32_t(batch.size());
  std::vector<float> logits(size_t(rows) * vocab), temperature(rows), top_p(rows);
  std::vector<int32_t> top_k(rows), tokens(rows);
  std::vector<uint64_t> seeds(rows), positions(rows);
  for (uint32_t r = 0; r < rows; r++) {
    const Request& request = *batch[r];
    forward(request, &logits[size_t(r) * vocab]);
    temperature[r] = request.temperature, top_k[r] = request.top_k, top_p[r] = request.top_p;
    seeds[r] = request.seed, positions[r] = request.tokens.size();
  }
  const tokenrace::DrawOptions options =
      tokenrace::DrawOptions().temperature(temperature).top_k(top_k).top_p(top_p).seeds(seeds).offsets(positions);
  sampler.draw(tokenrace::Logits::f32(logits.data(), rows, vocab), options, tokens.data());
  for (uint32_t r = 0; r < rows; r++) batch[r]->tokens.push_back(tokens[r]);
}

int main(int argc, char** argv) {
  try {
    const tokenrace::Library library = argc > 1 ? tokenrace::Library(argv[1]) : tokenrace::Library::open_default();
    std::printf("tokenrace %s (ABI %u) from %s\n", library.version().c_str(), library.abi_version(),
                library.path().c_str());
    // One sampler for the whole server: it is safe to share between threads.
    tokenrace::Sampler sampler(library, tokenrace::Config().vocab_size(vocab).max_rows(64));
    std::vector<Request> requests = {{11, 0.7f, 50, 0.9f, {}}, {12, 1.0f, 0, 0.95f, {}}, {13, 0.0f, 0, 1.0f, {}},
                                     {14, 0.8f, 40, 1.0f, {}}};
    std::vector<Request*> batch;
    for (Request& request : requests) batch.push_back(&request);
    for (int position = 0; position < 8; position++) step(sampler, batch);
    for (const Request& request : requests) {
      std::printf("request %llu:", static_cast<unsigned long long>(request.seed));
      for (int32_t token : request.tokens) std::printf(" %d", token);
      std::printf("\n");
    }

    Request alone = requests[0];
    alone.tokens.clear();
    std::vector<Request*> just_one = {&alone};
    for (int position = 0; position < 8; position++) step(sampler, just_one);
    const bool same = alone.tokens == requests[0].tokens;
    std::printf("request 11 served alone: %s\n", same ? "the same tokens" : "DIFFERENT tokens");
    return same ? 0 : 1;
  } catch (const tokenrace::LoadError& e) {
    std::fprintf(stderr, "%s\n", e.what());
  } catch (const tokenrace::Error& e) {
    std::fprintf(stderr, "tokenrace error (status %d): %s\n", int(e.status()), e.what());
  }
  return 1;
}
