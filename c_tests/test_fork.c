/* fork() while other threads draw. Samplers of 1 and 4 threads, inline noise, an attached pool
 * and a pool of the sampler's own; one thread per sampler draws continuously while the main
 * thread forks FORKS times. Each child, on its only thread:
 *   - draws the seeded batches and checks every token against the parent's (a seeded row is a
 *     pure function of its seed, offset, logits and settings, so the child must agree);
 *   - draws an unseeded batch (must succeed, every id in range; pool noise falls back to inline);
 *   - frees every sampler and the pool (must return) and _exit(0)s.
 * The parent waits for each child at most CHILD_TIMEOUT_MS: a child that hangs is killed and the
 * test fails at once, without waiting for the rest. An alarm bounds the whole program too. */
#define _POSIX_C_SOURCE 200809L
#include "tokenrace.h"
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum {
  V = 32000,           /* not a multiple of any block: the tails are drawn too */
  ROWS = 8,            /* 8 x V: rows spread over the workers of a 4-thread sampler */
  SMALL = 2,           /* 2 x V: fewer rows than threads, so tiles of a row on the workers */
  FORKS = 60,
  CHILD_TIMEOUT_MS = 10000,
  PROGRAM_TIMEOUT_S = 150, /* below the Rust runner's limit, so this program reports it */
  NCASES = 5,
};

#include "check.h"

typedef struct {
  const char *name;
  uint32_t threads;
  uint32_t noise; /* a tokenrace_noise_source */
  int attach;     /* takes the shared pool */
  tokenrace_sampler *s;
  int32_t ref[ROWS];         /* the seeded tokens of the full batch */
  int32_t ref_small[SMALL];  /* the seeded tokens of the small batch */
  atomic_long draws;         /* completed draw calls of the parent's drawing thread */
  atomic_long errors;        /* failed or wrong draws seen by the parent's drawing thread */
} case_t;

static case_t cases[NCASES] = {
    {"threads=1 inline", 1, TOKENRACE_NOISE_SOURCE_INLINE, 0, NULL, {0}, {0}, 0, 0},
    {"threads=4 inline", 4, TOKENRACE_NOISE_SOURCE_INLINE, 0, NULL, {0}, {0}, 0, 0},
    {"threads=4 attached pool", 4, TOKENRACE_NOISE_SOURCE_AUTO, 1, NULL, {0}, {0}, 0, 0},
    {"threads=1 own pool", 1, TOKENRACE_NOISE_SOURCE_POOL, 0, NULL, {0}, {0}, 0, 0},
    {"threads=4 own pool", 4, TOKENRACE_NOISE_SOURCE_POOL, 0, NULL, {0}, {0}, 0, 0},
};

static float logits[ROWS * V];
static float temps[ROWS] = {1.0f, 0.7f, 1.3f, 0.0f, 1.0f, 0.9f, 2.0f, 1.0f};
static int32_t top_k[ROWS] = {0, 0, 0, 0, 50, 0, 0, 0};
static float top_p[ROWS] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 0.9f, 1.0f, 1.0f};
static uint64_t seeds[ROWS], offsets[ROWS];
static tokenrace_pool *shared_pool;
static atomic_int stop_drawing;
static volatile sig_atomic_t live_child = 0;

static tokenrace_batch make_batch(uint32_t rows, int seeded) {
  tokenrace_batch b = f32_batch(logits, rows, V);
  b.temperature = temps;
  b.top_k = top_k;
  b.top_p = top_p;
  if (seeded) {
    b.seeds = seeds;
    b.offsets = offsets;
  }
  return b;
}

static tokenrace_output make_output(int32_t *tokens) {
  tokenrace_output o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.tokens = tokens;
  return o;
}

/* 0 when the draw succeeds and (with `want`) gives those tokens, else a short reason. */
static const char *draw_check(tokenrace_sampler *s, uint32_t rows, int seeded, const int32_t *want) {
  int32_t got[ROWS];
  for (uint32_t r = 0; r < rows; r++) got[r] = -1;
  tokenrace_batch b = make_batch(rows, seeded);
  tokenrace_output o = make_output(got);
  if (tokenrace_draw(s, &b, &o) != TOKENRACE_STATUS_OK) return "the draw failed";
  for (uint32_t r = 0; r < rows; r++) {
    if (got[r] < 0 || got[r] >= V) return "a token out of range";
    if (want && got[r] != want[r]) return "a seeded token differs from the parent's";
  }
  return NULL;
}

static void *drawer(void *arg) {
  case_t *c = arg;
  while (!atomic_load(&stop_drawing)) {
    const char *why = draw_check(c->s, ROWS, 1, c->ref);
    if (!why) why = draw_check(c->s, SMALL, 1, c->ref_small);
    if (!why) why = draw_check(c->s, ROWS, 0, NULL);
    if (why) atomic_fetch_add(&c->errors, 1);
    atomic_fetch_add(&c->draws, 1);
  }
  return NULL;
}

/* The child reports with write(2): another thread of the parent may have held stdio's lock at
 * the fork. */
static void child_say(const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n > 0) {
    ssize_t unused = write(2, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
    (void)unused;
  }
}

