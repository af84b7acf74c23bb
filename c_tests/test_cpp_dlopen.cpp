// The C++ wrapper in loader mode: compiled with TOKENRACE_HPP_NO_LINK and linked without
// -ltokenrace (so the header refers to no tokenrace symbol), it loads the library with
// tokenrace::Library and runs the checks test_cpp.cpp runs in linked mode, then the loader's own:
// its errors, the default names, and the lifetimes.
//
// Arguments: the real library, a library reporting this ABI with almost no function, and one
// reporting ABI 999 (c_tests/fake_tokenrace.c). LD_LIBRARY_PATH holds the real one's directory.
#define TOKENRACE_HPP_NO_LINK
#include "tokenrace.hpp"

#include "cpp_checks.hpp"

// `path` must fail to load with `reason` and a message containing each of `needles`.
static void expect_load_error(const std::string& path, tokenrace::LoadError::Reason reason,
                              const std::vector<std::string>& needles) {
  try {
    tokenrace::Library library(path);
    std::fprintf(stderr, "%s: loaded, but should not have\n", path.c_str());
    checks::failures++;
  } catch (const tokenrace::LoadError& e) {
    bool ok = e.reason() == reason && e.path() == path;
    for (const std::string& needle : needles) ok = ok && std::strstr(e.what(), needle.c_str());
    if (!ok) {
      std::fprintf(stderr, "%s: reason %d, message \"%s\"\n", path.c_str(), int(e.reason()), e.what());
      checks::failures++;
    }
  }
}

static void load_errors_say_what_is_wrong(const std::string& partial, const std::string& other_abi) {
  using Reason = tokenrace::LoadError::Reason;
  const std::string nowhere = "/nonexistent/tokenrace/libtokenrace.so";
  expect_load_error(nowhere, Reason::cannot_open, {"cannot load " + nowhere, "No such file"});
  // A library of the right ABI that lacks functions: every missing one is named, no present one.
  expect_load_error(partial, Reason::missing_symbol, {partial + " lacks ", "tokenrace_draw", "tokenrace_pool_borrow", "tokenrace_verify"});
  try {
    tokenrace::Library library(partial);
  } catch (const tokenrace::LoadError& e) {
    CHECK(!std::strstr(e.what(), "tokenrace_version") && !std::strstr(e.what(), "tokenrace_abi_version"));
  }
  expect_load_error(other_abi, Reason::abi_mismatch,
                    {other_abi + " has ABI version 999", "expects " + std::to_string(TOKENRACE_ABI_VERSION)});
  // Not a tokenrace library at all.
  expect_load_error("libm.so.6", Reason::missing_symbol,
                    {"libm.so.6 lacks tokenrace_abi_version", "tokenrace library?"});
}

static void objects_outlive_their_library(const std::string& path) {
  std::vector<float> logits = checks::eighths(2 * 64, 7);
  logits[9] = 9.0f;
  const std::vector<float> temps = {0.0f, 1.0f};
  // The Library is a temporary: the sampler, the pool and the lease keep the library loaded.
  tokenrace::Sampler sampler(tokenrace::Library(path), tokenrace::Config().vocab_size(64).max_rows(2));
  tokenrace::NoisePool pool(tokenrace::Library(path), tokenrace::PoolConfig().vocab_size(64).rows(4));
  tokenrace::Lease lease = pool.borrow(2);
  { tokenrace::NoisePool gone = std::move(pool); }
  const std::vector<int32_t> tokens =
      sampler.draw(tokenrace::Logits::f32(logits.data(), 2, 64),
                   tokenrace::DrawOptions().temperature(temps).noise(lease));
  CHECK(tokens[0] == 9 && tokens[1] == checks::race_on(&logits[64], lease.row(1), lease.kind(), 64, 1.0f));
  lease.release();

  // Two Library objects of one file reach the same code: their objects work together.
  tokenrace::Library first(path), second(path);
  CHECK(first.same_code_as(second) && !first.is_linked() && first.path() == path);
  tokenrace::Sampler attached(first, tokenrace::Config().vocab_size(64).max_rows(2));
  tokenrace::NoisePool shared(second, tokenrace::PoolConfig().vocab_size(64).rows(4));
  attached.attach_pool(shared);
  attached.draw(tokenrace::Logits::f32(logits.data(), 2, 64));
  CHECK(attached.stats().pool_rows == 2);
}

static void the_default_names_are_searched() {
  const tokenrace::Library library = tokenrace::Library::open_default();
  const std::string& path = library.path();
  CHECK(path == tokenrace::Library::default_names[0] || path == tokenrace::Library::default_names[1]);
  CHECK(library.abi_version() == TOKENRACE_ABI_VERSION);
}

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s LIBTOKENRACE FAKE_SAME_ABI FAKE_OTHER_ABI\n", argv[0]);
    return 2;
  }
  const std::string path = argv[1];
  try {
    checks::log_messages_reach_the_callback(tokenrace::Library(path));
    load_errors_say_what_is_wrong(argv[2], argv[3]);
    objects_outlive_their_library(path);
    the_default_names_are_searched();
    checks::run_wrapper_checks(tokenrace::Library(path));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected exception: %s\n", e.what());
    checks::failures++;
  }
  std::printf("test_cpp_dlopen: %s\n", checks::failures ? "FAILED" : "ok");
  return checks::failures != 0;
}
