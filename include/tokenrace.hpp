// tokenrace.hpp: a header-only C++17 wrapper over the C ABI in tokenrace.h.
//
// Two ways to reach the library, one set of classes:
//
//   Linked mode (the default): link with -ltokenrace; the classes call the C functions directly.
//
//     tokenrace::Sampler sampler(tokenrace::Config().vocab_size(vocab).max_rows(64).seed(1));
//     std::vector<int32_t> tokens = sampler.draw(tokenrace::Logits::f32(logits, rows, vocab),
//                                                tokenrace::DrawOptions().temperature(temps));
//
//   The whole sampling step (histories, penalties, bias, allowed and banned lists, a grammar
//   bitmask) and every output of the C call go through DrawOptions; a per-row value is a span of
//   the caller's (`temperature(temps)`) or one value for every row (`temperature(0.7f)`):
//
//     tokenrace::DrawOptions().temperature(0.7f).output_tokens(ids, offsets).repetition_penalty(1.1f)
//
//   Speculative decoding: Sampler::verify checks draft tokens against the target rows (one row
//   per draft token and one bonus row per request, request after request).
//
//     tokenrace::VerifyResult r = sampler.verify(tokenrace::Logits::f32(target, rows, vocab),
//                                                draft_counts, draft_tokens,
//                                                tokenrace::VerifyOptions().seeds(seeds));
//     // r.emitted(i): request i's accepted drafts, then its recovered or bonus token.
//
//   Loader mode: tokenrace::Library dlopen()s the shared object at run time and resolves every
//   function into a table (tokenrace::Api); pass it as the first argument of the constructors.
//
//     tokenrace::Library library("/opt/tokenrace/libtokenrace.so");   // or Library::open_default()
//     tokenrace::Sampler sampler(library, tokenrace::Config().vocab_size(vocab).max_rows(64));
//
//   Define TOKENRACE_HPP_NO_LINK before including this header to use loader mode only: the
//   header then refers to no tokenrace symbol, so the program links without -ltokenrace (with
//   -ldl on glibc older than 2.34), and the constructors without a Library are not declared.
//
// Lifetimes: every object made from a Library (Sampler, NoisePool, Lease) holds a reference to
// the loaded library, so the library is closed (dlclose) only after the Library and the last of
// them are gone; a Library may be a temporary. A Lease may outlive its NoisePool.
//
// Errors: a failed call throws tokenrace::Error, whose status() is the tokenrace_status and
// whose what() is a copy of tokenrace_last_error() taken when the call failed (it names the
// argument, e.g. "tokenrace_draw: batch.top_p[3]: 1.5 is not in (0, 1]"): an Error stays valid
// for as long as it lives, on any thread, whatever is called after it. (The C pointer itself is
// valid only until the next call that returns a status on the same thread.) Loading throws tokenrace::LoadError
// (reason(): cannot_open, missing_symbol, abi_mismatch). Destructors never throw.
//
// Threads: a Sampler and a NoisePool may be used from several threads at once (by reference);
// a Lease, a Config, DrawOptions and VerifyOptions are plain values for one thread at a time.
#pragma once
#include "tokenrace.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace tokenrace {

// Every function of the C ABI, by its name without the "tokenrace_" prefix. One list, so that
// the table, the linked table and the loader cannot disagree on which functions exist; a
// function added to tokenrace.h is added here (the loader then requires it).
#define TOKENRACE_HPP_FUNCTIONS(X) \
  X(abi_version)                   \
  X(version)                       \
  X(last_error)                    \
  X(set_log_callback)              \
  X(simd_level)                    \
  X(config_default)                \
  X(config_from_env)               \
  X(sampler_new)                   \
  X(sampler_free)                  \
  X(sampler_simd_level)            \
  X(sampler_get_stats)             \
  X(draw)                          \
  X(pool_config_default)           \
  X(pool_config_from_env)          \
  X(pool_new)                      \
  X(pool_free)                     \
  X(pool_shutdown)                 \
  X(pool_borrow)                   \
  X(pool_release)                  \
  X(pool_get_stats)                \
  X(sampler_attach_pool)           \
  X(requests_new)                  \
  X(requests_free)                 \
  X(requests_add)                  \
  X(requests_remove)               \
  X(requests_reset)                \
  X(requests_append)               \
  X(requests_append_strided)       \
  X(requests_len)                  \
  X(requests_output_len)           \
  X(request_params_default)        \
  X(requests_set_params)           \
  X(verify)                        \
  X(watermark_seeds)               \
  X(watermark_detect)              \
  X(watermark_verify_seeds)        \
  X(shard_top)                     \
  X(shard_combine_top)             \
  X(shard_race)                    \
  X(shard_finish)                  \
  X(shard_top_k_candidates)        \
  X(shard_cut_start)               \
  X(shard_cut_pending)             \
  X(shard_cut_round)               \
  X(shard_cut_advance)             \
  X(shard_race_cut)                \
  X(shard_logprob_partials)        \
  X(shard_logprobs)                \
  X(score)                         \
  X(draw_greedy)

// The C functions as a table of pointers: api.draw is tokenrace_draw, and so on. The types come
// from the declarations in tokenrace.h through decltype, which does not refer to the symbols.
struct Api {
#define TOKENRACE_HPP_API_MEMBER(name) decltype(&::tokenrace_##name) name = nullptr;
  TOKENRACE_HPP_FUNCTIONS(TOKENRACE_HPP_API_MEMBER)
#undef TOKENRACE_HPP_API_MEMBER

#ifndef TOKENRACE_HPP_NO_LINK
  // The functions linked into this program.
  static Api linked() noexcept {
    Api api;
#define TOKENRACE_HPP_API_LINKED(name) api.name = &::tokenrace_##name;
    TOKENRACE_HPP_FUNCTIONS(TOKENRACE_HPP_API_LINKED)
#undef TOKENRACE_HPP_API_LINKED
    return api;
  }
#endif
};

// A failed tokenrace call: its status and the library's message.
class Error : public std::runtime_error {
 public:
  Error(tokenrace_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  tokenrace_status status() const noexcept { return status_; }

 private:
  tokenrace_status status_;
};

// A library that could not be loaded: what() says which file and why.
class LoadError : public std::runtime_error {
 public:
  enum class Reason {
    cannot_open,     // dlopen failed (no such file, not a shared object, a missing dependency)
    missing_symbol,  // a tokenrace function is not in it (what() names every missing one)
    abi_mismatch,    // its tokenrace_abi_version() differs from this header's
  };
  LoadError(Reason reason, std::string path, const std::string& message)
      : std::runtime_error(message), reason_(reason), path_(std::move(path)) {}
  Reason reason() const noexcept { return reason_; }
  const std::string& path() const noexcept { return path_; }

 private:
  Reason reason_;
  std::string path_;
};

namespace detail {

// The loaded library: its function table and the dlopen handle it closes last (null when
// linked). Shared by the Library and every object made from it, never changed after loading.
struct LibraryState {
  LibraryState(const Api& api_, void* handle_, std::string path_)
      : api(api_), handle(handle_), path(std::move(path_)) {}
  ~LibraryState() {
    if (handle) dlclose(handle);
  }
  LibraryState(const LibraryState&) = delete;
  LibraryState& operator=(const LibraryState&) = delete;

  Api api;
  void* handle;
  std::string path;
};

inline std::string dl_error_text() {
  const char* text = dlerror();
  return text ? text : "unknown dlerror";
}

inline std::string c_string(const char* text) { return text ? text : ""; }

// The program's log function (Library::set_log_callback), reached from the library's threads
// through the trampoline. Both live on the heap and are never destroyed: a library thread may log
// while the program's static objects are being destroyed at exit.
using LogFunction = std::function<void(tokenrace_log_level, const std::string& target, const std::string& message)>;
inline std::mutex& log_mutex() {
  static std::mutex* mutex = new std::mutex;
  return *mutex;
}
inline std::shared_ptr<const LogFunction>& log_function() {
  static auto* function = new std::shared_ptr<const LogFunction>;
  return *function;
}
inline void log_trampoline(uint32_t level, const char* target, const char* message, void*) {
  std::shared_ptr<const LogFunction> function;
  {
    std::lock_guard<std::mutex> lock(log_mutex());
    function = log_function();
  }
  if (!function) return;
  try {
    (*function)(tokenrace_log_level(level), target ? target : "", message ? message : "");
  } catch (...) {
    // The library must never see an exception: a throwing log function loses the message.
  }
}

}  // namespace detail

// The tokenrace library, linked or loaded: a cheap, copyable reference to one function table.
class Library {
 public:
  // The default file names, tried in order by open_default().
  static constexpr const char* default_names[] = {"libtokenrace.so.0.1", "libtokenrace.so"};

  // dlopen()s `path` (a bare name is searched as dlopen searches: LD_LIBRARY_PATH, the cache,
  // the system directories), checks its ABI version and resolves every function.
  explicit Library(const std::string& path) : state_(load(path)) {}

  // The first of default_names that loads; the LoadError names every attempt.
  static Library open_default() {
    std::string attempts;
    for (const char* name : default_names) {
      try {
        return Library(name);
      } catch (const LoadError& e) {
        // A name that does not open moves on to the next; one that opens but is the wrong
        // library (another ABI, functions missing) is reported as it is.
        if (e.reason() != LoadError::Reason::cannot_open) throw;
        attempts += std::string(attempts.empty() ? "" : "; ") + e.what();
      }
    }
    throw LoadError(LoadError::Reason::cannot_open, default_names[0], attempts);
  }

#ifndef TOKENRACE_HPP_NO_LINK
  // The library linked into this program (what the constructors without a Library use).
  static Library linked() {
    static const std::shared_ptr<const detail::LibraryState> state =
        std::make_shared<detail::LibraryState>(Api::linked(), nullptr, "");
    return Library(state);
  }
#endif

  const Api& api() const noexcept { return state_->api; }
  // The path given to dlopen; "" when linked.
  const std::string& path() const noexcept { return state_->path; }
  bool is_linked() const noexcept { return state_->handle == nullptr; }
  // Whether both reach the same code (two Library objects of one file do).
  bool same_code_as(const Library& other) const noexcept { return api().draw == other.api().draw; }

  uint32_t abi_version() const { return api().abi_version(); }
  std::string version() const { return detail::c_string(api().version()); }
  // The SIMD level a sampler made from the environment would use ("avx512", "avx2", ...).
  std::string simd_level() const { return detail::c_string(api().simd_level()); }

  // Sends the library's log messages (level, target, text) to `function` instead of stderr; an
  // empty function restores stderr. It is called from any thread of the library, possibly from
  // several at once, and may throw nothing into the library (an exception is caught and the
  // message dropped). One function per process: the last one set wins.
  // TOKENRACE_LOG_LEVEL (default: warnings) says which messages are produced.
  void set_log_callback(std::function<void(tokenrace_log_level, const std::string&, const std::string&)> function) const {
    auto shared = function ? std::make_shared<const detail::LogFunction>(std::move(function)) : nullptr;
    {
      std::lock_guard<std::mutex> lock(detail::log_mutex());
      detail::log_function() = shared;
    }
    api().set_log_callback(shared ? &detail::log_trampoline : nullptr, nullptr);
  }

  // Throws Error with this library's message when `status` is not OK.
  void check(tokenrace_status status) const {
    if (status != TOKENRACE_STATUS_OK) throw Error(status, detail::c_string(api().last_error()));
  }

 private:
  explicit Library(std::shared_ptr<const detail::LibraryState> state) : state_(std::move(state)) {}

  static std::shared_ptr<const detail::LibraryState> load(const std::string& path) {
    dlerror();  // clear a stale message
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      throw LoadError(LoadError::Reason::cannot_open, path,
                      "tokenrace::Library: cannot load " + path + ": " + detail::dl_error_text());
    }
    // Owned by `state` from here on, so that every failure below closes it.
    std::shared_ptr<detail::LibraryState> state;
    try {
      state = std::make_shared<detail::LibraryState>(Api(), handle, path);
    } catch (...) {
      dlclose(handle);
      throw;
    }
    Api& api = state->api;  // filled here, before anyone else sees it
    std::string missing;
#define TOKENRACE_HPP_API_RESOLVE(name) resolve(handle, "tokenrace_" #name, api.name, missing);
    TOKENRACE_HPP_FUNCTIONS(TOKENRACE_HPP_API_RESOLVE)
#undef TOKENRACE_HPP_API_RESOLVE
    // The version is judged before the missing functions: a library of another ABI may well
    // lack some, and the mismatch is then the reason to report.
    if (!api.abi_version) throw missing_symbols(path, "tokenrace_abi_version", " (is it a tokenrace library?)");
    const uint32_t found = api.abi_version();
    if (found != TOKENRACE_ABI_VERSION) {
      throw LoadError(LoadError::Reason::abi_mismatch, path,
                      "tokenrace::Library: " + path + " has ABI version " + std::to_string(found) +
                          ", this tokenrace.hpp expects " + std::to_string(TOKENRACE_ABI_VERSION) +
                          " (TOKENRACE_ABI_VERSION): use the library and headers of one release");
    }
    if (!missing.empty()) throw missing_symbols(path, missing, "");
    return state;
  }