static int child_main(void) {
  int code = 0;
  for (int i = 0; i < NCASES && !code; i++) {
    case_t *c = &cases[i];
    const char *why = draw_check(c->s, ROWS, 1, c->ref);
    if (!why) why = draw_check(c->s, SMALL, 1, c->ref_small);
    if (!why) why = draw_check(c->s, ROWS, 0, NULL);
    if (!why) why = draw_check(c->s, ROWS, 1, c->ref); /* still right after an unseeded draw */
    if (why) {
      child_say("child %d, sampler \"%s\": %s (last error: %s)\n", (int)getpid(), c->name, why,
                tokenrace_last_error());
      code = 10 + i;
    }
  }
  /* A pool made before the fork has no producers here: a borrow of it is refused. */
  tokenrace_pool_lease l;
  memset(&l, 0, sizeof l);
  l.struct_size = sizeof l;
  if (!code && tokenrace_pool_borrow(shared_pool, 1, &l) != TOKENRACE_STATUS_CLOSED) {
    child_say("child %d: a borrow of the parent's pool did not fail with CLOSED\n", (int)getpid());
    code = 20;
  }
  /* Freeing must return even though the workers and producers are the parent's. */
  for (int i = 0; i < NCASES; i++) tokenrace_sampler_free(cases[i].s);
  tokenrace_pool_free(shared_pool);
  return code;
}

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "test_fork: the program ran out of time; killing the live child\n";
  ssize_t unused = write(2, msg, sizeof msg - 1);
  (void)unused;
  if (live_child > 0) kill((pid_t)live_child, SIGKILL);
  _exit(3);
}

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

/* 0: exited with status 0; 1: failed (reported); 2: hung (killed, reported). */
static int wait_child(pid_t pid, int fork_no) {
  for (long waited = 0;; waited++) {
    int st = 0;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) {
      if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
      if (WIFEXITED(st))
        fprintf(stderr, "fork %d: the child exited with status %d\n", fork_no, WEXITSTATUS(st));
      else
        fprintf(stderr, "fork %d: the child died of signal %d\n", fork_no,
                WIFSIGNALED(st) ? WTERMSIG(st) : -1);
      return 1;
    }
    if (r < 0 && errno != EINTR) {
      perror("waitpid");
      return 1;
    }
    if (waited >= CHILD_TIMEOUT_MS) {
      fprintf(stderr, "fork %d: the child hung (no exit within %d ms); killed\n", fork_no,
              CHILD_TIMEOUT_MS);
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return 2;
    }
    sleep_ms(1);
  }
}

int main(void) {
  signal(SIGALRM, on_alarm);
  alarm(PROGRAM_TIMEOUT_S);
  for (int r = 0; r < ROWS; r++) {
    seeds[r] = 0x5eed0000u + (uint64_t)r * 977u;
    offsets[r] = (uint64_t)r * 7u + 1u;
    for (int i = 0; i < V; i++)
      logits[r * V + i] = (float)(((uint32_t)i * 2654435761u + (uint32_t)r * 40503u) % 10007u) / 1500.0f;
  }

  tokenrace_pool_config pcfg = tokenrace_pool_config_default();
  pcfg.vocab = V;
  pcfg.rows = 64;
  pcfg.threads = 1;
  pcfg.has_seed = 1;
  pcfg.seed = 3;
  CHECK(tokenrace_pool_new(&pcfg, &shared_pool) == TOKENRACE_STATUS_OK);

  for (int i = 0; i < NCASES; i++) {
    case_t *c = &cases[i];
    tokenrace_config cfg = tokenrace_config_default();
    cfg.vocab_size = V;
    cfg.max_rows = ROWS;
    cfg.threads = c->threads;
    cfg.noise = c->noise;
    cfg.has_seed = 1;
    cfg.seed = 100 + (uint64_t)i;
    CHECK(tokenrace_sampler_new(&cfg, &c->s) == TOKENRACE_STATUS_OK);
    if (c->attach) CHECK(tokenrace_sampler_attach_pool(c->s, shared_pool) == TOKENRACE_STATUS_OK);
    tokenrace_batch b = make_batch(ROWS, 1);
    tokenrace_output o = make_output(c->ref);
    CHECK(tokenrace_draw(c->s, &b, &o) == TOKENRACE_STATUS_OK);
    b = make_batch(SMALL, 1);
    o = make_output(c->ref_small);
    CHECK(tokenrace_draw(c->s, &b, &o) == TOKENRACE_STATUS_OK);
    /* Seeded tokens do not depend on the sampler: every case must agree with the first. */
    CHECK(memcmp(c->ref, cases[0].ref, sizeof c->ref) == 0);
    CHECK(memcmp(c->ref_small, c->ref, sizeof c->ref_small) == 0);
  }
  if (failures) return 1;

  pthread_t threads[NCASES];
  for (int i = 0; i < NCASES; i++) CHECK(pthread_create(&threads[i], NULL, drawer, &cases[i]) == 0);
  /* Fork only once every drawing thread is under way. */
  for (int i = 0; i < NCASES; i++)
    while (atomic_load(&cases[i].draws) == 0) sleep_ms(1);

  int ok = 0, failed = 0;
  for (int k = 0; k < FORKS; k++) {
    sleep_ms(k % 4); /* fork at different points of the parent's draws */
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      failed++;
      break;
    }
    if (pid == 0) _exit(child_main());
    live_child = pid;
    int res = wait_child(pid, k);
    live_child = 0;
    if (res == 0) {
      ok++;
    } else {
      failed++;
      if (res == 2 || failed >= 3) break; /* a hang stops the test; so do repeated failures */
    }
  }

  atomic_store(&stop_drawing, 1);
  for (int i = 0; i < NCASES; i++) pthread_join(threads[i], NULL);
  for (int i = 0; i < NCASES; i++) {
    CHECK(atomic_load(&cases[i].errors) == 0);
    CHECK(atomic_load(&cases[i].draws) > 0);
    tokenrace_sampler_free(cases[i].s);
  }
  tokenrace_pool_free(shared_pool);
  if (failed) {
    fprintf(stderr, "test_fork: %d of %d forks ok, %d failed (stopped early after a hang or 3 failures)\n",
            ok, FORKS, failed);
    failures++;
  }
  if (failures == 0) printf("test_fork: ok (%d forks)\n", ok);
  return failures != 0;
}
