// The oracle for model families: llama.cpp (libllama, built from the same PyPI sdist as the
// other tools by scripts/llama-cpp-build.sh) on a GGUF file, for the tests to compare with.
//
//   llama-logits MODEL tokenize            < text  > ids    the ids llama.cpp gives the text
//                                                            (BOS as the file says, special
//                                                            tokens parsed), one line
//   llama-logits MODEL eval LOGITS N_GEN   < ids   > ids    N_GEN greedy tokens after the prompt;
//                                                            LOGITS gets the logits (f32 rows of
//                                                            vocab) at every prompt position,
//                                                            then after each greedy token
//   llama-logits MODEL score               < ids   > lines  for each position but the last: the
//                                                            top token, the log-probability of
//                                                            the next one (perplexity), and the
//                                                            top token's lead over the second
//
// Two threads, an f16 K/V cache, the whole prompt in one batch.
#include "llama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum ggml_log_level level, const char * text, void * data) {
    (void) data;
    if (level >= GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static bool silent_progress(float progress, void * data) {
    (void) progress;
    (void) data;
    return true;
}

static char * read_all(FILE * f, size_t * len) {
    size_t cap = 1 << 16, n = 0;
    char * buf = malloc(cap);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

static int argmax(const float * x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (x[i] > x[best]) {
            best = i;
        }
    }
    return best;
}

int main(int argc, char ** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL tokenize | eval LOGITS N_GEN\n", argv[0]);
        return 2;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.progress_callback = silent_progress;
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    size_t len;
    char * input = read_all(stdin, &len);

    if (strcmp(argv[2], "tokenize") == 0) {
        int cap = (int) len + 16;
        llama_token * ids = malloc(sizeof(llama_token) * cap);
        int n = llama_tokenize(vocab, input, (int) len, ids, cap, true, true);
        if (n < 0) {
            fprintf(stderr, "tokenize failed\n");
            return 1;
        }
        for (int i = 0; i < n; i++) {
            printf(i ? " %d" : "%d", ids[i]);
        }
        printf("\n");
        return 0;
    }
    int scoring = strcmp(argv[2], "score") == 0;
    if (!scoring && (strcmp(argv[2], "eval") != 0 || argc < 5)) {
        fprintf(stderr, "unknown mode\n");
        return 2;
    }
    int n_gen = scoring ? 0 : atoi(argv[4]);
    int cap = 1024, n = 0;
    llama_token * prompt = malloc(sizeof(llama_token) * cap);
    for (char * tok = strtok(input, " \n"); tok; tok = strtok(NULL, " \n")) {
        if (n == cap) {
            cap *= 2;
            prompt = realloc(prompt, sizeof(llama_token) * cap);
        }
        prompt[n++] = atoi(tok);
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n + n_gen + 16;
    cp.n_batch = cp.n_ubatch = n > 0 ? n : 1;
    cp.n_threads = cp.n_threads_batch = 2;
    // LLAMA_LOGITS_FLASH_ATTN=0 or 1 forces llama.cpp's attention kernel (its default: auto),
    // to see how far its own two kernels' logits are apart.
    const char * flash = getenv("LLAMA_LOGITS_FLASH_ATTN");
    if (flash) {
        cp.flash_attn_type = atoi(flash) ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    }
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "cannot make a context\n");
        return 1;
    }
    int n_vocab = llama_vocab_n_tokens(vocab);
    struct llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        batch.token[i] = prompt[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n;
    if (llama_decode(ctx, batch) != 0) {
        fprintf(stderr, "decode failed\n");
        return 1;
    }
    if (scoring) {
        // Positions are scored on both threads: one pass over a 262K vocabulary per position
        // took as long as the model's whole pass over the prompt. The rows are taken at once,
        // on one thread (taking them puts the context's outputs in order).
        const float * logits = llama_get_logits(ctx);
        struct score { int top; double log_prob, lead; } * scores = malloc(sizeof(struct score) * n);
#pragma omp parallel for num_threads(2) schedule(static)
        for (int i = 0; i < n - 1; i++) {
            const float * l = logits + (size_t) i * n_vocab;
            int top = argmax(l, n_vocab);
            double z = 0;
            for (int j = 0; j < n_vocab; j++) {
                z += exp((double) l[j] - l[top]);
            }
            int second = top == 0 ? 1 : 0;
            for (int j = 0; j < n_vocab; j++) {
                if (j != top && l[j] > l[second]) {
                    second = j;
                }
            }
            scores[i] = (struct score) { top, (double) l[prompt[i + 1]] - l[top] - log(z), (double) l[top] - l[second] };
        }
        for (int i = 0; i < n - 1; i++) {
            printf("%d %.6f %.6f\n", scores[i].top, scores[i].log_prob, scores[i].lead);
        }
        return 0;
    }
    FILE * out = fopen(argv[3], "wb");
    for (int i = 0; i < n; i++) {
        fwrite(llama_get_logits_ith(ctx, i), sizeof(float), n_vocab, out);
    }
    llama_token next = argmax(llama_get_logits_ith(ctx, n - 1), n_vocab);
    for (int step = 0; step < n_gen; step++) {
        printf(step ? " %d" : "%d", next);
        struct llama_batch one = llama_batch_get_one(&next, 1);
        if (llama_decode(ctx, one) != 0) {
            fprintf(stderr, "decode failed at step %d\n", step);
            return 1;
        }
        fwrite(llama_get_logits_ith(ctx, -1), sizeof(float), n_vocab, out);
        next = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
    }
    fclose(out);
    printf("\n");
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
