// The C++ wrapper in linked mode (-ltokenrace): the shared checks on Library::linked(), and what
// only linked mode has (the constructors without a Library, the table of the real symbols).
#include "tokenrace.hpp"

#include "cpp_checks.hpp"

static void linked_mode_reaches_the_symbols() {
  const tokenrace::Library linked = tokenrace::Library::linked();
  CHECK(linked.is_linked() && linked.path().empty());
  CHECK(linked.api().draw == &tokenrace_draw && linked.api().pool_borrow == &tokenrace_pool_borrow);
  CHECK(linked.api().verify == &tokenrace_verify);
  CHECK(linked.same_code_as(tokenrace::Library::linked()));
  CHECK(tokenrace::Api::linked().abi_version() == tokenrace_abi_version());
}

static void constructors_default_to_the_linked_library() {
  tokenrace::Sampler sampler(tokenrace::Config().max_rows(16).seed(3));
  CHECK(sampler.library().is_linked());
  std::vector<float> logits(2 * 300, 0.0f);
  logits[42] = 25.0f;
  logits[300 + 299] = 25.0f;
  std::vector<float> temps = {0.0f, 0.8f};
  const std::vector<int32_t> tokens = sampler.draw(logits.data(), 2, 300, temps.data());
  CHECK(tokens[0] == 42 && tokens[1] == 299);
  CHECK(tokenrace::Sampler().config().max_rows == tokenrace_config_default().max_rows);

  tokenrace::NoisePool pool(tokenrace::PoolConfig().vocab_size(300).rows(4).seed(1));
  // This sampler accepts any vocabulary (vocab_size 0), a pool has one: refused by the library.
  CHECK_THROWS(sampler.attach_pool(pool), TOKENRACE_STATUS_INVALID_ARGUMENT, "differs from the sampler's vocab_size 0");
  tokenrace::Sampler same_vocab(tokenrace::Config().vocab_size(300).max_rows(2));
  same_vocab.attach_pool(pool);
  CHECK(same_vocab.draw(logits.data(), 2, 300, temps.data())[0] == 42 && same_vocab.stats().pool_rows == 1);
}

static void check_throws_the_linked_message() {
  tokenrace_sampler* none = nullptr;
  CHECK_THROWS(tokenrace::check(tokenrace_sampler_new(nullptr, nullptr)), TOKENRACE_STATUS_INVALID_ARGUMENT, "out");
  CHECK(none == nullptr);
  CHECK(tokenrace::Config().vocab_size(5).resolve().vocab_size == 5);
  CHECK(tokenrace::PoolConfig().vocab_size(6).resolve().vocab == 6);
}

int main() {
  try {
    checks::log_messages_reach_the_callback(tokenrace::Library::linked());
    linked_mode_reaches_the_symbols();
    constructors_default_to_the_linked_library();
    check_throws_the_linked_message();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected exception: %s\n", e.what());
    checks::failures++;
  }
  const int failures = checks::run_wrapper_checks(tokenrace::Library::linked());
  std::printf("test_cpp: %s\n", failures ? "FAILED" : "ok");
  return failures != 0;
}
