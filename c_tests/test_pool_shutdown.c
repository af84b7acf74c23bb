/* tokenrace_pool_shutdown(): wakes a borrower blocked under the BLOCK policy at once (CLOSED),
 * makes later borrows fail, keeps release/stats/the leases working, is idempotent, leaves an
 * attached pool running until its sampler is freed, and the handle is still freed normally. */
#define _POSIX_C_SOURCE 200809L
#include "tokenrace.h"
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "check.h"

enum { V = 64 };

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

static tokenrace_pool_lease lease_slot(void) {
  tokenrace_pool_lease l;
  memset(&l, 0, sizeof l);
  l.struct_size = sizeof l;
  return l;
}

typedef struct {
  tokenrace_pool *pool;
  atomic_int done;
  tokenrace_status status;
  double finished_at;
  char message[256];
} waiter_t;

static void *blocked_borrower(void *arg) {
  waiter_t *w = arg;
  tokenrace_pool_lease l = lease_slot();
  w->status = tokenrace_pool_borrow(w->pool, 1, &l);
  w->finished_at = now_s();
  /* The message is thread-local: copy it on the failing thread. */
  snprintf(w->message, sizeof w->message, "%s", tokenrace_last_error());
  if (w->status == TOKENRACE_STATUS_OK) tokenrace_pool_release(w->pool, &l);
  atomic_store(&w->done, 1);
  return NULL;
}

static tokenrace_pool *block_pool(uint32_t rows) {
  tokenrace_pool_config cfg = tokenrace_pool_config_default();
  cfg.rows = rows;
  cfg.vocab = V;
  cfg.threads = 1;
  cfg.has_seed = 1;
  cfg.seed = 5;
  cfg.policy = TOKENRACE_POOL_POLICY_BLOCK;
  cfg.timeout_ms = 60000; /* a borrower that is not woken waits a minute: the test would see it */
  tokenrace_pool *p = NULL;
  CHECK(tokenrace_pool_new(&cfg, &p) == TOKENRACE_STATUS_OK);
  return p;
}