  template <class Function>
  static void resolve(void* handle, const char* name, Function& slot, std::string& missing) {
    void* symbol = dlsym(handle, name);
    if (!symbol) {
      missing += std::string(missing.empty() ? "" : ", ") + name;
      return;
    }
    // POSIX guarantees that a data pointer from dlsym converts to a function pointer; memcpy says
    // so without the cast that -Wpedantic rejects.
    static_assert(sizeof slot == sizeof symbol, "function and data pointers differ in size");
    std::memcpy(&slot, &symbol, sizeof slot);
  }

  static LoadError missing_symbols(const std::string& path, const std::string& missing, const char* hint) {
    return LoadError(LoadError::Reason::missing_symbol, path,
                     "tokenrace::Library: " + path + " lacks " + missing + hint);
  }

  std::shared_ptr<const detail::LibraryState> state_;
};

#ifndef TOKENRACE_HPP_NO_LINK
// Throws Error with the linked library's message when `status` is not OK.
inline void check(tokenrace_status status) { Library::linked().check(status); }
#endif

// Sampler settings: the values set here over the TOKENRACE_* variables (docs/configuration.md)
// over the library's defaults, as the Python binding does; resolve() combines them. A setting
// left unset keeps what the environment or the default says.
class Config {
 public:
  Config& vocab_size(uint32_t v) { return set(vocab_size_, v); }
  Config& max_rows(uint32_t v) { return set(max_rows_, v); }
  Config& threads(uint32_t v) { return set(threads_, v); }
  Config& seed(uint64_t v) { return set(seed_, v); }
  Config& simd(tokenrace_simd v) { return set(simd_, v); }
  Config& greedy_below(float v) { return set(greedy_below_, v); }
  Config& log_level(tokenrace_log_level v) { return set(log_level_, v); }
  Config& noise(tokenrace_noise_source v) { return set(noise_, v); }
  Config& pool_rows(uint32_t v) { return set(pool_rows_, v); }
  // Whether top-k, top-p and min-p judge the tempered distribution (TEMPERATURE_FIRST, vLLM's,
  // the default) or the untempered one (FILTERS_FIRST, llama.cpp's chain).
  Config& filter_order(tokenrace_filter_order v) { return set(filter_order_, v); }
  // false: start from tokenrace_config_default(), ignoring the TOKENRACE_* variables.
  Config& use_environment(bool v) { use_environment_ = v; return *this; }

  // The tokenrace_config these settings give with `library`; a bad TOKENRACE_* variable throws
  // Error (INVALID_CONFIG, naming it). The values themselves are checked by the sampler.
  tokenrace_config resolve(const Library& library) const {
    tokenrace_config c = start(library);
    if (vocab_size_) c.vocab_size = *vocab_size_;
    if (max_rows_) c.max_rows = *max_rows_;
    if (threads_) c.threads = *threads_;
    if (seed_) {
      c.seed = *seed_;
      c.has_seed = 1;
    }
    if (simd_) c.simd = *simd_;
    if (greedy_below_) c.greedy_below = *greedy_below_;
    if (log_level_) c.log_level = *log_level_;
    if (noise_) c.noise = *noise_;
    if (pool_rows_) c.pool_rows = *pool_rows_;
    if (filter_order_) c.filter_order = *filter_order_;
    return c;
  }
#ifndef TOKENRACE_HPP_NO_LINK
  tokenrace_config resolve() const { return resolve(Library::linked()); }
#endif

 private:
  template <class T, class V>
  Config& set(std::optional<T>& field, V value) {
    field = value;
    return *this;
  }

  tokenrace_config start(const Library& library) const {
    if (!use_environment_) return library.api().config_default();
    tokenrace_config c{};
    c.struct_size = sizeof c;
    library.check(library.api().config_from_env(&c));
    return c;
  }

  std::optional<uint32_t> vocab_size_, max_rows_, threads_, pool_rows_;
  std::optional<uint64_t> seed_;
  std::optional<tokenrace_simd> simd_;
  std::optional<float> greedy_below_;
  std::optional<tokenrace_log_level> log_level_;
  std::optional<tokenrace_noise_source> noise_;
  std::optional<tokenrace_filter_order> filter_order_;
  bool use_environment_ = true;
};

// Noise pool settings, resolved like Config over the TOKENRACE_POOL_* variables. vocab_size
// must be set (here or by TOKENRACE_POOL_VOCAB).
class PoolConfig {
 public:
  PoolConfig& vocab_size(uint32_t v) { return set(vocab_size_, v); }
  PoolConfig& rows(uint32_t v) { return set(rows_, v); }
  PoolConfig& kind(tokenrace_noise_kind v) { return set(kind_, v); }
  PoolConfig& threads(uint32_t v) { return set(threads_, v); }
  PoolConfig& seed(uint64_t v) { return set(seed_, v); }
  PoolConfig& policy(tokenrace_pool_policy v) { return set(policy_, v); }
  PoolConfig& timeout_ms(uint64_t v) { return set(timeout_ms_, v); }
  // false: start from tokenrace_pool_config_default(), ignoring the TOKENRACE_POOL_* variables.
  PoolConfig& use_environment(bool v) { use_environment_ = v; return *this; }

  tokenrace_pool_config resolve(const Library& library) const {
    tokenrace_pool_config c = start(library);
    if (vocab_size_) c.vocab = *vocab_size_;
    if (rows_) c.rows = *rows_;
    if (kind_) c.kind = *kind_;
    if (threads_) c.threads = *threads_;
    if (seed_) {
      c.seed = *seed_;
      c.has_seed = 1;
    }
    if (policy_) c.policy = *policy_;
    if (timeout_ms_) c.timeout_ms = *timeout_ms_;
    return c;
  }
#ifndef TOKENRACE_HPP_NO_LINK
  tokenrace_pool_config resolve() const { return resolve(Library::linked()); }
#endif

 private:
  template <class T, class V>
  PoolConfig& set(std::optional<T>& field, V value) {
    field = value;
    return *this;
  }

  tokenrace_pool_config start(const Library& library) const {
    if (!use_environment_) return library.api().pool_config_default();
    tokenrace_pool_config c{};
    c.struct_size = sizeof c;
    library.check(library.api().pool_config_from_env(&c));
    return c;
  }

  std::optional<uint32_t> vocab_size_, rows_, threads_;
  std::optional<uint64_t> seed_, timeout_ms_;
  std::optional<tokenrace_noise_kind> kind_;
  std::optional<tokenrace_pool_policy> policy_;
  bool use_environment_ = true;
};

// Rows of logits, read in place: `rows` rows of `vocab` values, `row_stride` elements apart
// (0: contiguous). bf16 and f16 values are their 16-bit patterns.
struct Logits {
  const void* data = nullptr;
  tokenrace_dtype dtype = TOKENRACE_DTYPE_F32;
  uint32_t rows = 0;
  uint32_t vocab = 0;
  uint64_t row_stride = 0;

  static Logits f32(const float* data, uint32_t rows, uint32_t vocab, uint64_t row_stride = 0) {
    return {data, TOKENRACE_DTYPE_F32, rows, vocab, row_stride};
  }
  static Logits bf16(const uint16_t* data, uint32_t rows, uint32_t vocab, uint64_t row_stride = 0) {
    return {data, TOKENRACE_DTYPE_BF16, rows, vocab, row_stride};
  }
  static Logits f16(const uint16_t* data, uint32_t rows, uint32_t vocab, uint64_t row_stride = 0) {
    return {data, TOKENRACE_DTYPE_F16, rows, vocab, row_stride};
  }
};

class Lease;

namespace detail {

// Whether a setter's argument is one value for every row (a number) rather than a span: the
// scalar overloads are templates so that a literal 0 is a number, not a null pointer.
template <class V>
using if_number = std::enable_if_t<std::is_arithmetic<V>::value, int>;

// The spans of the C structs have no length: the wrapper's checks say "unknown" for a bare
// pointer, whose length the library then trusts as a C caller's.
inline constexpr size_t unknown_size = static_cast<size_t>(-1);

}  // namespace detail

// Read-only values in the caller's memory: a pointer and, when the wrapper can know it, how many
// values it holds (a vector, or a pointer and a length). A bare pointer is passed on as it is
// (the library reads the values the batch's sizes say); a known length is checked before the
// call. A temporary vector is refused at compile time: it would be gone before the draw.
template <class T>
class Span {
 public:
  // Implicit, so that a setter takes a pointer or a vector as it is.
  Span() = default;
  Span(std::nullptr_t) {}
  // A bare pointer: its length is unknown to the wrapper.
  Span(const T* data) : data_(data) {}
  Span(const T* data, size_t size) : data_(data), size_(size) {}
  Span(const std::vector<T>& values) : data_(values.data()), size_(values.size()) {}
  Span(std::vector<T>&&) = delete;

  const T* data() const noexcept { return data_; }
  // Whether size() is known (a vector, or a pointer and a length).
  bool has_size() const noexcept { return size_ != detail::unknown_size; }
  size_t size() const noexcept { return size_; }

 private:
  const T* data_ = nullptr;
  size_t size_ = detail::unknown_size;
};

// Writable values in the caller's memory, as Span: a pointer and, when the wrapper can know it,
// how many values it has room for (a vector, or a pointer and a length), checked before the call.
template <class T>
class MutableSpan {
 public:
  MutableSpan() = default;
  MutableSpan(std::nullptr_t) {}
  MutableSpan(T* data) : data_(data) {}
  MutableSpan(T* data, size_t size) : data_(data), size_(size) {}
  MutableSpan(std::vector<T>& values) : data_(values.data()), size_(values.size()) {}
  MutableSpan(std::vector<T>&&) = delete;

  T* data() const noexcept { return data_; }
  bool has_size() const noexcept { return size_ != detail::unknown_size; }
  size_t size() const noexcept { return size_; }

 private:
  T* data_ = nullptr;
  size_t size_ = detail::unknown_size;
};

// A C batch struct with the memory its scalar options were expanded into (one value per row,
// allocated for this call): pass c() to the C call while the PreparedBatch lives. Copies share
// that memory. c() of a temporary is refused at compile time, as its pointers would dangle.
template <class CBatch>
class PreparedBatch {
 public:
  const CBatch& c() const& noexcept { return c_; }
  const CBatch& c() const&& = delete;
  // Usable where the C struct is, as the general draw and verify calls take it.
  operator const CBatch&() const& noexcept { return c_; }
  operator const CBatch&() const&& = delete;

 private:
  friend class DrawOptions;
  friend class VerifyOptions;

  // `count` copies of `value` in memory this batch owns.
  template <class T>
  const T* repeat(T value, size_t count) {
    std::shared_ptr<T> values(new T[count], std::default_delete<T[]>());
    std::fill_n(values.get(), count, value);
    buffers_.push_back(values);
    return values.get();
  }

  CBatch c_{};
  std::vector<std::shared_ptr<void>> buffers_;
};

// A draw's batch (tokenrace_batch) with its expanded scalars.
using DrawBatch = PreparedBatch<tokenrace_batch>;
// A verify call's batch (tokenrace_verify_batch) with its expanded scalars.
using VerifyBatch = PreparedBatch<tokenrace_verify_batch>;

namespace detail {

// An option of one value per row (or per request): unset (the library's default for every
// row), a span of one value each, or one value for every row (expanded at the call).
template <class T>
struct PerRow {
  Span<T> values;
  std::optional<T> every_row;
};

template <class T>
void set_values(PerRow<T>& field, Span<T> values) {
  field.values = values;
  field.every_row.reset();
}
template <class T, class V>
void set_every_row(PerRow<T>& field, V value) {
  field.values = Span<T>();
  field.every_row = static_cast<T>(value);
}

inline Error invalid_argument(const char* owner, const std::string& what) {
  return Error(TOKENRACE_STATUS_INVALID_ARGUMENT, std::string(owner) + ": " + what);
}

// The pointer the C struct gets for a span of `want` values (null when unset): a known length
// must be `want`.
template <class T>
const T* checked_span(Span<T> values, const char* owner, const char* name, size_t want, const char* unit) {
  if (values.data() && values.has_size() && values.size() != want) {
    throw invalid_argument(owner, std::string(name) + " has " + std::to_string(values.size()) + " values for " +
                                      std::to_string(want) + " " + unit);
  }
  return values.data();
}

// Whether (count - 1) x stride + width elements fit in `available`: the extent of `count` rows
// of `width` values `stride` apart (stride >= width).
inline bool rows_fit(size_t available, uint64_t count, uint64_t width, uint64_t stride) {
  if (count == 0) return true;
  const uint64_t gaps = count - 1;
  if (stride && gaps > (UINT64_MAX - width) / stride) return false;
  return available >= gaps * stride + width;
}

}  // namespace detail

