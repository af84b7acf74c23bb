/* The part of llama.cpp's include/llama.h that include/tokenrace_llama.h uses, declared as
 * llama.cpp declares it (its sampler interface's first six members, which is all a CPU sampler
 * sets, and the four functions that find a context's logits), so that the adapter is built and tested without llama.cpp. The functions are defined
 * by the test (test_llama_adapter.c) the way libllama defines them; scripts/llama-check.sh
 * tests the adapter against a real libllama. */
#ifndef LLAMA_STUB_H
#define LLAMA_STUB_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LLAMA_DEFAULT_SEED 0xFFFFFFFF

typedef int32_t llama_token;

typedef struct llama_token_data {
    llama_token id;
    float logit;
    float p;
} llama_token_data;

typedef struct llama_token_data_array {
    llama_token_data *data;
    size_t size;
    int64_t selected;
    bool sorted;
} llama_token_data_array;

typedef void *llama_sampler_context_t;

struct llama_sampler;

struct llama_sampler_i {
    const char *(*name)(const struct llama_sampler *smpl);
    void (*accept)(struct llama_sampler *smpl, llama_token token);
    void (*apply)(struct llama_sampler *smpl, llama_token_data_array *cur_p);
    void (*reset)(struct llama_sampler *smpl);
    struct llama_sampler *(*clone)(const struct llama_sampler *smpl);
    void (*free)(struct llama_sampler *smpl);
};

struct llama_sampler {
    struct llama_sampler_i *iface;
    llama_sampler_context_t ctx;
};

struct llama_context;
struct llama_model;
struct llama_vocab;
float *llama_get_logits_ith(struct llama_context *ctx, int32_t i);
const struct llama_model *llama_get_model(const struct llama_context *ctx);
const struct llama_vocab *llama_model_get_vocab(const struct llama_model *model);
int32_t llama_vocab_n_tokens(const struct llama_vocab *vocab);

struct llama_sampler *llama_sampler_init(struct llama_sampler_i *iface, llama_sampler_context_t ctx);
void llama_sampler_free(struct llama_sampler *smpl);
void llama_sampler_accept(struct llama_sampler *smpl, llama_token token);
void llama_sampler_apply(struct llama_sampler *smpl, llama_token_data_array *cur_p);
void llama_sampler_reset(struct llama_sampler *smpl);
struct llama_sampler *llama_sampler_clone(const struct llama_sampler *smpl);

#endif
