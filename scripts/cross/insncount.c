/* insncount: a QEMU TCG plugin (plugin API version 1, QEMU 7.2 and later) that counts the guest
 * instructions executed in each translation block and, at exit, writes one line per block start
 * address: "ADDR_HEX INSNS" (INSNS = instructions in the block x times it ran, summed over its
 * translations) to the file given as out=PATH (default insncount.txt).
 *
 * Debian ships qemu-user without the plugin header, so the few declarations used are written
 * out below (their ABI is that of include/qemu/qemu-plugin.h, version 1).
 *
 * Build: cc -O2 -shared -fPIC -o insncount.so insncount.c
 * Use:   qemu-s390x -plugin ./insncount.so,out=counts.txt PROGRAM ARGS...
 * Counts are exact for a single guest thread (the inline adds are not atomic). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t qemu_plugin_id_t;
typedef struct qemu_info_t qemu_info_t;
struct qemu_plugin_tb;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*tb_trans_cb)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*udata_cb)(qemu_plugin_id_t id, void *userdata);
extern void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, tb_trans_cb cb);
extern void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb, enum qemu_plugin_op op, void *ptr,
                                                     uint64_t imm);
extern size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
extern uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb *tb);
extern void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, udata_cb cb, void *userdata);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

/* One counter per translation; translations of the same address are merged at exit. */
typedef struct Counter {
  uint64_t addr, insns;
  struct Counter *next;
} Counter;

static Counter *counters;
static const char *out_path = "insncount.txt";

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
  (void)id;
  Counter *c = calloc(1, sizeof *c);
  if (!c) abort();
  c->addr = qemu_plugin_tb_vaddr(tb);
  c->next = counters;
  counters = c;
  /* Each execution adds the block's instruction count. */
  qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &c->insns, qemu_plugin_tb_n_insns(tb));
}

static int by_addr(const void *a, const void *b) {
  uint64_t x = (*(Counter *const *)a)->addr, y = (*(Counter *const *)b)->addr;
  return x < y ? -1 : x > y;
}

static void on_exit_cb(qemu_plugin_id_t id, void *p) {
  (void)id;
  (void)p;
  size_t n = 0;
  for (Counter *c = counters; c; c = c->next) n++;
  Counter **all = malloc((n ? n : 1) * sizeof *all);
  if (!all) return;
  size_t i = 0;
  for (Counter *c = counters; c; c = c->next) all[i++] = c;
  qsort(all, n, sizeof *all, by_addr);
  FILE *f = fopen(out_path, "w");
  if (!f) return;
  uint64_t total = 0;
  for (i = 0; i < n;) {
    uint64_t addr = all[i]->addr, insns = 0;
    for (; i < n && all[i]->addr == addr; i++) insns += all[i]->insns;
    if (insns) fprintf(f, "%llx %llu\n", (unsigned long long)addr, (unsigned long long)insns);
    total += insns;
  }
  fclose(f);
  fprintf(stderr, "insncount: %llu guest instructions\n", (unsigned long long)total);
  free(all);
}

__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
                                                               char **argv) {
  (void)info;
  for (int i = 0; i < argc; i++) {
    if (!strncmp(argv[i], "out=", 4)) {
      out_path = argv[i] + 4;
    } else {
      fprintf(stderr, "insncount: unknown argument %s (out=PATH)\n", argv[i]);
      return -1;
    }
  }
  qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
  qemu_plugin_register_atexit_cb(id, on_exit_cb, NULL);
  return 0;
}