// The optional inputs and outputs of a draw: every field of tokenrace_batch, and the outputs of
// tokenrace_output besides the tokens and flags. Per-row values are unset (their default for
// every row), one value for every row (`temperature(0.7f)`), or a Span of one value per row
// (a pointer, or a vector whose length the draw checks). Token lists are CSR, as in the C
// batch: ids of every row one after the other and rows + 1 offsets, row r's entries at
// offsets[r] .. offsets[r + 1]. Nothing is copied (but order()'s few stage ids): the options
// point into the caller's arrays, which must live until the draw returns. A draw has
// Logits::rows rows, or row_index's length when one is set (draw_rows()).
class DrawOptions {
 public:
  // ---- temperature, seeds, filters: per row ---------------------------------------------------

  // Temperature (default 1.0); below the sampler's greedy_below the row is greedy.
  DrawOptions& temperature(Span<float> v) { return values(temperature_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& temperature(V every_row) { return scalar(temperature_, every_row); }
  // Seed: a seeded row draws the same token whatever else is in the batch.
  DrawOptions& seeds(Span<uint64_t> v) { return values(seeds_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& seeds(V every_row) { return scalar(seeds_, every_row); }
  // Offset mixed into the seed, e.g. the token's position (default 0).
  DrawOptions& offsets(Span<uint64_t> v) { return values(offsets_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& offsets(V every_row) { return scalar(offsets_, every_row); }
  // Nonzero: the row uses its seed (default: every row, when seeds are set).
  DrawOptions& seeded(Span<uint8_t> v) { return values(seeded_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& seeded(V every_row) { return scalar(seeded_, every_row); }
  // top-k (k <= 0 or k >= vocab: off), top-p in (0, 1] (1: off), min-p in [0, 1] (0: off). The
  // sampler's filter_order (Config) says whether they judge the tempered distribution.
  DrawOptions& top_k(Span<int32_t> v) { return values(top_k_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& top_k(V every_row) { return scalar(top_k_, every_row); }
  DrawOptions& top_p(Span<float> v) { return values(top_p_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& top_p(V every_row) { return scalar(top_p_, every_row); }
  DrawOptions& min_p(Span<float> v) { return values(min_p_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& min_p(V every_row) { return scalar(min_p_, every_row); }
  // llama.cpp's top-nσ, finite (<= 0: off): keeps the logits >= max - n * sigma of the row's
  // finite logits; the same set before and after the temperature.
  DrawOptions& top_n_sigma(Span<float> v) { return values(top_n_sigma_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& top_n_sigma(V every_row) { return scalar(top_n_sigma_, every_row); }
  // llama.cpp's min_keep (>= 0): top-p, min-p, typical and XTC keep at least that many tokens.
  DrawOptions& min_keep(Span<int32_t> v) { return values(min_keep_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& min_keep(V every_row) { return scalar(min_keep_, every_row); }
  // llama.cpp's locally typical sampling, in (0, 1] (1: off).
  DrawOptions& typical_p(Span<float> v) { return values(typical_p_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& typical_p(V every_row) { return scalar(typical_p_, every_row); }
  // llama.cpp's XTC: probability and threshold in [0, 1] (off: probability 0 or threshold > 0.5).
  // The coin comes from the row's key (its seed and offset, or the sampler's stream).
  DrawOptions& xtc_probability(Span<float> v) { return values(xtc_probability_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& xtc_probability(V every_row) { return scalar(xtc_probability_, every_row); }
  DrawOptions& xtc_threshold(Span<float> v) { return values(xtc_threshold_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& xtc_threshold(V every_row) { return scalar(xtc_threshold_, every_row); }
  // llama.cpp's dynamic temperature: range >= 0 (0: off) and exponent >= 0 (default 1).
  DrawOptions& dynatemp_range(Span<float> v) { return values(dynatemp_range_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& dynatemp_range(V every_row) { return scalar(dynatemp_range_, every_row); }
  DrawOptions& dynatemp_exponent(Span<float> v) { return values(dynatemp_exponent_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& dynatemp_exponent(V every_row) { return scalar(dynatemp_exponent_, every_row); }

  // The order of the filter stages for every row (docs/semantics.md, Filter order): each stage
  // at most once, each on what the ones before it kept; a stage before TOKENRACE_STAGE_TEMPERATURE
  // judges softmax(x), one after it softmax(x / T); the temperature last when left out. Empty
  // (the default): the sampler's filter_order. llama.cpp's default chain:
  //   order({TOKENRACE_STAGE_TOP_K, TOKENRACE_STAGE_TYPICAL, TOKENRACE_STAGE_TOP_P,
  //          TOKENRACE_STAGE_MIN_P, TOKENRACE_STAGE_XTC, TOKENRACE_STAGE_TEMPERATURE})
  DrawOptions& order(const tokenrace_stage* stages, size_t count) {
    order_.assign(stages, stages + count);
    return *this;
  }
  DrawOptions& order(std::initializer_list<tokenrace_stage> stages) {
    return order(stages.begin(), stages.size());
  }

  // ---- the sampling step: histories, penalties, bias, allowed and banned lists, bitmask -------

  // The prompt's token ids, CSR (the repetition penalty counts them).
  DrawOptions& prompt_tokens(Span<int32_t> ids, Span<uint64_t> offsets) {
    prompt_ = {ids, offsets};
    return *this;
  }
  // The tokens generated so far, CSR (all three penalties count them).
  DrawOptions& output_tokens(Span<int32_t> ids, Span<uint64_t> offsets) {
    output_ = {ids, offsets};
    return *this;
  }
  // Repetition penalty r > 0 (1: off): a logit of a token in the row's prompt or output is
  // divided by r when positive, multiplied when negative.
  DrawOptions& repetition_penalty(Span<float> v) { return values(repetition_penalty_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& repetition_penalty(V every_row) { return scalar(repetition_penalty_, every_row); }
  // Frequency penalty, finite (0: off): subtracted once per occurrence in the row's output.
  DrawOptions& frequency_penalty(Span<float> v) { return values(frequency_penalty_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& frequency_penalty(V every_row) { return scalar(frequency_penalty_, every_row); }
  // Presence penalty, finite (0: off): subtracted once from a token present in the row's output.
  DrawOptions& presence_penalty(Span<float> v) { return values(presence_penalty_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& presence_penalty(V every_row) { return scalar(presence_penalty_, every_row); }
  // Penalty window n >= 0 (0: every token): only the last n tokens of the row's prompt ++
  // output count for the three penalties. Unlike llama.cpp's penalty_last_n, 0 does not turn
  // the penalties off, and -1 is refused.
  DrawOptions& penalty_last_n(Span<int32_t> v) { return values(penalty_last_n_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& penalty_last_n(V every_row) { return scalar(penalty_last_n_, every_row); }
  // Logit bias, CSR of (id, value) pairs: a finite value is added, -inf bans; pairs of one id
  // add up.
  DrawOptions& logit_bias(Span<int32_t> ids, Span<float> values, Span<uint64_t> offsets) {
    bias_ = {ids, offsets};
    bias_values_ = values;
    return *this;
  }
  // The only tokens a row may draw, CSR, for the rows allowed_rows marks (default: every row).
  DrawOptions& allowed_tokens(Span<int32_t> ids, Span<uint64_t> offsets) {
    allowed_ = {ids, offsets};
    return *this;
  }
  // Nonzero: the row draws only from its allowed list (an empty list allows nothing).
  DrawOptions& allowed_rows(Span<uint8_t> v) { return values(allowed_rows_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& allowed_rows(V every_row) { return scalar(allowed_rows_, every_row); }
  // Tokens a row may not draw, CSR (bad words of one token, min_tokens' stop ids).
  DrawOptions& banned_tokens(Span<int32_t> ids, Span<uint64_t> offsets) {
    banned_ = {ids, offsets};
    return *this;
  }
  // min_tokens n >= 0 (0: off): while the row's output (output_tokens, in this call) holds
  // fewer than n tokens, its stop tokens (CSR) are banned as banned_tokens' are.
  DrawOptions& min_tokens(Span<int32_t> v) { return values(min_tokens_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& min_tokens(V every_row) { return scalar(min_tokens_, every_row); }
  DrawOptions& stop_tokens(Span<int32_t> ids, Span<uint64_t> offsets) {
    stop_ = {ids, offsets};
    return *this;
  }
  // Bad words, a two-level CSR: word k is ids[word_offsets[k]..word_offsets[k + 1]] (at least
  // one token), row r's words are words row_offsets[r]..row_offsets[r + 1]. A word bans its last
  // token where the row's output (output_tokens, in this call) ends with its other tokens; a
  // word of one token always bans it (vLLM's rule).
  DrawOptions& bad_words(Span<int32_t> ids, Span<uint64_t> word_offsets, Span<uint64_t> row_offsets) {
    bad_words_ids_ = ids;
    bad_word_offsets_ = word_offsets;
    bad_words_row_offsets_ = row_offsets;
    return *this;
  }
  // Forced tokens: a row whose entry is in [0, vocab) returns it (logprobs, rank and top-n as if
  // drawn; its noise consumed as a drawn row's, so the other rows draw what they would), -1
  // draws the row. A forced token the step bans is flagged TOKENRACE_FLAG_FORCED_BANNED.
  DrawOptions& forced_tokens(Span<int32_t> v) { return values(forced_tokens_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& forced_tokens(V every_row) { return scalar(forced_tokens_, every_row); }
  // llama.cpp's DRY: a token that would extend a sequence the row's history (prompt_tokens then
  // output_tokens, the last dry_penalty_last_n of them; -1: all, 0: off) repeats, n >=
  // dry_allowed_length tokens long, loses dry_multiplier * dry_base^(n - dry_allowed_length)
  // after the other penalties. Multiplier >= 0 (0: off), base finite (< 1: off; default 1.75),
  // allowed length >= 0 (default 2).
  DrawOptions& dry_multiplier(Span<float> v) { return values(dry_multiplier_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& dry_multiplier(V every_row) { return scalar(dry_multiplier_, every_row); }
  DrawOptions& dry_base(Span<float> v) { return values(dry_base_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& dry_base(V every_row) { return scalar(dry_base_, every_row); }
  DrawOptions& dry_allowed_length(Span<int32_t> v) { return values(dry_allowed_length_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& dry_allowed_length(V every_row) { return scalar(dry_allowed_length_, every_row); }
  DrawOptions& dry_penalty_last_n(Span<int32_t> v) { return values(dry_penalty_last_n_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& dry_penalty_last_n(V every_row) { return scalar(dry_penalty_last_n_, every_row); }
  // DRY's sequence breakers as token ids, in bad_words' two-level layout: breaker k is
  // ids[breaker_offsets[k]..breaker_offsets[k + 1]] (a head token, then its tail), row r's are
  // breakers row_offsets[r]..row_offsets[r + 1]. No counted repeat spans one; the head of a
  // one-token breaker is never penalised.
  DrawOptions& dry_sequence_breakers(Span<int32_t> ids, Span<uint64_t> breaker_offsets,
                                     Span<uint64_t> row_offsets) {
    dry_breaker_ids_ = ids;
    dry_breaker_offsets_ = breaker_offsets;
    dry_breakers_row_offsets_ = row_offsets;
    return *this;
  }
  // llama.cpp's mirostat as each row's final sampler (docs/semantics.md, Mirostat): 0 off, 1 v1,
  // 2 v2; after the temperature and every other filter it keeps v2's tokens of surprise
  // -log2 p <= mu (at least the most probable) or v1's top k, and the row draws from that set
  // renormalised; the row's mu then becomes mu - eta * (-log2 p(drawn) - tau). tau (default 5),
  // eta (0.1) finite, m >= 1 (v1, default 100), mu the row's mu going in (default 2 tau). The mu
  // after the draw goes to mirostat_mu_out's memory, or DrawResult::mirostat_mu.
  DrawOptions& mirostat(Span<int32_t> v) { return values(mirostat_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& mirostat(V every_row) { return scalar(mirostat_, every_row); }
  DrawOptions& mirostat_tau(Span<float> v) { return values(mirostat_tau_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& mirostat_tau(V every_row) { return scalar(mirostat_tau_, every_row); }
  DrawOptions& mirostat_eta(Span<float> v) { return values(mirostat_eta_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& mirostat_eta(V every_row) { return scalar(mirostat_eta_, every_row); }
  DrawOptions& mirostat_m(Span<int32_t> v) { return values(mirostat_m_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& mirostat_m(V every_row) { return scalar(mirostat_m_, every_row); }
  DrawOptions& mirostat_mu(Span<float> v) { return values(mirostat_mu_, v); }
  template <class V, detail::if_number<V> = 0>
  DrawOptions& mirostat_mu(V every_row) { return scalar(mirostat_mu_, every_row); }
  // Where every draw call writes each row's mu after the draw (rows floats; NaN for a row
  // without mirostat; written only when the call succeeds). It may not be mirostat_mu's memory.
  DrawOptions& mirostat_mu_out(float* mu) {
    mirostat_mu_out_ = mu;
    return *this;
  }
  // A grammar bitmask in xgrammar's layout: rows x ceil(vocab / 32) int32 words, `row_stride`
  // words apart (0: ceil(vocab / 32)); bit j of word w set allows token 32 w + j.
  DrawOptions& token_bitmask(Span<int32_t> words, uint64_t row_stride = 0) {
    bitmask_ = words;
    bitmask_row_stride_ = row_stride;
    return *this;
  }
  // The histories of a request state (tokenrace_requests_new) instead of prompt_tokens and
  // output_tokens: row r's prompt and output are request `request_ids[r]`'s (one id per row,
  // each live in it), as if passed as lists. The draw only reads the state; append its tokens
  // with tokenrace_requests_append, or set append_to_requests. Each per-row parameter left
  // unset here comes from the row's request (tokenrace_requests_set_params). Null: off.
  DrawOptions& requests(const tokenrace_requests* state, Span<uint64_t> request_ids) {
    requests_ = state;
    request_ids_ = request_ids;
    return *this;
  }
  // Once the draw succeeds, append each row's token to its request (batch.append_to_requests).
  DrawOptions& append_to_requests(bool on = true) {
    append_to_requests_ = on;
    return *this;
  }

  // ---- rows ---------------------------------------------------------------------------------

  // Several outputs from one logits row (vLLM's n > 1, FlashInfer's indices): draw row r reads
  // logits row index[r] in place (never copied), each draw row with its own seed, offset,
  // parameters and outputs. The draw then has index.size() rows, which every per-row option,
  // list and output follows, while Logits::rows counts the logits rows the index may name (each
  // entry below it; a negative one is the library's to refuse). The index needs its length: a
  // vector, or a pointer and a length. Null: draw row r reads logits row r.
  DrawOptions& row_index(Span<int32_t> index) {
    row_index_ = index;
    return *this;
  }

  // The rows a draw of `logits` with these options has: the row index's length, or the
  // logits' rows without one. Throws Error (INVALID_ARGUMENT) for an index of unknown length or
  // of more than 2^32 - 1 rows.
  uint32_t draw_rows(const Logits& logits) const {
    if (!row_index_.data()) return logits.rows;
    if (!row_index_.has_size()) {
      throw detail::invalid_argument(owner, "row_index needs its length (a vector, or a pointer and a length)");
    }
    if (row_index_.size() > UINT32_MAX) {
      throw detail::invalid_argument(owner, "row_index has " + std::to_string(row_index_.size()) +
                                                " entries, more than a batch's 2^32 - 1 rows");
    }
    return uint32_t(row_index_.size());
  }

  // ---- noise --------------------------------------------------------------------------------

  // Noise for the unseeded sampling rows: one value per token, rows `row_stride` apart (0: one
  // row for every row), holding E or ln E as `kind` says.
  DrawOptions& noise(const float* values, tokenrace_noise_kind kind, uint64_t row_stride) {
    noise_ = values;
    noise_kind_ = kind;
    noise_row_stride_ = row_stride;
    noise_rows_ = detail::unknown_size;
    noise_vocab_ = detail::unknown_size;
    return *this;
  }
  // The noise of a lease: one lease row per batch row (a lease of one row: that row for all).
  inline DrawOptions& noise(const Lease& lease);

  // ---- outputs besides the tokens and flags -------------------------------------------------

  // Which logprobs Sampler::draw_full reports (default RAW: log_softmax of the logits as given).
  DrawOptions& logprob_mode(tokenrace_logprob_mode mode) {
    logprob_mode_ = mode;
    return *this;
  }
  // How many of the most probable tokens of each row Sampler::draw_full reports (default 0).
  DrawOptions& top_n(uint32_t n) {
    top_n_ = n;
    return *this;
  }
  // Whether Sampler::draw_full reports each sampled token's rank (a count over the row: it
  // costs a pass, so only when asked).
  DrawOptions& ranks(bool on) {
    ranks_ = on;
    return *this;
  }
  // Every token's logprob or logit, as `mode` says, into DrawResult::full_logprobs (rows x vocab).
  DrawOptions& full_logprobs(tokenrace_full_mode mode) {
    full_mode_ = mode;
    full_out_ = nullptr;
    full_out_size_ = detail::unknown_size;
    full_row_stride_ = 0;
    return *this;
  }
  // The same into the caller's memory, rows `row_stride` apart (0: vocab), by every draw call
  // (no copy): a vector must hold (rows - 1) x stride + vocab values.
  DrawOptions& full_logprobs(float* out, tokenrace_full_mode mode, uint64_t row_stride = 0) {
    full_mode_ = mode;
    full_out_ = out;
    full_out_size_ = detail::unknown_size;
    full_row_stride_ = row_stride;
    return *this;
  }
  DrawOptions& full_logprobs(std::vector<float>& out, tokenrace_full_mode mode, uint64_t row_stride = 0) {
    full_logprobs(out.data(), mode, row_stride);
    full_out_size_ = out.size();
    return *this;
  }

  // The logprobs (and, when `ranks` is given, the ranks) of given token ids, CSR per row (vLLM's
  // logprob_token_ids), written by every draw call into the caller's memory: one entry per id,
  // in the logprob mode; each array must hold offsets[rows] entries (ranks: null, none).
  DrawOptions& token_logprobs(Span<int32_t> ids, Span<uint64_t> offsets, MutableSpan<float> logprobs,
                              MutableSpan<int32_t> ranks = nullptr) {
    given_ = {ids, offsets};
    given_logprobs_ = logprobs;
    given_ranks_ = ranks;
    given_into_result_ = false;
    return *this;
  }
  // The same into DrawResult::token_logprobs (and, with ranks(true), DrawResult::token_ranks),
  // offsets[rows] entries each, by Sampler::draw_full and score (a plain draw leaves them out).
  DrawOptions& token_logprobs(Span<int32_t> ids, Span<uint64_t> offsets) {
    given_ = {ids, offsets};
    given_logprobs_ = nullptr;
    given_ranks_ = nullptr;
    given_into_result_ = true;
    return *this;
  }

  // Each row's kept set (vLLM's sampling masks), written by every draw call into the caller's
  // memory (null: not wanted): rows thresholds, counts and masses, and rows x ceil(vocab / 32)
  // bitmask words in xgrammar's layout (docs/semantics.md, The kept set).
  // Vectors (or pointers with lengths) must have room for rows values, and rows x ceil(vocab /
  // 32) words.
  DrawOptions& kept_set(MutableSpan<float> threshold, MutableSpan<int32_t> count, MutableSpan<double> mass,
                        MutableSpan<int32_t> bitmask = nullptr) {
    kept_threshold_ = threshold;
    kept_count_ = count;
    kept_mass_ = mass;
    kept_bitmask_ = bitmask;
    kept_values_into_result_ = kept_bitmask_into_result_ = false;
    return *this;
  }
  // The same into DrawResult (Sampler::draw_full and score): `values` the thresholds, counts
  // and masses (DrawResult::kept_threshold, kept_count, kept_mass), `bitmask` the words
  // (DrawResult::kept_bitmask, as the vLLM model runner's sampling mask wants it).
  DrawOptions& kept_set(bool values, bool bitmask = false) {
    kept_set(nullptr, nullptr, nullptr, nullptr);
    kept_values_into_result_ = values;
    kept_bitmask_into_result_ = bitmask;
    return *this;
  }

  // The tokenrace_batch of `logits` with these options (scalars expanded into the returned
  // batch's memory). Throws Error (INVALID_ARGUMENT) when a span of known length, or a lease,
  // does not match the rows, the lists' offsets or the vocabulary; the library checks the rest.
  DrawBatch batch(const Logits& logits) const { return batch(logits, true); }

 private:
  // batch(), for a call that has a DrawResult (`into_result`) or not: the given ids whose
  // logprobs go into a DrawResult are left out of a call without one, as the other outputs
  // meant for it are.
  DrawBatch batch(const Logits& logits, bool into_result) const {
    DrawBatch prepared;
    tokenrace_batch& b = prepared.c_;
    const uint32_t rows = draw_rows(logits);
    check_row_index(logits);
    b.struct_size = sizeof b;
    b.dtype = logits.dtype;
    b.logits = logits.data;
    b.rows = rows;
    b.vocab = logits.vocab;
    b.row_stride = logits.row_stride;
    b.temperature = row_values(temperature_, prepared, "temperature", rows);
    b.seeds = row_values(seeds_, prepared, "seeds", rows);
    b.offsets = row_values(offsets_, prepared, "offsets", rows);
    b.seeded = row_values(seeded_, prepared, "seeded", rows);
    b.top_k = row_values(top_k_, prepared, "top_k", rows);
    b.top_p = row_values(top_p_, prepared, "top_p", rows);
    b.min_p = row_values(min_p_, prepared, "min_p", rows);
    check_noise_shape(logits, rows);
    b.noise = noise_;
    b.noise_kind = noise_kind_;
    b.noise_row_stride = noise_row_stride_;
    b.prompt_ids = list(prompt_, "prompt_ids", "prompt_offsets", rows, &b.prompt_offsets);
    b.output_ids = list(output_, "output_ids", "output_offsets", rows, &b.output_offsets);
    b.repetition_penalty = row_values(repetition_penalty_, prepared, "repetition_penalty", rows);
    b.frequency_penalty = row_values(frequency_penalty_, prepared, "frequency_penalty", rows);
    b.presence_penalty = row_values(presence_penalty_, prepared, "presence_penalty", rows);
    b.penalty_last_n = row_values(penalty_last_n_, prepared, "penalty_last_n", rows);
    b.min_tokens = row_values(min_tokens_, prepared, "min_tokens", rows);
    b.stop_ids = list(stop_, "stop_ids", "stop_offsets", rows, &b.stop_offsets);
    b.bias_ids = list(bias_, "bias_ids", "bias_offsets", rows, &b.bias_offsets);
    check_list_entries(bias_values_, "bias_values", bias_.offsets, "bias_offsets", rows);
    b.bias_values = bias_values_.data();
    b.allowed_ids = list(allowed_, "allowed_ids", "allowed_offsets", rows, &b.allowed_offsets);
    b.allowed_rows = row_values(allowed_rows_, prepared, "allowed_rows", rows);
    b.banned_ids = list(banned_, "banned_ids", "banned_offsets", rows, &b.banned_offsets);
    check_bitmask(logits, rows);
    b.token_bitmask = bitmask_.data();
    b.bitmask_row_stride = bitmask_row_stride_;
    b.top_n_sigma = row_values(top_n_sigma_, prepared, "top_n_sigma", rows);
    b.min_keep = row_values(min_keep_, prepared, "min_keep", rows);
    b.typical_p = row_values(typical_p_, prepared, "typical_p", rows);
    b.xtc_probability = row_values(xtc_probability_, prepared, "xtc_probability", rows);
    b.xtc_threshold = row_values(xtc_threshold_, prepared, "xtc_threshold", rows);
    b.dynatemp_range = row_values(dynatemp_range_, prepared, "dynatemp_range", rows);
    b.dynatemp_exponent = row_values(dynatemp_exponent_, prepared, "dynatemp_exponent", rows);
    check_bad_words(rows);
    b.bad_words_ids = bad_words_ids_.data();
    b.bad_word_offsets = bad_word_offsets_.data();
    b.bad_words_row_offsets = bad_words_row_offsets_.data();
    b.forced_tokens = row_values(forced_tokens_, prepared, "forced_tokens", rows);
    b.logprob_token_ids = list(given_, "logprob_token_ids", "logprob_token_offsets", rows, &b.logprob_token_offsets);
    if (given_into_result_ && !into_result) b.logprob_token_ids = nullptr, b.logprob_token_offsets = nullptr;
    b.order = order_.empty() ? nullptr : order_.data();
    b.order_len = order_.size();
    b.dry_multiplier = row_values(dry_multiplier_, prepared, "dry_multiplier", rows);
    b.dry_base = row_values(dry_base_, prepared, "dry_base", rows);
    b.dry_allowed_length = row_values(dry_allowed_length_, prepared, "dry_allowed_length", rows);
    b.dry_penalty_last_n = row_values(dry_penalty_last_n_, prepared, "dry_penalty_last_n", rows);
    check_words(rows, {dry_breaker_ids_, dry_breaker_offsets_, dry_breakers_row_offsets_},
                {"dry_breaker_ids", "dry_breaker_offsets", "dry_breakers_row_offsets"});
    b.dry_breaker_ids = dry_breaker_ids_.data();
    b.dry_breaker_offsets = dry_breaker_offsets_.data();
    b.dry_breakers_row_offsets = dry_breakers_row_offsets_.data();
    b.requests = requests_;
    b.request_ids = detail::checked_span(request_ids_, owner, "request_ids", rows, "rows");
    b.append_to_requests = append_to_requests_ ? 1 : 0;
    b.row_index = row_index_.data();
    b.mirostat = row_values(mirostat_, prepared, "mirostat", rows);
    b.mirostat_tau = row_values(mirostat_tau_, prepared, "mirostat_tau", rows);
    b.mirostat_eta = row_values(mirostat_eta_, prepared, "mirostat_eta", rows);
    b.mirostat_m = row_values(mirostat_m_, prepared, "mirostat_m", rows);
    b.mirostat_mu = row_values(mirostat_mu_, prepared, "mirostat_mu", rows);
    return prepared;
  }

  friend class Sampler;
  static constexpr const char* owner = "tokenrace::DrawOptions";

  // A CSR list: entries of every row one after the other, and rows + 1 offsets.
  struct Lists {
    Span<int32_t> ids;
    Span<uint64_t> offsets;
  };

  template <class T>
  DrawOptions& values(detail::PerRow<T>& field, Span<T> v) {
    detail::set_values(field, v);
    return *this;
  }
  template <class T, class V>
  DrawOptions& scalar(detail::PerRow<T>& field, V value) {
    detail::set_every_row(field, value);
    return *this;
  }

  template <class T>
  static const T* row_values(const detail::PerRow<T>& field, DrawBatch& prepared, const char* name, uint32_t rows) {
    if (field.every_row) return prepared.repeat(*field.every_row, rows);
    return detail::checked_span(field.values, owner, name, rows, "rows");
  }

  // The library reads rows + 1 offsets and as many entries as the last offset says: a span of
  // known length must hold them (the order of the offsets is the library's to judge).
  static void check_offsets(Span<uint64_t> offsets, const char* offsets_name, uint32_t rows) {
    if (offsets.data() && offsets.has_size() && offsets.size() != size_t(rows) + 1) {
      throw detail::invalid_argument(owner, std::string(offsets_name) + " has " + std::to_string(offsets.size()) +
                                                " values for " + std::to_string(rows) + " rows (rows + 1 wanted)");
    }
  }
  template <class T>
  static void check_list_entries(Span<T> entries, const char* name, Span<uint64_t> offsets, const char* offsets_name,
                                 uint32_t rows) {
    if (!entries.data() || !entries.has_size() || !offsets.data()) return;
    const uint64_t last = offsets.data()[rows];
    if (entries.size() < last) {
      throw detail::invalid_argument(owner, std::string(name) + " has " + std::to_string(entries.size()) +
                                                " values, " + offsets_name + "[" + std::to_string(rows) +
                                                "] says " + std::to_string(last));
    }
  }
  static const int32_t* list(const Lists& lists, const char* ids_name, const char* offsets_name, uint32_t rows,
                             const uint64_t** offsets_out) {
    check_offsets(lists.offsets, offsets_name, rows);
    check_list_entries(lists.ids, ids_name, lists.offsets, offsets_name, rows);
    *offsets_out = lists.offsets.data();
    return lists.ids.data();
  }

  // The library sizes the logits from the largest entry, so an entry past Logits::rows would
  // read beyond the caller's rows: refused here, naming it.
  void check_row_index(const Logits& logits) const {
    const int32_t* index = row_index_.data();
    if (!index) return;
    for (size_t r = 0; r < row_index_.size(); r++) {
      if (index[r] >= 0 && uint32_t(index[r]) >= logits.rows) {
        throw detail::invalid_argument(owner, "row_index[" + std::to_string(r) + "]: " + std::to_string(index[r]) +
                                                  " is not a row of the logits (" + std::to_string(logits.rows) +
                                                  " rows)");
      }
    }
  }

  void check_bitmask(const Logits& logits, uint32_t rows) const {
    if (!bitmask_.data() || !bitmask_.has_size()) return;
    const uint64_t words = (uint64_t(logits.vocab) + 31) / 32;
    const uint64_t stride = bitmask_row_stride_ ? bitmask_row_stride_ : words;
    if (stride < words) return;  // the library names the stride
    if (!detail::rows_fit(bitmask_.size(), rows, words, stride)) {
      throw detail::invalid_argument(owner, "token_bitmask has " + std::to_string(bitmask_.size()) + " words for " +
                                                std::to_string(rows) + " rows of " + std::to_string(words) +
                                                " words, " + std::to_string(stride) + " apart");
    }
  }

  // The library reads rows + 1 row offsets, as many word offsets as the last says (plus one),
  // and as many ids as the last word offset says: spans of known length must hold them.
  void check_bad_words(uint32_t rows) const {
    check_words(rows, {bad_words_ids_, bad_word_offsets_, bad_words_row_offsets_},
                {"bad_words_ids", "bad_word_offsets", "bad_words_row_offsets"});
  }

  // A two-level list of words (bad words, DRY's breakers) and the names of its three arrays.
  struct Words {
    Span<int32_t> ids;
    Span<uint64_t> word_offsets, row_offsets;
  };
  struct WordNames {
    const char *ids, *word_offsets, *row_offsets;
  };

  void check_words(uint32_t rows, const Words& w, const WordNames& n) const {
    check_offsets(w.row_offsets, n.row_offsets, rows);
    if (!w.row_offsets.data()) return;
    const uint64_t words = w.row_offsets.data()[rows];
    if (w.word_offsets.data() && w.word_offsets.has_size() && w.word_offsets.size() <= words) {
      throw detail::invalid_argument(owner, std::string(n.word_offsets) + " has " +
                                                std::to_string(w.word_offsets.size()) + " values, " + n.row_offsets +
                                                "[" + std::to_string(rows) + "] says " + std::to_string(words) +
                                                " words (words + 1 wanted)");
    }
    if (!w.word_offsets.data()) return;
    const uint64_t last = w.word_offsets.data()[words];
    if (w.ids.data() && w.ids.has_size() && w.ids.size() < last) {
      throw detail::invalid_argument(owner, std::string(n.ids) + " has " + std::to_string(w.ids.size()) +
                                                " values, " + n.word_offsets + "[" + std::to_string(words) +
                                                "] says " + std::to_string(last));
    }
  }

  void check_full_output(const Logits& logits, uint32_t rows) const {
    if (!full_out_ || full_out_size_ == detail::unknown_size) return;
    const uint64_t stride = full_row_stride_ ? full_row_stride_ : logits.vocab;
    if (stride < logits.vocab) return;  // the library names the stride
    if (!detail::rows_fit(full_out_size_, rows, logits.vocab, stride)) {
      throw detail::invalid_argument(owner, "full_logprobs has " + std::to_string(full_out_size_) + " values for " +
                                                std::to_string(rows) + " rows of " +
                                                std::to_string(logits.vocab) + " values, " + std::to_string(stride) +
                                                " apart");
    }
  }

  // A caller's output array must have room for `want` values.
  template <class T>
  static T* checked_output(MutableSpan<T> out, const char* name, uint64_t want, const std::string& unit) {
    if (out.data() && out.has_size() && out.size() < want) {
      throw detail::invalid_argument(owner, std::string(name) + " has room for " + std::to_string(out.size()) +
                                                " values, the draw writes " + std::to_string(want) + " (" + unit +
                                                ")");
    }
    return out.data();
  }

  // The entries of logprob_token_ids (its last offset; 0 without it).
  uint64_t given_entries(uint32_t rows) const {
    return given_.offsets.data() ? given_.offsets.data()[rows] : 0;
  }

  // The outputs as every draw call writes them: into the caller's memory, if any.
  void caller_outputs(const Logits& logits, uint32_t rows, tokenrace_output& out) const {
    if (given_.offsets.data()) {
      check_offsets(given_.offsets, "logprob_token_offsets", rows);
      const std::string per_id = "one per entry of logprob_token_ids";
      out.token_logprobs = checked_output(given_logprobs_, "token_logprobs", given_entries(rows), per_id);
      out.token_ranks = checked_output(given_ranks_, "token_ranks", given_entries(rows), per_id);
    }
    const std::string per_row = std::to_string(rows) + " rows";
    out.kept_threshold = checked_output(kept_threshold_, "kept_threshold", rows, per_row);
    out.kept_count = checked_output(kept_count_, "kept_count", rows, per_row);
    out.kept_mass = checked_output(kept_mass_, "kept_mass", rows, per_row);
    const uint64_t words = (uint64_t(logits.vocab) + 31) / 32;
    out.kept_bitmask = checked_output(kept_bitmask_, "kept_bitmask", uint64_t(rows) * words,
                                      per_row + " of " + std::to_string(words) + " words");
    out.mirostat_mu = mirostat_mu_out_;
    if (!full_out_) return;
    check_full_output(logits, rows);
    out.full_logprobs = full_out_;
    out.full_row_stride = full_row_stride_;
    out.full_mode = *full_mode_;
  }

  void check_noise_shape(const Logits& logits, uint32_t rows) const {
    if (noise_vocab_ != detail::unknown_size && noise_vocab_ != logits.vocab) {
      throw detail::invalid_argument(owner, "the noise lease has " + std::to_string(noise_vocab_) +
                                                " values per row, the logits " + std::to_string(logits.vocab));
    }
    if (noise_rows_ != detail::unknown_size && noise_rows_ != 1 && noise_rows_ < rows) {
      throw detail::invalid_argument(owner, "the noise lease has " + std::to_string(noise_rows_) + " rows for " +
                                                std::to_string(rows) + " rows of logits");
    }
  }

  detail::PerRow<float> temperature_, top_p_, min_p_, top_n_sigma_, typical_p_, xtc_probability_, xtc_threshold_,
      dynatemp_range_, dynatemp_exponent_, dry_multiplier_, dry_base_;
  detail::PerRow<int32_t> dry_allowed_length_, dry_penalty_last_n_;
  detail::PerRow<int32_t> mirostat_, mirostat_m_;
  detail::PerRow<float> mirostat_tau_, mirostat_eta_, mirostat_mu_;
  float* mirostat_mu_out_ = nullptr;
  Span<int32_t> dry_breaker_ids_;
  Span<uint64_t> dry_breaker_offsets_, dry_breakers_row_offsets_;
  detail::PerRow<int32_t> min_keep_;
  detail::PerRow<uint64_t> seeds_, offsets_;
  detail::PerRow<uint8_t> seeded_, allowed_rows_;
  detail::PerRow<int32_t> top_k_, penalty_last_n_, min_tokens_, forced_tokens_;
  detail::PerRow<float> repetition_penalty_, frequency_penalty_, presence_penalty_;
  Lists prompt_, output_, bias_, allowed_, banned_, stop_;
  Span<float> bias_values_;
  Span<int32_t> bitmask_;
  uint64_t bitmask_row_stride_ = 0;
  Span<int32_t> bad_words_ids_;
  Span<uint64_t> bad_word_offsets_, bad_words_row_offsets_;
  Lists given_;
  std::vector<uint32_t> order_;  // tokenrace_stage ids
  MutableSpan<float> given_logprobs_;
  MutableSpan<int32_t> given_ranks_;
  bool given_into_result_ = false;
  MutableSpan<float> kept_threshold_;
  MutableSpan<int32_t> kept_count_;
  MutableSpan<double> kept_mass_;
  MutableSpan<int32_t> kept_bitmask_;
  bool kept_values_into_result_ = false, kept_bitmask_into_result_ = false;
  const tokenrace_requests* requests_ = nullptr;
  bool append_to_requests_ = false;
  Span<uint64_t> request_ids_;
  Span<int32_t> row_index_;
  const float* noise_ = nullptr;
  tokenrace_noise_kind noise_kind_ = TOKENRACE_NOISE_KIND_EXP;
  uint64_t noise_row_stride_ = 0;
  size_t noise_rows_ = detail::unknown_size, noise_vocab_ = detail::unknown_size;  // known for a lease
  tokenrace_logprob_mode logprob_mode_ = TOKENRACE_LOGPROB_MODE_RAW;
  uint32_t top_n_ = 0;
  bool ranks_ = false;
  std::optional<tokenrace_full_mode> full_mode_;
  float* full_out_ = nullptr;  // null: DrawResult::full_logprobs, when full_mode_ is set
  size_t full_out_size_ = detail::unknown_size;
  uint64_t full_row_stride_ = 0;
};

// What Sampler::draw_full (and score) returns: one entry per draw row (DrawOptions::draw_rows);
// topn_* hold rows x top_n values, row after row, by logprob descending (lowest id first on
// ties). The outputs the options send to the caller's memory are empty here.
struct DrawResult {
  uint32_t rows = 0;
  uint32_t top_n = 0;
  uint32_t vocab = 0;
  std::vector<int32_t> tokens;
  std::vector<uint32_t> flags;    // TOKENRACE_FLAG_* bits
  std::vector<float> logprobs;    // of the sampled token
  std::vector<int32_t> ranks;     // the count of tokens whose logprob is >= the sampled one's
                                  // (empty unless the options asked for ranks)
  std::vector<int32_t> topn_ids;
  std::vector<float> topn_logprobs;
  std::vector<float> full_logprobs;  // rows x vocab, when the options asked for them without
                                     // memory of their own (DrawOptions::full_logprobs(mode))
  // With DrawOptions::token_logprobs(ids, offsets): one logprob per entry of the ids (row r's at
  // its offsets), and with ranks(true) one rank each.
  std::vector<float> token_logprobs;
  std::vector<int32_t> token_ranks;
  // With DrawOptions::kept_set(true): each row's kept threshold, count and mass; with
  // kept_set(values, true): rows x kept_words() words in xgrammar's bitmask layout.
  std::vector<float> kept_threshold;
  std::vector<int32_t> kept_count;
  std::vector<double> kept_mass;
  std::vector<int32_t> kept_bitmask;
  std::vector<float> mirostat_mu;    // each row's mu after the draw (NaN without mirostat), when
                                     // the options set mirostat without mirostat_mu_out

  int32_t topn_id(uint32_t row, uint32_t j) const { return topn_ids[size_t(row) * top_n + j]; }
  float topn_logprob(uint32_t row, uint32_t j) const { return topn_logprobs[size_t(row) * top_n + j]; }
  float full_logprob(uint32_t row, uint32_t token) const { return full_logprobs[size_t(row) * vocab + token]; }
  // Words per row of kept_bitmask: ceil(vocab / 32).
  uint32_t kept_words() const { return (vocab + 31) / 32; }
  // Whether the row kept `token` (kept_bitmask asked for).
  bool kept(uint32_t row, uint32_t token) const {
    return (uint32_t(kept_bitmask[size_t(row) * kept_words() + token / 32]) >> (token % 32)) & 1u;
  }
};

// The inputs of a verify call besides the target rows and the drafts (tokenrace_verify_batch's
// fields), each unset (its default), one value for every request (`temperature(0.7f)`), or a
// Span: per request (temperature, filters, seeds, offsets, seeded: one value per request), per
// draft token (uniforms: one value each; draft_probs: one row of `vocab` each) or per target row
// (noise). Spans point into the caller's arrays, which must live until the call returns (a
// temporary vector is refused at compile time).
class VerifyOptions {
 public:
  // Temperature (default 1.0); below the sampler's greedy_below the request is greedy: its drafts
  // are accepted while each is its row's argmax (uniforms and draft_probs are then ignored).
  VerifyOptions& temperature(Span<float> v) { return values(temperature_, v); }
  template <class V, detail::if_number<V> = 0>
  VerifyOptions& temperature(V every_request) { return scalar(temperature_, every_request); }
  // Seed: a seeded request's acceptance uniforms and noise at draft position j are a pure
  // function of (seed, offset + j), whatever else is in the call.
  VerifyOptions& seeds(Span<uint64_t> v) { return values(seeds_, v); }
  template <class V, detail::if_number<V> = 0>
  VerifyOptions& seeds(V every_request) { return scalar(seeds_, every_request); }
  // The position of the request's first draft token (default 0).
  VerifyOptions& offsets(Span<uint64_t> v) { return values(offsets_, v); }
  template <class V, detail::if_number<V> = 0>
  VerifyOptions& offsets(V every_request) { return scalar(offsets_, every_request); }
  // Nonzero: the request uses its seed (default: every request, when seeds are set).
  VerifyOptions& seeded(Span<uint8_t> v) { return values(seeded_, v); }
  template <class V, detail::if_number<V> = 0>
  VerifyOptions& seeded(V every_request) { return scalar(seeded_, every_request); }
  // The filters of every target row of the request, as in DrawOptions.
  VerifyOptions& top_k(Span<int32_t> v) { return values(top_k_, v); }
  template <class V, detail::if_number<V> = 0>
  VerifyOptions& top_k(V every_request) { return scalar(top_k_, every_request); }
  VerifyOptions& top_p(Span<float> v) { return values(top_p_, v); }
  template <class V, detail::if_number<V> = 0>
  VerifyOptions& top_p(V every_request) { return scalar(top_p_, every_request); }
  VerifyOptions& min_p(Span<float> v) { return values(min_p_, v); }
  template <class V, detail::if_number<V> = 0>
  VerifyOptions& min_p(V every_request) { return scalar(min_p_, every_request); }

  // Acceptance uniforms in (0, 1), one per draft token, for the unseeded sampling requests
  // (default: from the sampler's stream).
  VerifyOptions& uniforms(Span<double> v) {
    uniforms_ = v;
    return *this;
  }

  // The draft model's probabilities: one row of `vocab` f32 per draft token (>= 0, summing to 1
  // within 1e-3), `row_stride` apart (0: vocab). Unset: the drafts are deterministic (q is
  // one-hot at each draft).
  VerifyOptions& draft_probs(Span<float> values, uint64_t row_stride = 0) {
    draft_probs_ = values;
    draft_probs_row_stride_ = row_stride;
    return *this;
  }

  // A draft tree per request (EAGLE-style; docs/semantics.md, "Draft trees"): one parent per
  // draft node, request-local, -1 for a child of the request's context, else an earlier node of
  // the same request. Row 0 of a request is then its root's target row, row 1 + i node i's; a
  // node's children are judged at its row by recursive rejection sampling; with draft_probs,
  // siblings' rows must be equal. Unset: chains (node i's parent is i - 1).
  VerifyOptions& draft_parents(Span<int32_t> v) {
    draft_parents_ = v;
    return *this;
  }

  // ---- the sampling step inside verification (docs/semantics.md, "The sampling step in
  // verification"): every target row is processed as a draw of it would be, its output history
  // being the request's output tokens followed by the drafts before its position (a tree node's:
  // its ancestors' drafts and its own). Lists and values are PER REQUEST (CSR of requests rows,
  // as DrawOptions' of rows); the bitmask is PER TARGET ROW.

  // The prompt's token ids, CSR (the repetition penalty).
  VerifyOptions& prompt_tokens(Span<int32_t> ids, Span<uint64_t> offsets) {
    prompt_ = {ids, offsets};
    return *this;
  }
  // The tokens generated so far, before the drafts, CSR (penalties, bad words, min_tokens).
  VerifyOptions& output_tokens(Span<int32_t> ids, Span<uint64_t> offsets) {
    output_ = {ids, offsets};
    return *this;
  }
  // Repetition (> 0; 1 off), frequency and presence (finite; 0 off) penalties, per request.
  VerifyOptions& repetition_penalty(Span<float> v) { return values(repetition_penalty_, v); }
  template <class V, detail::if_number<V> = 0>
  VerifyOptions& repetition_penalty(V every_request) { return scalar(repetition_penalty_, every_request); }
  VerifyOptions& frequency_penalty(Span<float> v) { return values(frequency_penalty_, v); }
  template <class V, detail::if_number<V> = 0>
  VerifyOptions& frequency_penalty(V every_request) { return scalar(frequency_penalty_, every_request); }
  VerifyOptions& presence_penalty(Span<float> v) { return values(presence_penalty_, v); }
  template <class V, detail::if_number<V> = 0>
  VerifyOptions& presence_penalty(V every_request) { return scalar(presence_penalty_, every_request); }
  // Logit bias, CSR of (id, value) pairs per request: finite values add, -inf bans.
  VerifyOptions& logit_bias(Span<int32_t> ids, Span<float> values, Span<uint64_t> offsets) {
    bias_ = {ids, offsets};
    bias_values_ = values;
    return *this;
  }
  // The only tokens a request may emit, CSR, for the requests allowed_rows marks (default: all).
  VerifyOptions& allowed_tokens(Span<int32_t> ids, Span<uint64_t> offsets) {
    allowed_ = {ids, offsets};
    return *this;
  }
  VerifyOptions& allowed_rows(Span<uint8_t> v) { return values(allowed_rows_, v); }
  // Tokens a request may not emit, CSR.
  VerifyOptions& banned_tokens(Span<int32_t> ids, Span<uint64_t> offsets) {
    banned_ = {ids, offsets};
    return *this;
  }
  // min_tokens per request: a target row whose history (output, then the drafts before it)
  // holds fewer tokens bans the request's stop tokens (CSR).
  VerifyOptions& min_tokens(Span<int32_t> v) { return values(min_tokens_, v); }
  template <class V, detail::if_number<V> = 0>
  VerifyOptions& min_tokens(V every_request) { return scalar(min_tokens_, every_request); }
  VerifyOptions& stop_tokens(Span<int32_t> ids, Span<uint64_t> offsets) {
    stop_ = {ids, offsets};
    return *this;
  }
  // Bad words per request, DrawOptions::bad_words' two-level CSR; a word's prefix is matched
  // against each target row's history (output, then the drafts before it).
  VerifyOptions& bad_words(Span<int32_t> ids, Span<uint64_t> word_offsets, Span<uint64_t> row_offsets) {
    bad_words_ = {ids, word_offsets, row_offsets};
    return *this;
  }
  // A grammar bitmask row per TARGET ROW (xgrammar's layout), `row_stride` words apart (0:
  // ceil(vocab / 32)).
  VerifyOptions& token_bitmask(Span<int32_t> words, uint64_t row_stride = 0) {
    bitmask_ = words;
    bitmask_row_stride_ = row_stride;
    return *this;
  }

  // Noise of the recovered and bonus draws of the unseeded sampling requests: one row per target
  // row (a draw uses its own row's), `row_stride` apart (0: one row for every row), holding E or
  // ln E as `kind` says.
  VerifyOptions& noise(const float* values, tokenrace_noise_kind kind, uint64_t row_stride) {
    noise_ = values;
    noise_kind_ = kind;
    noise_row_stride_ = row_stride;
    noise_rows_ = detail::unknown_size;
    noise_vocab_ = detail::unknown_size;
    return *this;
  }
  // The noise of a lease: one lease row per target row (a lease of one row: that row for all).
  inline VerifyOptions& noise(const Lease& lease);

  // The tokenrace_verify_batch of `target` (sum(draft_counts) + draft_counts.size() rows: each
  // request's draft positions, then its bonus position) and the drafts (sum(draft_counts) ids,
  // request after request) with these options; it points into the vectors, and scalars are
  // expanded into its own memory. Throws Error (INVALID_ARGUMENT) when a span or a lease does
  // not match the requests, the drafts or the vocabulary (the library checks the rest, the
  // target's row count included).
  VerifyBatch batch(const Logits& target, const std::vector<int32_t>& draft_counts,
                    const std::vector<int32_t>& draft_tokens) const {
    if (draft_counts.size() > UINT32_MAX) throw invalid("draft_counts has more than 2^32 - 1 requests");
    const uint32_t requests = uint32_t(draft_counts.size());
    size_t drafts = 0;
    for (size_t i = 0; i < draft_counts.size(); ++i) {
      // Named here, as the library would name it: a negative count makes every length below wrong.
      if (draft_counts[i] < 0) {
        throw invalid("draft_counts[" + std::to_string(i) + "]: " + std::to_string(draft_counts[i]) + " is negative");
      }
      drafts += size_t(draft_counts[i]);
    }
    if (draft_tokens.size() != drafts) {
      throw invalid("draft_tokens has " + std::to_string(draft_tokens.size()) + " values, draft_counts add up to " +
                    std::to_string(drafts));
    }
    VerifyBatch prepared;
    tokenrace_verify_batch& b = prepared.c_;
    b.struct_size = sizeof b;
    b.dtype = target.dtype;
    b.logits = target.data;
    b.rows = target.rows;
    b.vocab = target.vocab;
    b.row_stride = target.row_stride;
    b.requests = requests;
    b.draft_counts = draft_counts.data();
    b.draft_tokens = draft_tokens.data();
    b.temperature = per_request(temperature_, prepared, "temperature", requests);
    b.seeds = per_request(seeds_, prepared, "seeds", requests);
    b.offsets = per_request(offsets_, prepared, "offsets", requests);
    b.seeded = per_request(seeded_, prepared, "seeded", requests);
    b.top_k = per_request(top_k_, prepared, "top_k", requests);
    b.top_p = per_request(top_p_, prepared, "top_p", requests);
    b.min_p = per_request(min_p_, prepared, "min_p", requests);
    b.uniforms = detail::checked_span(uniforms_, owner, "uniforms", drafts, "draft tokens");
    check_draft_probs(target.vocab, drafts);
    b.draft_probs = draft_probs_.data();
    b.draft_probs_row_stride = draft_probs_row_stride_;
    check_noise_shape(target);
    b.noise = noise_;
    b.noise_kind = noise_kind_;
    b.noise_row_stride = noise_row_stride_;
    b.draft_parents = detail::checked_span(draft_parents_, owner, "draft_parents", drafts, "draft tokens");
    b.prompt_ids = list(prompt_, "prompt_ids", "prompt_offsets", requests, &b.prompt_offsets);
    b.output_ids = list(output_, "output_ids", "output_offsets", requests, &b.output_offsets);
    b.repetition_penalty = per_request(repetition_penalty_, prepared, "repetition_penalty", requests);
    b.frequency_penalty = per_request(frequency_penalty_, prepared, "frequency_penalty", requests);
    b.presence_penalty = per_request(presence_penalty_, prepared, "presence_penalty", requests);
    b.bias_ids = list(bias_, "bias_ids", "bias_offsets", requests, &b.bias_offsets);
    if (bias_values_.data() && bias_values_.has_size() && bias_.offsets.data() &&
        bias_values_.size() < bias_.offsets.data()[requests]) {
      throw invalid("bias_values has " + std::to_string(bias_values_.size()) + " values, bias_offsets[" +
                    std::to_string(requests) + "] says " + std::to_string(bias_.offsets.data()[requests]));
    }
    b.bias_values = bias_values_.data();
    b.allowed_ids = list(allowed_, "allowed_ids", "allowed_offsets", requests, &b.allowed_offsets);
    b.allowed_rows = per_request(allowed_rows_, prepared, "allowed_rows", requests);
    b.banned_ids = list(banned_, "banned_ids", "banned_offsets", requests, &b.banned_offsets);
    b.min_tokens = per_request(min_tokens_, prepared, "min_tokens", requests);
    b.stop_ids = list(stop_, "stop_ids", "stop_offsets", requests, &b.stop_offsets);
    check_bad_words(requests);
    b.bad_words_ids = bad_words_.ids.data();
    b.bad_word_offsets = bad_words_.word_offsets.data();
    b.bad_words_row_offsets = bad_words_.row_offsets.data();
    check_bitmask(target);
    b.token_bitmask = bitmask_.data();
    b.bitmask_row_stride = bitmask_row_stride_;
    return prepared;
  }

 private:
  static constexpr const char* owner = "tokenrace::VerifyOptions";

  template <class T>
  VerifyOptions& values(detail::PerRow<T>& field, Span<T> v) {
    detail::set_values(field, v);
    return *this;
  }
  template <class T, class V>
  VerifyOptions& scalar(detail::PerRow<T>& field, V value) {
    detail::set_every_row(field, value);
    return *this;
  }

  static Error invalid(const std::string& what) { return detail::invalid_argument(owner, what); }

  struct Lists {
    Span<int32_t> ids;
    Span<uint64_t> offsets;
  };
  struct Words {
    Span<int32_t> ids;
    Span<uint64_t> word_offsets, row_offsets;
  };

  // The library reads requests + 1 offsets and as many entries as the last offset says: spans of
  // known length must hold them.
  static void check_offsets(Span<uint64_t> offsets, const char* name, uint32_t requests) {
    if (offsets.data() && offsets.has_size() && offsets.size() != uint64_t(requests) + 1) {
      throw invalid(std::string(name) + " has " + std::to_string(offsets.size()) + " values for " +
                    std::to_string(requests) + " requests (requests + 1 wanted)");
    }
  }
  static const int32_t* list(const Lists& l, const char* ids_name, const char* offsets_name, uint32_t requests,
                             const uint64_t** offsets_out) {
    check_offsets(l.offsets, offsets_name, requests);
    if (l.ids.data() && l.ids.has_size() && l.offsets.data() && l.ids.size() < l.offsets.data()[requests]) {
      throw invalid(std::string(ids_name) + " has " + std::to_string(l.ids.size()) + " values, " + offsets_name +
                    "[" + std::to_string(requests) + "] says " + std::to_string(l.offsets.data()[requests]));
    }
    *offsets_out = l.offsets.data();
    return l.ids.data();
  }
  void check_bad_words(uint32_t requests) const {
    const Words& w = bad_words_;
    check_offsets(w.row_offsets, "bad_words_row_offsets", requests);
    if (!w.row_offsets.data()) return;
    const uint64_t words = w.row_offsets.data()[requests];
    if (w.word_offsets.data() && w.word_offsets.has_size() && w.word_offsets.size() <= words) {
      throw invalid("bad_word_offsets has " + std::to_string(w.word_offsets.size()) + " values, " +
                    "bad_words_row_offsets[" + std::to_string(requests) + "] says " + std::to_string(words) +
                    " words (words + 1 wanted)");
    }
    if (w.word_offsets.data() && w.ids.data() && w.ids.has_size() && w.ids.size() < w.word_offsets.data()[words]) {
      throw invalid("bad_words_ids has " + std::to_string(w.ids.size()) + " values, bad_word_offsets[" +
                    std::to_string(words) + "] says " + std::to_string(w.word_offsets.data()[words]));
    }
  }
  void check_bitmask(const Logits& target) const {
    if (!bitmask_.data() || !bitmask_.has_size()) return;
    const uint64_t words = (uint64_t(target.vocab) + 31) / 32;
    const uint64_t stride = bitmask_row_stride_ ? bitmask_row_stride_ : words;
    if (stride < words) return;  // the library names the stride
    if (!detail::rows_fit(bitmask_.size(), target.rows, words, stride)) {
      throw invalid("token_bitmask has " + std::to_string(bitmask_.size()) + " words for " +
                    std::to_string(target.rows) + " target rows of " + std::to_string(words) + " words, " +
                    std::to_string(stride) + " apart");
    }
  }

  template <class T>
  static const T* per_request(const detail::PerRow<T>& field, VerifyBatch& prepared, const char* name,
                              uint32_t requests) {
    if (field.every_row) return prepared.repeat(*field.every_row, requests);
    return detail::checked_span(field.values, owner, name, requests, "requests");
  }

  // A span of q rows of known length must cover the rows the library reads: (drafts - 1) x
  // stride + vocab.
  void check_draft_probs(uint32_t vocab, size_t drafts) const {
    if (!draft_probs_.data() || !draft_probs_.has_size()) return;
    const uint64_t stride = draft_probs_row_stride_ ? draft_probs_row_stride_ : vocab;
    if (stride < vocab) return;  // the library names the stride
    if (!detail::rows_fit(draft_probs_.size(), drafts, vocab, stride)) {
      throw invalid("draft_probs has " + std::to_string(draft_probs_.size()) + " values for " +
                    std::to_string(drafts) + " draft rows of " + std::to_string(vocab) + " values, " +
                    std::to_string(stride) + " apart");
    }
  }

  void check_noise_shape(const Logits& target) const {
    if (noise_vocab_ != detail::unknown_size && noise_vocab_ != target.vocab) {
      throw invalid("the noise lease has " + std::to_string(noise_vocab_) + " values per row, the target rows " +
                    std::to_string(target.vocab));
    }
    if (noise_rows_ != detail::unknown_size && noise_rows_ != 1 && noise_rows_ < target.rows) {
      throw invalid("the noise lease has " + std::to_string(noise_rows_) + " rows for " + std::to_string(target.rows) +
                    " target rows");
    }
  }

  detail::PerRow<float> temperature_, top_p_, min_p_;
  detail::PerRow<uint64_t> seeds_, offsets_;
  detail::PerRow<uint8_t> seeded_;
  detail::PerRow<int32_t> top_k_;
  Span<double> uniforms_;
  Span<int32_t> draft_parents_;
  Lists prompt_, output_, bias_, allowed_, banned_, stop_;
  Span<float> bias_values_;
  detail::PerRow<float> repetition_penalty_, frequency_penalty_, presence_penalty_;
  detail::PerRow<uint8_t> allowed_rows_;
  detail::PerRow<int32_t> min_tokens_;
  Words bad_words_;
  Span<int32_t> bitmask_;
  uint64_t bitmask_row_stride_ = 0;
  Span<float> draft_probs_;
  uint64_t draft_probs_row_stride_ = 0;
  const float* noise_ = nullptr;
  tokenrace_noise_kind noise_kind_ = TOKENRACE_NOISE_KIND_EXP;
  uint64_t noise_row_stride_ = 0;
  size_t noise_rows_ = detail::unknown_size, noise_vocab_ = detail::unknown_size;  // known for a lease
};

// What Sampler::verify and verify_full return: per request, a row of `width` tokens (width =
// max(draft_counts) + 1): its emitted tokens (its accepted drafts, then the recovered or bonus
// token), then -1; and how many it emitted (1 to draft_counts[i] + 1).
struct VerifyResult {
  uint32_t requests = 0;
  uint32_t width = 0;
  std::vector<int32_t> tokens;   // requests x width, -1 padded
  std::vector<int32_t> counts;   // emitted tokens per request
  std::vector<uint32_t> flags;   // TOKENRACE_FLAG_* bits of the target rows a request looked at
  std::vector<float> logprobs;   // verify_full: requests x width, each emitted token's, NaN padded
  // requests x width: the request-local index of each accepted draft node in path order, then -1
  // (for a chain 0, 1, ...; with VerifyOptions::draft_parents the path through the tree).
  std::vector<int32_t> accepted_nodes;

  int32_t token(uint32_t request, uint32_t j) const { return tokens[size_t(request) * width + j]; }
  float logprob(uint32_t request, uint32_t j) const { return logprobs[size_t(request) * width + j]; }
  // Request i's emitted tokens.
  std::vector<int32_t> emitted(uint32_t request) const {
    const auto first = tokens.begin() + std::ptrdiff_t(size_t(request) * width);
    return std::vector<int32_t>(first, first + counts[request]);
  }
  // How many of request i's drafts were accepted.
  int32_t accepted(uint32_t request) const { return counts[request] - 1; }
};

class NoisePool;

// Owns a tokenrace_sampler: movable, not copyable, safe to use from several threads at once.
class Sampler {
 public:
  Sampler(const Library& library, const Config& config) : library_(library), config_(config.resolve(library)) {
    library_.check(api().sampler_new(&config_, &sampler_));
  }
#ifndef TOKENRACE_HPP_NO_LINK
  explicit Sampler(const Config& config = Config()) : Sampler(Library::linked(), config) {}
#endif
  ~Sampler() { api().sampler_free(sampler_); }
  // The library is copied, not moved: a moved-from Sampler still has one to report through.
  Sampler(Sampler&& o) noexcept
      : library_(o.library_), config_(o.config_), sampler_(std::exchange(o.sampler_, nullptr)) {}
  Sampler& operator=(Sampler&& o) noexcept {
    std::swap(library_, o.library_);
    std::swap(config_, o.config_);
    std::swap(sampler_, o.sampler_);
    return *this;
  }
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // The general call: a tokenrace_batch and tokenrace_output filled by the caller.
  void draw(const tokenrace_batch& batch, tokenrace_output& out) {
    library_.check(api().draw(live(), &batch, &out));
  }

  // One token per row, into `tokens` (rows of them) and, unless null, the row flags; and the
  // full-vocabulary logprobs when the options give memory for them.
  void draw(const Logits& logits, const DrawOptions& options, int32_t* tokens, uint32_t* flags = nullptr) {
    const DrawBatch batch = options.batch(logits, false);
    tokenrace_output out{};
    out.struct_size = sizeof out;
    out.tokens = tokens;
    out.flags = flags;
    options.caller_outputs(logits, batch.c().rows, out);
    draw(batch, out);
  }

  // One token per row (DrawOptions::draw_rows: the row index's length when there is one).
  std::vector<int32_t> draw(const Logits& logits, const DrawOptions& options = DrawOptions()) {
    std::vector<int32_t> tokens(options.draw_rows(logits));
    draw(logits, options, tokens.data());
    return tokens;
  }

  // Contiguous f32 rows; temperatures may be null (1.0 for every row).
  std::vector<int32_t> draw(const float* logits, uint32_t rows, uint32_t vocab, const float* temperatures = nullptr) {
    return draw(Logits::f32(logits, rows, vocab), DrawOptions().temperature(temperatures));
  }

  // Draws like draw() and also reports the logprobs (docs/semantics.md, Logprobs) that the
  // options ask for: each sampled token's in DrawOptions::logprob_mode (RAW: log_softmax of the
  // logits; PROCESSED: after the sampling step, temperature and the filters), the top_n most
  // probable tokens of each row (none for 0; at most the vocabulary size), with ranks each
  // sampled token's rank, and the full-vocabulary values (into DrawResult::full_logprobs unless
  // the options give memory for them).
  DrawResult draw_full(const Logits& logits, const DrawOptions& options = DrawOptions()) {
    return full_call(logits, options, nullptr);
  }

  // The general score call (tokenrace_score): `target_ids` holds batch.rows token ids.
  void score(const tokenrace_batch& batch, const int32_t* target_ids, tokenrace_output& out) {
    library_.check(api().score(live(), &batch, target_ids, &out));
  }

  // Scores one target token per row, nothing drawn: the DrawResult a draw_full whose rows drew
  // these tokens returns (logprobs, ranks, top-n, full-vocabulary values, flags; tokens are the
  // targets), bit for bit, with no noise consumed. The options are draw_full's, without forced
  // tokens or noise (refused). Prompt logprobs: one row per position, its target the next token.
  DrawResult score(const Logits& logits, Span<int32_t> target_ids, const DrawOptions& options = DrawOptions()) {
    if (!target_ids.data()) throw detail::invalid_argument("score", "target_ids is null");
    const uint32_t rows = options.draw_rows(logits);
    if (target_ids.has_size() && target_ids.size() != rows) {
      throw detail::invalid_argument("score", "target_ids has " + std::to_string(target_ids.size()) +
                                                  " ids for " + std::to_string(rows) + " rows");
    }
    return full_call(logits, options, target_ids.data());
  }

  // draw_full with the options' top_n, logprob mode and ranks replaced by these.
  DrawResult draw_full(const Logits& logits, const DrawOptions& options, uint32_t top_n,
                       tokenrace_logprob_mode mode = TOKENRACE_LOGPROB_MODE_RAW, bool ranks = false) {
    DrawOptions asked = options;
    return draw_full(logits, asked.top_n(top_n).logprob_mode(mode).ranks(ranks));
  }

 private:
  // draw_full's call, or score's when `targets` is not null.
  DrawResult full_call(const Logits& logits, const DrawOptions& options, const int32_t* targets) {
    const DrawBatch batch = options.batch(logits);
    const size_t rows = batch.c().rows;
    const uint32_t top_n = options.top_n_;
    DrawResult result;
    result.rows = batch.c().rows;
    result.top_n = top_n;
    result.vocab = logits.vocab;
    result.tokens.resize(rows);
    result.flags.resize(rows);
    result.logprobs.resize(rows);
    if (options.ranks_) result.ranks.resize(rows);
    result.topn_ids.resize(rows * top_n);
    result.topn_logprobs.resize(rows * top_n);
    tokenrace_output out{};
    out.struct_size = sizeof out;
    out.logprob_mode = options.logprob_mode_;
    out.tokens = result.tokens.data();
    out.flags = result.flags.data();
    out.logprobs = result.logprobs.data();
    out.ranks = options.ranks_ ? result.ranks.data() : nullptr;
    out.top_n = top_n;
    out.topn_ids = top_n ? result.topn_ids.data() : nullptr;
    out.topn_logprobs = top_n ? result.topn_logprobs.data() : nullptr;
    options.caller_outputs(logits, batch.c().rows, out);
    if (options.full_mode_ && !options.full_out_) {
      result.full_logprobs.resize(rows * logits.vocab);
      out.full_logprobs = result.full_logprobs.data();
      out.full_mode = *options.full_mode_;
    }
    if (options.given_into_result_ && options.given_.offsets.data()) {
      result.token_logprobs.resize(options.given_entries(batch.c().rows));
      out.token_logprobs = result.token_logprobs.data();
      if (options.ranks_) {
        result.token_ranks.resize(result.token_logprobs.size());
        out.token_ranks = result.token_ranks.data();
      }
    }
    if (options.kept_values_into_result_) {
      result.kept_threshold.resize(rows);
      result.kept_count.resize(rows);
      result.kept_mass.resize(rows);
      out.kept_threshold = result.kept_threshold.data();
      out.kept_count = result.kept_count.data();
      out.kept_mass = result.kept_mass.data();
    }
    if (options.kept_bitmask_into_result_) {
      result.kept_bitmask.resize(rows * result.kept_words());
      out.kept_bitmask = result.kept_bitmask.data();
    }
    const bool mirostat_set = options.mirostat_.values.data() || options.mirostat_.every_row;
    if (mirostat_set && !options.mirostat_mu_out_) {
      result.mirostat_mu.resize(rows);
      out.mirostat_mu = result.mirostat_mu.data();
    }
    if (targets) {
      score(batch, targets, out);
    } else {
      draw(batch, out);
    }
    return result;
  }

 public:

  // The general verify call: a tokenrace_verify_batch and tokenrace_verify_output filled by the
  // caller.
  void verify(const tokenrace_verify_batch& batch, tokenrace_verify_output& out) {
    library_.check(api().verify(live(), &batch, &out));
  }

  // Verifies draft tokens (speculative decoding) by vLLM's rejection sampling (docs/semantics.md,
  // "Verifying draft tokens"): `target` has sum(draft_counts) + draft_counts.size() rows, each
  // request's draft positions then its bonus position, request after request; `draft_tokens`
  // has sum(draft_counts) ids, request after request. Greedy requests accept a draft while it is
  // its row's argmax, and the first mismatch emits that argmax; sampling requests accept d_j when
  // u_j < p_j(d_j) / q_j(d_j), and the first rejection emits a draw from max(p_j - q_j, 0). When
  // every draft is accepted, the bonus row's token follows. Throws Error on bad input.
  VerifyResult verify(const Logits& target, const std::vector<int32_t>& draft_counts,
                      const std::vector<int32_t>& draft_tokens, const VerifyOptions& options = VerifyOptions()) {
    return verify_into_result(target, draft_counts, draft_tokens, options, nullptr);
  }

  // Verifies like verify() and also reports each emitted token's logprob in its target row:
  // `mode` RAW (log_softmax of the logits) or PROCESSED (after temperature and the filters).
  VerifyResult verify_full(const Logits& target, const std::vector<int32_t>& draft_counts,
                           const std::vector<int32_t>& draft_tokens, const VerifyOptions& options = VerifyOptions(),
                           tokenrace_logprob_mode mode = TOKENRACE_LOGPROB_MODE_RAW) {
    return verify_into_result(target, draft_counts, draft_tokens, options, &mode);
  }

  // Counters since the sampler was made.
  tokenrace_sampler_stats stats() const {
    tokenrace_sampler_stats st{};
    st.struct_size = sizeof st;
    library_.check(api().sampler_get_stats(live(), &st));
    return st;
  }

  // The instruction set this sampler runs: "avx512", "avx2", "neon", "vxe2", "portable" or "scalar".
  std::string simd_level() const { return detail::c_string(api().sampler_simd_level(live())); }

  // Makes the unseeded sampling rows take their noise from `pool`, which this sampler then
  // keeps running until it is destroyed (also after the NoisePool is).
  inline void attach_pool(const NoisePool& pool);

  // The settings it was made with.
  const tokenrace_config& config() const noexcept { return config_; }
  const Library& library() const noexcept { return library_; }
  tokenrace_sampler* get() const noexcept { return sampler_; }

 private:
  const Api& api() const noexcept { return library_.api(); }

  tokenrace_sampler* live() const {
    if (!sampler_) throw Error(TOKENRACE_STATUS_CLOSED, "tokenrace::Sampler: used after being moved from");
    return sampler_;
  }

  VerifyResult verify_into_result(const Logits& target, const std::vector<int32_t>& draft_counts,
                                  const std::vector<int32_t>& draft_tokens, const VerifyOptions& options,
                                  const tokenrace_logprob_mode* mode) {
    const VerifyBatch batch = options.batch(target, draft_counts, draft_tokens);
    int32_t most = 0;
    for (int32_t c : draft_counts) most = c > most ? c : most;
    VerifyResult result;
    result.requests = batch.c().requests;
    result.width = uint32_t(most) + 1;
    const size_t cells = size_t(result.requests) * result.width;
    result.tokens.resize(cells);
    result.counts.resize(result.requests);
    result.flags.resize(result.requests);
    tokenrace_verify_output out{};
    out.struct_size = sizeof out;
    out.tokens = result.tokens.data();
    out.tokens_stride = result.width;
    out.counts = result.counts.data();
    out.flags = result.flags.data();
    result.accepted_nodes.resize(cells);
    out.accepted_nodes = result.accepted_nodes.data();
    if (mode) {
      result.logprobs.resize(cells);
      out.logprobs = result.logprobs.data();
      out.logprob_mode = *mode;
    }
    verify(batch, out);
    return result;
  }

  Library library_;
  tokenrace_config config_;
  tokenrace_sampler* sampler_ = nullptr;
};

namespace detail {

// A tokenrace_pool freed when the NoisePool and its last Lease are gone, so that no release
// can race with the free (tokenrace_pool_free() forbids calls starting meanwhile).
struct PoolHandle {
  PoolHandle(Library library_, tokenrace_pool* pool_) : library(std::move(library_)), pool(pool_) {}
  ~PoolHandle() { library.api().pool_free(pool); }
  PoolHandle(const PoolHandle&) = delete;
  PoolHandle& operator=(const PoolHandle&) = delete;

  Library library;
  tokenrace_pool* pool;
};

}  // namespace detail

// Rows of noise borrowed from a NoisePool: rows() x vocab() read-only values (E or ln E, as
// kind() says) at values(), given back by release() or the destructor. Movable, not copyable.
class Lease {
 public:
  ~Lease() {
    if (!released_) handle_->library.api().pool_release(handle_->pool, &lease_);  // no throwing here
  }
  Lease(Lease&& o) noexcept
      : handle_(o.handle_), lease_(o.lease_), released_(std::exchange(o.released_, true)) {}
  Lease& operator=(Lease&& o) noexcept {
    std::swap(handle_, o.handle_);
    std::swap(lease_, o.lease_);
    std::swap(released_, o.released_);
    return *this;
  }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  // Valid until release(); what the memory holds afterwards is undefined.
  const float* values() const noexcept { return lease_.values; }
  const float* row(uint32_t r) const noexcept { return lease_.values + size_t(r) * lease_.vocab; }
  uint32_t rows() const noexcept { return lease_.rows; }
  uint32_t vocab() const noexcept { return lease_.vocab; }
  tokenrace_noise_kind kind() const noexcept { return static_cast<tokenrace_noise_kind>(lease_.kind); }
  // The pool's sequence number of row 0; row r is first_seq() + r.
  uint64_t first_seq() const noexcept { return lease_.first_seq; }
  // Whether values() points into the pool's ring (else a private copy the release frees).
  bool in_ring() const noexcept { return lease_.in_ring != 0; }
  bool released() const noexcept { return released_; }
  const tokenrace_pool_lease& c() const noexcept { return lease_; }

  // Gives the rows back (idempotent); throws Error if the library refuses.
  void release() {
    if (released_) return;
    released_ = true;
    handle_->library.check(handle_->library.api().pool_release(handle_->pool, &lease_));
  }

 private:
  friend class NoisePool;
  Lease(std::shared_ptr<detail::PoolHandle> handle, const tokenrace_pool_lease& lease)
      : handle_(std::move(handle)), lease_(lease) {}

  std::shared_ptr<detail::PoolHandle> handle_;
  tokenrace_pool_lease lease_;
  bool released_ = false;
};

// Owns a tokenrace_pool: a ring of noise that background threads keep filled. Movable, not
// copyable, safe to use from several threads at once.
class NoisePool {
 public:
  NoisePool(const Library& library, const PoolConfig& config) : config_(config.resolve(library)) {
    tokenrace_pool* pool = nullptr;
    library.check(library.api().pool_new(&config_, &pool));
    handle_ = std::make_shared<detail::PoolHandle>(library, pool);
  }
#ifndef TOKENRACE_HPP_NO_LINK
  explicit NoisePool(const PoolConfig& config) : NoisePool(Library::linked(), config) {}
#endif
  // Shuts the pool down now (its producers stop, a borrow blocked in another thread fails with
  // CLOSED) unless a sampler has it attached; the native pool is freed with the last Lease.
  ~NoisePool() {
    if (handle_) api().pool_shutdown(handle_->pool);
  }
  NoisePool(NoisePool&&) noexcept = default;
  NoisePool& operator=(NoisePool&& o) noexcept {
    std::swap(handle_, o.handle_);
    std::swap(config_, o.config_);
    return *this;
  }
  NoisePool(const NoisePool&) = delete;
  NoisePool& operator=(const NoisePool&) = delete;

  // The next `n_rows` rows (1 to config().rows). Throws Error: INVALID_ARGUMENT for a bad
  // count, TIMEOUT (policy BLOCK) when the rows are not ready in time, CLOSED after shutdown().
  Lease borrow(uint32_t n_rows) {
    tokenrace_pool_lease lease{};
    lease.struct_size = sizeof lease;
    library().check(api().pool_borrow(live(), n_rows, &lease));
    return Lease(handle_, lease);
  }

  tokenrace_pool_stats stats() const {
    tokenrace_pool_stats st{};
    st.struct_size = sizeof st;
    library().check(api().pool_get_stats(live(), &st));
    return st;
  }

  // Stops the pool now (see tokenrace_pool_shutdown()): later borrows fail with CLOSED, leases
  // out stay readable. Idempotent.
  void shutdown() { library().check(api().pool_shutdown(live())); }

  // The settings it was made with.
  const tokenrace_pool_config& config() const noexcept { return config_; }
  const Library& library() const { return live_handle().library; }
  tokenrace_pool* get() const noexcept { return handle_ ? handle_->pool : nullptr; }

 private:
  const Api& api() const { return live_handle().library.api(); }

  const detail::PoolHandle& live_handle() const {
    if (!handle_) throw Error(TOKENRACE_STATUS_CLOSED, "tokenrace::NoisePool: used after being moved from");
    return *handle_;
  }
  tokenrace_pool* live() const { return live_handle().pool; }

  std::shared_ptr<detail::PoolHandle> handle_;
  tokenrace_pool_config config_;
};

inline void Sampler::attach_pool(const NoisePool& pool) {
  // Handles of two loaded copies of the library are not interchangeable.
  if (!library_.same_code_as(pool.library())) {
    throw Error(TOKENRACE_STATUS_INVALID_ARGUMENT,
                "tokenrace::Sampler::attach_pool: the pool was made by another tokenrace library");
  }
  library_.check(api().sampler_attach_pool(live(), pool.get()));
}

inline DrawOptions& DrawOptions::noise(const Lease& lease) {
  noise(lease.values(), lease.kind(), lease.rows() == 1 ? 0 : lease.vocab());
  noise_rows_ = lease.rows();
  noise_vocab_ = lease.vocab();
  return *this;
}

inline VerifyOptions& VerifyOptions::noise(const Lease& lease) {
  noise(lease.values(), lease.kind(), lease.rows() == 1 ? 0 : lease.vocab());
  noise_rows_ = lease.rows();
  noise_vocab_ = lease.vocab();
  return *this;
}

}  // namespace tokenrace