int main(void) {
  /* NULL is refused, naming the argument. */
  CHECK(tokenrace_pool_shutdown(NULL) == TOKENRACE_STATUS_INVALID_ARGUMENT);
  CHECK(strstr(tokenrace_last_error(), "pool") != NULL);

  /* A borrower blocked on an exhausted ring wakes with CLOSED as soon as the pool shuts down. */
  tokenrace_pool *pool = block_pool(2);
  tokenrace_pool_lease a = lease_slot(), b = lease_slot();
  CHECK(tokenrace_pool_borrow(pool, 1, &a) == TOKENRACE_STATUS_OK);
  CHECK(tokenrace_pool_borrow(pool, 1, &b) == TOKENRACE_STATUS_OK); /* the whole ring is out */
  waiter_t w;
  memset(&w, 0, sizeof w);
  w.pool = pool;
  pthread_t th;
  CHECK(pthread_create(&th, NULL, blocked_borrower, &w) == 0);
  sleep_ms(300);
  CHECK(!atomic_load(&w.done)); /* it is really blocked, so the wake-up below is the shutdown's */
  double t0 = now_s();
  CHECK(tokenrace_pool_shutdown(pool) == TOKENRACE_STATUS_OK);
  pthread_join(th, NULL);
  CHECK(w.status == TOKENRACE_STATUS_CLOSED);
  CHECK(w.finished_at - t0 < 2.0);
  CHECK(strstr(w.message, "shut down") != NULL);

  /* Later borrows fail with CLOSED and write nothing. */
  tokenrace_pool_lease c = lease_slot();
  memset(&c, 0xab, sizeof c);
  c.struct_size = sizeof c;
  tokenrace_pool_lease c_before = c;
  CHECK(tokenrace_pool_borrow(pool, 1, &c) == TOKENRACE_STATUS_CLOSED);
  CHECK(memcmp(&c, &c_before, sizeof c) == 0);

  /* Leases out stay readable; stats and release still work; shutdown is idempotent. */
  for (int i = 0; i < V; i++) CHECK(isfinite(a.values[i]) && isfinite(b.values[i]));
  tokenrace_pool_stats st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  CHECK(tokenrace_pool_get_stats(pool, &st) == TOKENRACE_STATUS_OK);
  CHECK(st.rows_borrowed == 2);
  CHECK(tokenrace_pool_release(pool, &a) == TOKENRACE_STATUS_OK);
  CHECK(tokenrace_pool_shutdown(pool) == TOKENRACE_STATUS_OK);
  CHECK(tokenrace_pool_release(pool, &b) == TOKENRACE_STATUS_OK);
  CHECK(tokenrace_pool_release(pool, &b) == TOKENRACE_STATUS_INVALID_ARGUMENT);

  /* A shut-down pool cannot be attached. */
  tokenrace_config scfg = tokenrace_config_default();
  scfg.vocab_size = V;
  scfg.max_rows = 4;
  scfg.has_seed = 1;
  scfg.seed = 9;
  tokenrace_sampler *s = NULL;
  CHECK(tokenrace_sampler_new(&scfg, &s) == TOKENRACE_STATUS_OK);
  CHECK(tokenrace_sampler_attach_pool(s, pool) == TOKENRACE_STATUS_CLOSED);
  CHECK(strstr(tokenrace_last_error(), "shut down") != NULL);
  tokenrace_pool_free(pool); /* the handle is still freed the usual way */

  /* An attached pool keeps running after shutdown, until its sampler is freed. */
  tokenrace_pool *attached = block_pool(8);
  CHECK(tokenrace_sampler_attach_pool(s, attached) == TOKENRACE_STATUS_OK);
  CHECK(tokenrace_pool_shutdown(attached) == TOKENRACE_STATUS_OK);
  tokenrace_pool_lease d = lease_slot();
  CHECK(tokenrace_pool_borrow(attached, 1, &d) == TOKENRACE_STATUS_OK);
  CHECK(tokenrace_pool_release(attached, &d) == TOKENRACE_STATUS_OK);
  static float logits[4 * V];
  for (int i = 0; i < 4 * V; i++) logits[i] = (float)(i % 13) / 4.0f;
  tokenrace_batch batch;
  memset(&batch, 0, sizeof batch);
  batch.struct_size = sizeof batch;
  batch.dtype = TOKENRACE_DTYPE_F32;
  batch.logits = logits;
  batch.rows = 4;
  batch.vocab = V;
  int32_t tokens[4] = {-1, -1, -1, -1};
  tokenrace_output out;
  memset(&out, 0, sizeof out);
  out.struct_size = sizeof out;
  out.tokens = tokens;
  CHECK(tokenrace_draw(s, &batch, &out) == TOKENRACE_STATUS_OK);
  for (int r = 0; r < 4; r++) CHECK(tokens[r] >= 0 && tokens[r] < V);
  tokenrace_sampler_stats sst;
  memset(&sst, 0, sizeof sst);
  sst.struct_size = sizeof sst;
  CHECK(tokenrace_sampler_get_stats(s, &sst) == TOKENRACE_STATUS_OK);
  CHECK(sst.pool_rows == 4); /* the draw took the attached pool's noise */
  tokenrace_sampler_free(s); /* the pool's last owner: it shuts down now */
  CHECK(tokenrace_pool_borrow(attached, 1, &d) == TOKENRACE_STATUS_CLOSED);
  tokenrace_pool_free(attached);

  /* Shut down with nothing out, then freed. */
  tokenrace_pool *idle = block_pool(4);
  CHECK(tokenrace_pool_shutdown(idle) == TOKENRACE_STATUS_OK);
  CHECK(tokenrace_pool_borrow(idle, 1, &d) == TOKENRACE_STATUS_CLOSED);
  tokenrace_pool_free(idle);

  if (failures == 0) printf("test_pool_shutdown: ok\n");
  return failures != 0;
}
