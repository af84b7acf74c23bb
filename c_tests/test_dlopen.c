/* Loading the library with dlopen, as C++ serving code does, and drawing through dlsym. */
#include "tokenrace.h"
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef tokenrace_config (*config_default_fn)(void);
typedef tokenrace_status (*sampler_new_fn)(const tokenrace_config *, tokenrace_sampler **);
typedef tokenrace_status (*draw_fn)(tokenrace_sampler *, const tokenrace_batch *, tokenrace_output *);
typedef void (*sampler_free_fn)(tokenrace_sampler *);

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  config_default_fn config_default = (config_default_fn)dlsym(lib, "tokenrace_config_default");
  sampler_new_fn sampler_new = (sampler_new_fn)dlsym(lib, "tokenrace_sampler_new");
  draw_fn draw = (draw_fn)dlsym(lib, "tokenrace_draw");
  sampler_free_fn sampler_free = (sampler_free_fn)dlsym(lib, "tokenrace_sampler_free");
  if (!config_default || !sampler_new || !draw || !sampler_free) return 1;

  tokenrace_config cfg = config_default();
  tokenrace_sampler *s = NULL;
  if (sampler_new(&cfg, &s) != TOKENRACE_STATUS_OK) return 1;
  float logits[3 * 64];
  for (int i = 0; i < 3 * 64; i++) logits[i] = (float)(i % 64) * 0.01f;
  logits[0 * 64 + 5] = 30.0f;
  logits[1 * 64 + 17] = 30.0f;
  logits[2 * 64 + 63] = 30.0f;
  tokenrace_batch b;
  memset(&b, 0, sizeof b);
  b.struct_size = sizeof b;
  b.logits = logits;
  b.rows = 3;
  b.vocab = 64;
  int32_t tokens[3];
  tokenrace_output o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.tokens = tokens;
  int ok = draw(s, &b, &o) == TOKENRACE_STATUS_OK && tokens[0] == 5 && tokens[1] == 17 && tokens[2] == 63;
  sampler_free(s);
  dlclose(lib);
  printf("test_dlopen: %s\n", ok ? "ok" : "FAILED");
  return !ok;
}
