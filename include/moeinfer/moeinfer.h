/* moeinfer: stable C ABI.
 *
 * Conventions (they hold for every function below):
 *  - Every fallible function returns a moe_status. Nothing ever aborts, exits or throws
 *    across this boundary; an allocation failure is MOE_STATUS_OUT_OF_MEMORY.
 *  - On failure, moe_last_error() returns a message for the calling thread ("" after a
 *    call that succeeded).
 *  - Handles are opaque. moe_*_free(NULL) is a no-op. Passing NULL where a handle is
 *    required returns MOE_STATUS_INVALID_ARGUMENT.
 *  - Params structs begin with struct_size. Get them from moe_*_default_params() (which
 *    fills struct_size) and change fields; callers built against an older header pass a
 *    smaller struct_size and the library uses defaults for the fields they lack.
 *  - Output strings/arrays go to caller buffers. When a buffer is too small the call
 *    returns MOE_STATUS_BUFFER_TOO_SMALL and stores the required count, so the caller can
 *    retry; passing a NULL buffer with capacity 0 is the way to query the size.
 *  - A model or context is used by one thread at a time; moe_decode_cancel() and the
 *    moe_decode_poll()/moe_decode_wait() pair are the exceptions (see below). A context
 *    call made while another thread is inside the context (a decode running, or any other
 *    call) returns MOE_STATUS_BUSY and changes nothing; it never races.
 *  - A failed call changes nothing (a failed decode only makes the logits unavailable)
 *    and may be retried, e.g. after MOE_STATUS_OUT_OF_MEMORY.
 *  - The library is silent: it writes nothing to stdout/stderr. Install a log callback
 *    with moe_set_log_callback() to receive its messages.
 */
#ifndef MOEINFER_H
#define MOEINFER_H

#include <stddef.h>
#include <stdint.h>

#include "moeinfer/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ABI major version: bumped on any incompatible change of this header. */
#define MOE_ABI_VERSION 1

/* ------------------------------------------------------------------ status / errors */

typedef enum moe_status {
  MOE_STATUS_OK = 0,
  MOE_STATUS_INVALID_ARGUMENT = 1,  /* bad parameter (NULL handle, wrong struct_size, out of range) */
  MOE_STATUS_OUT_OF_MEMORY = 2,     /* host or device allocation failed */
  MOE_STATUS_IO_ERROR = 3,          /* open/read/mmap failed */
  MOE_STATUS_INVALID_GGUF = 4,      /* malformed GGUF file */
  MOE_STATUS_UNSUPPORTED = 5,       /* valid input this build does not implement */
  MOE_STATUS_INVALID_MODEL = 6,     /* GGUF is fine but the model is inconsistent */
  MOE_STATUS_CONTEXT_FULL = 7,      /* decoding would exceed n_ctx; nothing was evicted */
  MOE_STATUS_TIMEOUT = 8,           /* moe_decode_wait ran out of time; the decode continues */
  MOE_STATUS_ABORTED = 9,           /* abort callback, cancel or progress callback stopped it */
  MOE_STATUS_DEVICE_ERROR = 10,     /* backend / device failure */
  MOE_STATUS_INVALID_VOCAB = 11,    /* tokenizer data missing or inconsistent */
  MOE_STATUS_BUFFER_TOO_SMALL = 12, /* caller buffer too small; required size reported */
  MOE_STATUS_BUSY = 13,             /* the context is in use: a decode in flight (or not yet collected) or
                                     * another thread's call */
  MOE_STATUS_CONTEXT_UNUSABLE = 14, /* an earlier device error disabled this context */
  MOE_STATUS_INTERNAL = 15,         /* a bug in moeinfer */
  MOE_STATUS_NUMERIC_ERROR = 16     /* a decode produced NaN or infinite logits (bad weights, overflow);
                                     * like every failed decode it kept nothing. Added after the first
                                     * ABI 1 release: hosts built before it see an unknown status */
} moe_status;

/* Static English name of a status ("ok", "context full", ...). Never NULL. */
MOE_API const char *moe_status_string(moe_status status);

/* Why the most recent status-returning moe_* call on this thread failed ("" when it
 * succeeded). Borrowed; valid until the next moe_* call on the same thread. */
MOE_API const char *moe_last_error(void);

/* Clears this thread's last-error message. */
MOE_API void moe_clear_last_error(void);

/* ------------------------------------------------------------------ version */

/* Library version, e.g. "0.1.0". Static string; never NULL. */
MOE_API const char *moe_version_string(void);

/* ABI major version of the loaded library (MOE_ABI_VERSION it was built with, >= 1). */
MOE_API uint32_t moe_abi_version(void);

/* ------------------------------------------------------------------ logging */

typedef enum moe_log_level {
  MOE_LOG_LEVEL_DEBUG = 0,
  MOE_LOG_LEVEL_INFO = 1,
  MOE_LOG_LEVEL_WARN = 2,
  MOE_LOG_LEVEL_ERROR = 3
} moe_log_level;

/* level is a moe_log_level. message is borrowed for the duration of the call.
 * May be called from any thread the library uses, and from several threads at once: the
 * library holds no lock of its own while the callback runs, so the callback must be
 * thread-safe.
 * What a callback may do: call any moe_* function, moe_set_log_callback included (to replace
 * or remove itself). Messages the library produces on the same thread while the callback
 * runs (because the callback called a moe_* function that logs) are dropped, never delivered
 * re-entrantly. A callback must not throw (one that does has the exception swallowed) and
 * must not wait for another thread that is itself inside moe_set_log_callback. */
typedef void (*moe_log_callback)(int level, const char *message, void *user_data);

/* Process-wide log sink; NULL silences the library (the default). user_data is borrowed
 * and must stay valid until the callback is replaced. Called outside a log callback, this
 * returns only after every call of the previous callback (on any thread) has returned, so
 * the previous user_data may be freed right after; called from inside a callback, it
 * replaces the sink at once without that wait (other threads may still be finishing a call
 * of the previous callback). */
MOE_API void moe_set_log_callback(moe_log_callback callback, void *user_data);

/* ------------------------------------------------------------------ devices */

typedef enum moe_device_kind {
  MOE_DEVICE_KIND_CPU = 0,
  MOE_DEVICE_KIND_GPU = 1
} moe_device_kind;

typedef struct moe_device_info {
  size_t struct_size;      /* set to sizeof(moe_device_info) before the call */
  char id[32];             /* NUL-terminated id used in moe_model_params.devices ("cpu", "cuda0") */
  char name[128];          /* NUL-terminated human-readable name (CPU model, GPU name) */
  int32_t kind;            /* moe_device_kind */
  int32_t integrated;      /* 1 when the device uses host memory (CPU, integrated GPU) */
  uint64_t memory_total;   /* bytes; 0 if unknown */
  uint64_t memory_free;    /* bytes available now; 0 if unknown */
} moe_device_info;
/* struct_size of the first layout (192 bytes on 64-bit targets). */
#define MOE_DEVICE_INFO_SIZE_V1 (offsetof(moe_device_info, memory_free) + sizeof(uint64_t))

/* Number of devices this build can use (the CPU is always device 0). */
MOE_API moe_status moe_device_count(size_t *out_count);

/* Fills *out for device index (0 .. count-1). out->struct_size must be set. */
MOE_API moe_status moe_device_get_info(size_t index, moe_device_info *out);

/* ------------------------------------------------------------------ model */

typedef struct moe_model moe_model;

/* Load progress in [0,1]. Return nonzero to continue, 0 to cancel the load
 * (moe_model_load then returns MOE_STATUS_ABORTED). */
typedef int (*moe_progress_callback)(float progress, void *user_data);

typedef struct moe_model_params {
  size_t struct_size;                 /* sizeof(moe_model_params); set by moe_model_default_params */
  const char *const *devices;         /* device ids to use (borrowed during load); NULL = all devices */
  size_t n_devices;                   /* entries in devices; 0 = all devices */
  const char *const *kv_overrides;    /* "key=type:value" metadata overrides (borrowed during load); NULL = none */
  size_t n_kv_overrides;              /* entries in kv_overrides; default 0 */
  moe_progress_callback progress;     /* called during load; NULL = none (default) */
  void *progress_user_data;           /* passed to progress; borrowed; default NULL */
  int32_t use_mmap;                   /* 1 (default): map weights read-only; 0 = read into memory */
  int32_t vocab_only;                 /* 1: load metadata + tokenizer only; default 0 */
  /* ---- Placement: where the weights live and so where each part of the graph runs (the
   * reference engine's --cpu-moe, --n-cpu-moe, -ngl, -ts, -ot, -mg, --fit). Appended after
   * the first layout (64 bytes); callers passing that struct_size get these defaults.
   * Strings and arrays are borrowed during the call. Device names are those of
   * moe_device_info.id ("cpu", "cuda0"). Contradicting settings (cpu_moe with n_cpu_moe)
   * fail with MOE_STATUS_INVALID_ARGUMENT naming both. */
  int32_t cpu_moe;                    /* 1: routed experts of every layer on the CPU; default 0 */
  int32_t n_cpu_moe;                  /* routed experts of layers [0, N) on the CPU; -1 (default) = unset */
  int32_t n_gpu_layers;               /* the last N layers on GPUs, the rest on the CPU; -1 (default) = unset (all) */
  const float *tensor_split;          /* layer share per GPU of devices (in order), e.g. {3, 1}; NULL (default) = unset */
  size_t n_tensor_split;              /* entries in tensor_split; default 0 */
  const char *const *tensor_overrides; /* "REGEX=DEVICE" rules; the regex is searched in each tensor name and the
                                       * first matching rule wins (like the reference engine's -ot); NULL = none */
  size_t n_tensor_overrides;          /* entries in tensor_overrides; default 0 */
  const char *main_device;            /* device of the output head (output_norm, output); NULL (default) = the
                                       * last layer's device */
  int32_t allow_fallback;             /* 1: an op a device cannot run may run on the CPU; 0 (default) = fail instead */
  int32_t zero_copy;                  /* GPU weights used in place from host memory: -1 (default) = on integrated
                                       * GPUs only, 0 = never, 1 = always */
  /* Fit: choose the unset values above so every device's plan (weights, KV cache,
   * activations) stays within its budget; see moe_model_fit for a dry run. */
  int32_t fit;                        /* 1: fit at load; default 0 */
  const char *const *fit_budgets;     /* "DEVICE=BYTES" (suffix K/M/G/T = 2^10..2^40), e.g. "cuda0=10G"; a GPU
                                       * without one gets its free memory - fit_margin; NULL (default) = none */
  size_t n_fit_budgets;               /* entries in fit_budgets; default 0 */
  uint64_t fit_margin;                /* bytes kept free per GPU whose budget is its free memory; default 1 GiB */
  /* The contexts the fit leaves room for (their KV cache and activations): */
  uint32_t fit_n_ctx;                 /* KV cells; default 4096; 0 = default */
  uint32_t fit_n_ubatch;              /* tokens per graph run; default 512; 0 = default */
  uint32_t fit_n_seq_max;             /* sequences, at most 64; default 1; 0 = default */
  int32_t fit_kv_type;                /* moe_kv_type of the KV cache; default MOE_KV_TYPE_F16 */
  int32_t fit_shrink_ctx;             /* 1: the fit may lower fit_n_ctx when nothing else fits (moe_fit_plan.n_ctx
                                       * says how far); 0 (default) = never */
  int32_t unused_v2;                  /* never read: the second layout's tail padding, named so that the next
                                       * layout's fields start at MOE_MODEL_PARAMS_SIZE_V2 */
} moe_model_params;

/* struct_size of each published layout (64 and 184 bytes on 64-bit targets); a size between
 * them reads the fields it covers. */
#define MOE_MODEL_PARAMS_SIZE_V1 offsetof(moe_model_params, cpu_moe)
#define MOE_MODEL_PARAMS_SIZE_V2 (offsetof(moe_model_params, unused_v2) + sizeof(int32_t))

/* Defaults of every field above, struct_size = sizeof(moe_model_params).
 * The library also exports moe_model_default_params itself, which returns the first
 * (64-byte) layout to binaries built against that header; this header maps the name to
 * moe_model_default_params_v2 (look that symbol up when loading the library with dlsym). */
#define moe_model_default_params moe_model_default_params_v2
MOE_API moe_model_params moe_model_default_params(void);

/* Loads a GGUF model. params may be NULL (defaults).
 * On success *out_model is the caller's; free with moe_model_free (contexts created from it
 * hold their own reference, so they may be freed before or after). On failure *out_model
 * is set to NULL.
 * Untrusted files: a path that is not a regular file (FIFO, directory, device) is
 * MOE_STATUS_IO_ERROR at once; malformed GGUF, and metadata or a vocabulary that would take
 * more than 4x the file's size in memory (+16 MiB), is INVALID_GGUF / INVALID_VOCAB before it
 * is allocated; a hyperparameter that is not finite or out of range (rope.freq_base < 1, RMS
 * epsilon <= 0, ...) is INVALID_MODEL naming the key and value; a weight type outside the type
 * table is INVALID_GGUF naming the tensor. With use_mmap = 1 the weights are read from the
 * file mapping twice at most: GPU weights during this call, CPU weights by the first CPU
 * context's copy (see moe_model_set_cpu_weight_copy). A file that shrank on disk before that
 * copy makes moe_context_create fail with MOE_STATUS_IO_ERROR instead of faulting; a file
 * shrinking while this call runs is not covered (use_mmap = 0 reads it with read()). */
MOE_API moe_status moe_model_load(const char *path, const moe_model_params *params,
                                  moe_model **out_model);

/* Memory plan of one device in a moe_fit_plan (bytes). */
typedef struct moe_device_plan {
  char id[32];             /* NUL-terminated device id ("cpu", "cuda0") */
  uint64_t weights;        /* weights resident on the device */
  uint64_t kv_cache;       /* KV cache of the layers whose attention runs there */
  uint64_t activations;    /* activation arena of the largest compiled graph, workspace excluded */
  uint64_t workspace;      /* kernels' scratch (quantized activations, routing) */
  uint64_t total;          /* weights + kv_cache + activations + workspace */
  uint64_t budget;         /* bytes allowed; 0 = no budget (e.g. the CPU) */
} moe_device_plan;

/* Result of moe_model_fit: the placement a load with the same params would use. */
typedef struct moe_fit_plan {
  size_t struct_size;      /* set to sizeof(moe_fit_plan) before the call */
  int32_t n_cpu_moe;       /* layers whose routed experts are on the CPU (the first ones) */
  int32_t n_gpu_layers;    /* layers on GPUs (the last ones) */
  int32_t cpu_moe;         /* 1 when every layer's routed experts are on the CPU */
  uint32_t n_ctx;          /* KV cells the plan reserves (below fit_n_ctx only with fit_shrink_ctx) */
  int32_t fitted;          /* 1 when the fit chose at least one value, 0 when params fixed them all */
  size_t n_devices;        /* entries filled in devices (a plan over more than 8 devices lists its first 8) */
  moe_device_plan devices[8];
} moe_fit_plan;
/* struct_size of the first layout (680 bytes on 64-bit targets). */
#define MOE_FIT_PLAN_SIZE_V1 (offsetof(moe_fit_plan, devices) + 8 * sizeof(moe_device_plan))

/* Dry run of moe_model_load's placement: reads the file's metadata and tensor table (no
 * weights), resolves params' placement (fitting the unset values when params->fit is 1)
 * and fills *out with the plan per device. params may be NULL (defaults); out->struct_size
 * must be set. MOE_STATUS_OUT_OF_MEMORY when no placement fits the budgets. Nothing is
 * allocated on any device. */
MOE_API moe_status moe_model_fit(const char *path, const moe_model_params *params, moe_fit_plan *out);

/* Frees a model. NULL is a no-op. All contexts of the model must be freed first. */
MOE_API void moe_model_free(moe_model *model);

/* CPU weights of a memory-mapped model: 1 (default) = the model's first CPU context copies
 * them once into 2 MiB huge pages shared by its contexts (decode reads ~25% faster; mapped
 * pages are released as they are copied, so resident memory holds the weights about once;
 * made in ordinary pages where the OS offers no huge pages), after which nothing reads the
 * file: truncating or replacing it on disk cannot fault a decode;
 * 0 = CPU kernels read the mapped file pages in place (then the file must stay unchanged
 * while the model lives: a truncated file faults the process with SIGBUS on the next decode,
 * as for any mapped file). Call before the first CPU context:
 * once the copy exists this returns MOE_STATUS_BUSY and changes nothing. Not thread-safe
 * against a concurrent moe_context_create on the same model. */
MOE_API moe_status moe_model_set_cpu_weight_copy(moe_model *model, int32_t enabled);

typedef struct moe_model_info {
  size_t struct_size;      /* set to sizeof(moe_model_info) before the call */
  int32_t n_vocab;         /* vocabulary size (logits per position) */
  int32_t n_ctx_train;     /* context length the model was trained with */
  int32_t n_embd;          /* hidden size */
  int32_t n_layer;         /* transformer blocks */
  int32_t n_head;          /* attention heads */
  int32_t n_head_kv;       /* KV heads */
  int32_t n_expert;        /* experts per MoE layer (0 = dense) */
  int32_t n_expert_used;   /* experts chosen per token */
  uint64_t n_params;       /* total weight elements */
  uint64_t weight_bytes;   /* total weight bytes as stored */
  char arch[64];           /* NUL-terminated general.architecture ("qwen3moe", ...) */
} moe_model_info;
/* struct_size of the first layout (120 bytes on 64-bit targets). */
#define MOE_MODEL_INFO_SIZE_V1 (offsetof(moe_model_info, arch) + 64)

/* Fills *out; out->struct_size must be set. */
MOE_API moe_status moe_model_get_info(const moe_model *model, moe_model_info *out);

/* Number of GGUF metadata entries. */
MOE_API moe_status moe_model_meta_count(const moe_model *model, size_t *out_count);

/* Key of metadata entry index, copied NUL-terminated into buf. *out_len receives the key
 * length without the NUL (buf needs *out_len + 1 bytes; else BUFFER_TOO_SMALL). */
MOE_API moe_status moe_model_meta_key(const moe_model *model, size_t index, char *buf,
                                      size_t buf_size, size_t *out_len);

/* Value of metadata key as text (numbers in decimal, arrays as "[a, b, ...]" truncated to
 * 16 elements), same buffer protocol as moe_model_meta_key. Unknown key: INVALID_ARGUMENT. */
MOE_API moe_status moe_model_meta_value(const moe_model *model, const char *key, char *buf,
                                        size_t buf_size, size_t *out_len);

/* ------------------------------------------------------------------ vocabulary */

/* Special tokens; -1 when the model has none (or model is NULL). */
MOE_API int32_t moe_token_bos(const moe_model *model);
MOE_API int32_t moe_token_eos(const moe_model *model);
MOE_API int32_t moe_token_eot(const moe_model *model);
/* 1 when token ends generation (eos, eot, ...), 0 otherwise (also for NULL / out of range). */
MOE_API int32_t moe_token_is_eog(const moe_model *model, int32_t token);

enum {
  MOE_TOKENIZE_ADD_SPECIAL = 1u << 0,    /* add BOS/EOS as the model's metadata asks */
  MOE_TOKENIZE_PARSE_SPECIAL = 1u << 1   /* recognise special-token text ("<|im_start|>") */
};

/* Tokenizes text[0..text_len). Writes up to max_tokens ids into tokens (may be NULL when
 * max_tokens is 0) and the count into *out_n_tokens; if max_tokens is too small returns
 * BUFFER_TOO_SMALL with the required count in *out_n_tokens. flags: MOE_TOKENIZE_*. */
MOE_API moe_status moe_tokenize(const moe_model *model, const char *text, size_t text_len,
                                int32_t *tokens, size_t max_tokens, size_t *out_n_tokens,
                                uint32_t flags);

enum {
  MOE_DETOKENIZE_RENDER_SPECIAL = 1u << 0  /* emit special tokens' text instead of nothing */
};

/* Text of one token (raw bytes, possibly a partial UTF-8 sequence). Writes the bytes plus a
 * NUL into buf; *out_len receives the length without the NUL (buf needs *out_len + 1). */
MOE_API moe_status moe_token_to_piece(const moe_model *model, int32_t token, char *buf,
                                      size_t buf_size, size_t *out_len, uint32_t flags);

/* Text of a token sequence; same buffer protocol as moe_token_to_piece. */
MOE_API moe_status moe_detokenize(const moe_model *model, const int32_t *tokens, size_t n_tokens,
                                  char *buf, size_t buf_size, size_t *out_len, uint32_t flags);

/* Streaming detokenizer for generation loops: text comes out piece by piece and never as
 * a broken UTF-8 sequence (a character split across tokens is held back until complete;
 * bytes that can never form a character become U+FFFD). */
typedef struct moe_detokenizer moe_detokenizer;

/* flags: MOE_DETOKENIZE_*. Keeps the model's vocabulary alive (the model handle may be freed
 * first). Caller owns *out_detok; free with moe_detokenizer_free. */
MOE_API moe_status moe_detokenizer_create(const moe_model *model, uint32_t flags, moe_detokenizer **out_detok);
MOE_API void moe_detokenizer_free(moe_detokenizer *detok);

/* Feeds one token; *out_text / *out_len receive the text completed by it (possibly empty).
 * The text is borrowed, valid until the next call on detok, and NUL-terminated. */
MOE_API moe_status moe_detokenizer_push(moe_detokenizer *detok, int32_t token, const char **out_text,
                                        size_t *out_len);

/* Ends the stream: returns whatever is still held (an unfinished character as U+FFFD) with
 * the same borrowing rule, and resets the detokenizer for reuse. */
MOE_API moe_status moe_detokenizer_flush(moe_detokenizer *detok, const char **out_text, size_t *out_len);

/* ------------------------------------------------------------------ context */

typedef struct moe_context moe_context;

typedef enum moe_kv_type {
  MOE_KV_TYPE_F32 = 0,
  MOE_KV_TYPE_F16 = 1,
  MOE_KV_TYPE_Q8_0 = 2
} moe_kv_type;

/* Limits of moe_context_params (moe_context_create fails with MOE_STATUS_INVALID_ARGUMENT
 * naming the field and its limit): n_ctx <= 16777216 (2^24), n_batch <= 1048576 (2^20),
 * n_ubatch <= 65536 (2^16), n_seq_max <= 64, n_threads 0..1024. They bound what a context
 * allocates when it is created; memory for sizes within them may still run out
 * (MOE_STATUS_OUT_OF_MEMORY). */
typedef struct moe_context_params {
  size_t struct_size;      /* sizeof(moe_context_params); set by moe_context_default_params */
  uint32_t n_ctx;          /* KV cells shared by all sequences, at most 2^24; 0 (default) = min(trained, 4096) */
  uint32_t n_batch;        /* most tokens one decode may take, at most 2^20; default 512; 0 = default */
  uint32_t n_ubatch;       /* tokens per graph run (decodes are split into these), at most 2^16; default 512;
                            * 0 = default; above n_batch = min(n_batch, 512) */
  uint32_t n_seq_max;      /* distinct sequence ids 0..n_seq_max-1, at most 64; default 1; 0 = default */
  int32_t kv_type;         /* moe_kv_type of the KV cache; default MOE_KV_TYPE_F16 */
  int32_t n_threads;       /* CPU worker threads, 0..1024; 0 (default) = physical cores */
  const char *device;      /* "cpu", "cuda", "cuda0" or "auto"; NULL (default) = "auto"; borrowed during create */
  int32_t flash_attn;      /* ignored (kept for the layout): every backend always runs its fused attention
                            * kernel; default 1 */
  /* ---- Second layout (MOE_CONTEXT_PARAMS_SIZE_V2). A caller passing the first layout's
   * size gets the defaults below: the 4 bytes cpu_float_order occupies were that layout's
   * tail padding, so they are never read from such a caller. */
  /* GPU: 1 = products and F32-cache attention of 2..128-token batches sum in the
   * CPU backend's float order, so a GPU context reproduces a CPU one bit for bit (prompts of
   * 16..128 tokens then run 3-8x slower); 0 (default) = the tensor-core kernels' own order
   * (differences of float rounding). No effect on a CPU context. */
  int32_t cpu_float_order;
  uint64_t unused_v2;      /* never read: fills this layout to its end (no tail padding), so the
                            * next layout's fields start at MOE_CONTEXT_PARAMS_SIZE_V2 */
} moe_context_params;

/* struct_size of each published layout (48 and 56 bytes on 64-bit targets); other sizes
 * are MOE_STATUS_INVALID_ARGUMENT. V1 ends after flash_attn and its tail padding. */
#define MOE_CONTEXT_PARAMS_SIZE_V1                                                     \
  (offsetof(moe_context_params, cpu_float_order) +                                     \
   offsetof(moe_context_params, cpu_float_order) % sizeof(void *))
#define MOE_CONTEXT_PARAMS_SIZE_V2 (offsetof(moe_context_params, unused_v2) + sizeof(uint64_t))

/* Defaults of every field above, struct_size = sizeof(moe_context_params).
 * The library also exports moe_context_default_params itself, which returns the first
 * layout (MOE_CONTEXT_PARAMS_SIZE_V1 bytes) to binaries built against that header; this
 * header maps the name to moe_context_default_params_v2. */
#define moe_context_default_params moe_context_default_params_v2
MOE_API moe_context_params moe_context_default_params(void);

/* Creates an inference context (KV cache, buffers) over model. params may be NULL.
 * The context holds its own reference to the model: moe_model_free may come before
 * moe_context_free, and the model's memory is released when the last of the model handle
 * and its contexts is freed. On success *out_ctx is the caller's; free with
 * moe_context_free. On failure *out_ctx is NULL. */
MOE_API moe_status moe_context_create(moe_model *model, const moe_context_params *params,
                                      moe_context **out_ctx);

/* Frees a context; an in-flight asynchronous decode is cancelled and joined first.
 * NULL is a no-op. */
MOE_API void moe_context_free(moe_context *ctx);

/* Context sizes actually in effect (after defaults were resolved); 0 for NULL. */
MOE_API uint32_t moe_context_n_ctx(const moe_context *ctx);
MOE_API uint32_t moe_context_n_batch(const moe_context *ctx);
MOE_API uint32_t moe_context_n_ubatch(const moe_context *ctx);
MOE_API int32_t moe_context_n_vocab(const moe_context *ctx);
/* cpu_float_order in effect (0 or 1; 0 for NULL): what moe_context_create read from params. */
MOE_API int32_t moe_context_cpu_float_order(const moe_context *ctx);

/* Polled by the engine during a decode: after every operation on the CPU, between graph
 * segments (layers) on a GPU. Return nonzero to abort it (the decode then returns
 * MOE_STATUS_ABORTED and the KV cache is unchanged). Called on the thread running the
 * decode (the worker for asynchronous decodes), up to a few thousand times per decode
 * step: keep it cheap (read a flag). Context calls made from it return MOE_STATUS_BUSY. */
typedef int (*moe_abort_callback)(void *user_data);

/* Installs (or with NULL removes) the abort callback. user_data is borrowed. BUSY while a
 * decode is in flight. */
MOE_API moe_status moe_context_set_abort_callback(moe_context *ctx, moe_abort_callback callback,
                                                  void *user_data);

/* GPU decode steps: 1 (default) = each repeated step is captured once as a CUDA graph and
 * replayed; 0 = every kernel is launched eagerly (debugging, profiling). Applies from the
 * next decode; no effect on a CPU context. BUSY while an asynchronous decode is in flight. */
MOE_API moe_status moe_context_set_gpu_graphs(moe_context *ctx, int32_t enabled);

/* Why the context is unusable (MOE_STATUS_CONTEXT_UNUSABLE + message in moe_last_error)
 * or MOE_STATUS_OK when it is usable. */
MOE_API moe_status moe_context_check(const moe_context *ctx);

/* ------------------------------------------------------------------ batch */

typedef struct moe_batch moe_batch;

/* Creates a batch able to hold capacity tokens (1 .. 1<<24). Caller owns *out_batch;
 * free with moe_batch_free. */
MOE_API moe_status moe_batch_create(size_t capacity, moe_batch **out_batch);
MOE_API void moe_batch_free(moe_batch *batch);

/* Removes all tokens (capacity is kept). */
MOE_API moe_status moe_batch_clear(moe_batch *batch);

/* Appends one token at position pos of sequence seq_id; want_logits nonzero asks for its
 * logits. INVALID_ARGUMENT when the batch is full or token/pos/seq_id is negative. */
MOE_API moe_status moe_batch_add(moe_batch *batch, int32_t token, int32_t pos, int32_t seq_id,
                                 int32_t want_logits);

/* Appends tokens[0..n) at positions pos0, pos0+1, ... of seq_id; only the last one gets
 * logits when logits_last is nonzero. Nothing is appended on failure. */
MOE_API moe_status moe_batch_add_sequence(moe_batch *batch, const int32_t *tokens, size_t n,
                                          int32_t pos0, int32_t seq_id, int32_t logits_last);

/* Tokens currently in the batch (0 for NULL). */
MOE_API size_t moe_batch_size(const moe_batch *batch);

/* ------------------------------------------------------------------ decode */

/* Evaluates batch synchronously. MOE_STATUS_CONTEXT_FULL when the KV cache has no room
 * (nothing is shifted or dropped: remove a range with moe_kv_seq_rm and retry);
 * MOE_STATUS_ABORTED when the abort callback stopped it; MOE_STATUS_OUT_OF_MEMORY when an
 * allocation failed (the same batch may be retried); MOE_STATUS_NUMERIC_ERROR when a
 * requested row of logits holds NaN or infinity; BUSY while another decode is in flight.
 * On failure the KV cache is as it was before the call and moe_get_logits fails (with
 * "the last decode failed: ...") until a decode succeeds. */
MOE_API moe_status moe_decode(moe_context *ctx, const moe_batch *batch);

/* Starts evaluating batch on the context's worker thread (created on first use) and
 * returns at once. The batch is copied; it may be reused immediately. BUSY when a decode
 * is already in flight or its result has not been collected with moe_decode_wait. */
MOE_API moe_status moe_decode_submit(moe_context *ctx, const moe_batch *batch);

typedef enum moe_async_state {
  MOE_ASYNC_IDLE = 0,      /* nothing submitted (or the result was collected) */
  MOE_ASYNC_RUNNING = 1,   /* decode in progress */
  MOE_ASYNC_DONE = 2       /* finished; collect the result with moe_decode_wait */
} moe_async_state;

/* Current asynchronous state into *out_state (a moe_async_state). Never blocks. */
MOE_API moe_status moe_decode_poll(const moe_context *ctx, int32_t *out_state);

/* Waits at most timeout_ms milliseconds (0 = just check; negative = until done) for the
 * submitted decode. Returns MOE_STATUS_TIMEOUT if it is still running (the context stays
 * usable: wait again, or cancel); otherwise collects and returns the decode's own status
 * (OK, CONTEXT_FULL, ABORTED, ...) and the state becomes IDLE. INVALID_ARGUMENT when
 * nothing was submitted (or another thread's wait collected the result first). */
MOE_API moe_status moe_decode_wait(moe_context *ctx, int64_t timeout_ms);

/* Asks the in-flight decode (asynchronous, or synchronous on another thread) to stop at
 * the next poll of the abort hook (the next operation on the CPU, the next graph segment
 * on a GPU); its result becomes MOE_STATUS_ABORTED (unless it had already finished).
 * No-op when idle. Callable from any thread. */
MOE_API moe_status moe_decode_cancel(moe_context *ctx);

/* Logits (n_vocab raw floats) of batch entry i of the last completed decode; negative i
 * counts from the end of the entries that asked for logits (-1 = last). Borrowed; valid
 * until the next decode or KV operation on ctx. *out_n_vocab may be NULL.
 * INVALID_ARGUMENT when entry i asked for no logits, or when the last decode failed
 * (moe_last_error: "... the last decode failed: <why>"): a failed decode never leaves the
 * previous step's logits readable. */
MOE_API moe_status moe_get_logits(moe_context *ctx, int32_t i, const float **out_logits,
                                  int32_t *out_n_vocab);

/* ------------------------------------------------------------------ KV cache */
/* Ranges are positions [p0, p1): p0 < 0 means from 0, p1 < 0 means to the end.
 * seq < 0 means every sequence (where noted). All return BUSY while a decode is in flight
 * (synchronous on another thread, or asynchronous until collected). */
/* Models with recurrent layers (qwen3next, qwen35moe: gated DeltaNet) keep, besides the K/V
 * cells of their attention layers, one state per sequence that summarises all its tokens:
 * moe_kv_clear resets every state; moe_kv_seq_cp copies src's state (the range must cover all
 * of src, and dst must be empty, else MOE_STATUS_UNSUPPORTED); moe_kv_seq_rm of every position
 * of a sequence resets its state, of none is a no-op, and of only a part fails with
 * MOE_STATUS_UNSUPPORTED (a state cannot be rewound: remove the sequence and decode its
 * shorter prompt again); moe_kv_seq_keep resets the other states. A decode must continue a
 * sequence after its last position (else MOE_STATUS_INVALID_ARGUMENT). A failed decode leaves
 * the states as they were, like the cells. */

MOE_API moe_status moe_kv_clear(moe_context *ctx);
/* Removes [p0,p1) of seq (seq < 0: all sequences). */
MOE_API moe_status moe_kv_seq_rm(moe_context *ctx, int32_t seq, int32_t p0, int32_t p1);
/* Makes [p0,p1) of seq_src also belong to seq_dst (no copy of data). */
MOE_API moe_status moe_kv_seq_cp(moe_context *ctx, int32_t seq_src, int32_t seq_dst, int32_t p0,
                                 int32_t p1);
/* Removes every sequence except seq. */
MOE_API moe_status moe_kv_seq_keep(moe_context *ctx, int32_t seq);
/* Largest position stored for seq into *out_pos (-1 when empty). */
MOE_API moe_status moe_kv_seq_pos_max(moe_context *ctx, int32_t seq, int32_t *out_pos);
/* KV cells in use into *out_cells. */
MOE_API moe_status moe_kv_used_cells(moe_context *ctx, uint32_t *out_cells);

/* ------------------------------------------------------------------ sequence state */
/* One sequence's state (its KV cells and, for recurrent layers, its recurrent state) as a
 * versioned blob carrying a fingerprint of the model (hyperparameters and every tensor's
 * name, type and shape). It restores into any context of the same model (also one created
 * after the model was freed and loaded again) with the same KV cache type, into any
 * sequence id. Logits are not part of the state: decode the next token after a restore.
 * Restoring validates the whole blob first; a corrupt or truncated blob, one from another
 * model or cache type, or a sequence id out of range is MOE_STATUS_INVALID_ARGUMENT
 * (another format version: UNSUPPORTED; not enough free cells: CONTEXT_FULL) with the
 * reason in moe_last_error(), and the context is unchanged. The blob does not depend on the
 * device: a state saved from a context whose cache is in GPU memory restores into a CPU
 * context and the reverse. BUSY while a decode is in flight. */

/* Writes seq's state to buf; *out_size receives its size. A NULL buf or a buf_size below
 * it returns MOE_STATUS_BUFFER_TOO_SMALL (the size query). */
MOE_API moe_status moe_state_seq_save(moe_context *ctx, int32_t seq, void *buf, size_t buf_size, size_t *out_size);
/* Replaces seq's cells (and recurrent state) with a state from moe_state_seq_save. data is
 * borrowed for the call. */
MOE_API moe_status moe_state_seq_load(moe_context *ctx, int32_t seq, const void *data, size_t size);
/* The same through a file (created or truncated; IO_ERROR when it cannot be written/read). */
MOE_API moe_status moe_state_seq_save_file(moe_context *ctx, int32_t seq, const char *path);
MOE_API moe_status moe_state_seq_load_file(moe_context *ctx, int32_t seq, const char *path);

/* ------------------------------------------------------------------ sampling */

typedef struct moe_sampler moe_sampler;

typedef struct moe_sampler_params {
  size_t struct_size;      /* sizeof(moe_sampler_params); set by moe_sampler_default_params */
  uint64_t seed;           /* PRNG seed for dist; default 0x5EED; same seed + inputs = same tokens */
} moe_sampler_params;
/* struct_size of the first layout (16 bytes on 64-bit targets). */
#define MOE_SAMPLER_PARAMS_SIZE_V1 (offsetof(moe_sampler_params, seed) + sizeof(uint64_t))

MOE_API moe_sampler_params moe_sampler_default_params(void);

/* Creates an empty sampler chain. params may be NULL. Caller owns *out_sampler; free with
 * moe_sampler_free. Stages run in the order they are added; a chain that does not end in
 * greedy or dist samples from the remaining distribution as dist would.
 * Non-finite logits: every stage takes them to their mathematical limit. A NaN logit counts
 * as -INFINITY. -INFINITY is never chosen unless every candidate is -INFINITY/NaN (then dist
 * draws uniformly and greedy takes the lowest id). +INFINITY logits win: dist draws uniformly
 * among them, greedy takes the lowest id, and no filter (top-k/p, min-p, typical) drops them
 * while they fit its count. */
MOE_API moe_status moe_sampler_create(const moe_sampler_params *params, moe_sampler **out_sampler);
MOE_API void moe_sampler_free(moe_sampler *sampler);

/* Picks the most likely token (ties: lowest id). */
MOE_API moe_status moe_sampler_add_greedy(moe_sampler *sampler);
/* Draws from softmax of the remaining candidates with the chain's seeded PRNG. */
MOE_API moe_status moe_sampler_add_dist(moe_sampler *sampler);
/* Divides logits by temperature (> 0); temperature <= 0 keeps only the best token. Tiny
 * temperatures give the limit t -> 0 (only the best logits keep any probability; ties stay
 * ties), huge ones and +INFINITY the limit t -> inf (every finite logit alike); +-INFINITY
 * logits keep their sign. NaN is INVALID_ARGUMENT. */
MOE_API moe_status moe_sampler_add_temperature(moe_sampler *sampler, float temperature);
/* Keeps the k most likely tokens; k <= 0 keeps all. */
MOE_API moe_status moe_sampler_add_top_k(moe_sampler *sampler, int32_t k);
/* Keeps the smallest set whose probability reaches p (0 < p <= 1; p >= 1 keeps all), at
 * least min_keep tokens. */
MOE_API moe_status moe_sampler_add_top_p(moe_sampler *sampler, float p, size_t min_keep);
/* Keeps tokens with probability >= p * max probability (0 <= p <= 1; 0 keeps all). */
MOE_API moe_status moe_sampler_add_min_p(moe_sampler *sampler, float p, size_t min_keep);
/* Locally typical sampling: keeps the tokens whose surprise is closest to the entropy
 * until their probability reaches p (0 < p <= 1; p >= 1 keeps all). */
MOE_API moe_status moe_sampler_add_typical(moe_sampler *sampler, float p, size_t min_keep);
/* Penalties over the last last_n accepted tokens (last_n 0 = off, -1 = whole history up
 * to 4096): logit = logit > 0 ? logit / repeat : logit * repeat (repeat 1 = off; must be > 0),
 * then logit -= count * frequency + (count > 0) * presence (0 = off). */
MOE_API moe_status moe_sampler_add_penalties(moe_sampler *sampler, int32_t last_n, float repeat,
                                             float frequency, float presence);

typedef struct moe_logit_bias {
  int32_t token;           /* token id (>= 0) */
  float bias;              /* added to the token's logit; -INFINITY bans it, +INFINITY forces it
                            * (either sets the logit, whatever it was); NaN is rejected */
} moe_logit_bias;

/* Adds biases[i].bias to the logit of biases[i].token (copied). Tokens >= n_vocab at
 * sampling time are ignored. */
MOE_API moe_status moe_sampler_add_logit_bias(moe_sampler *sampler, const moe_logit_bias *biases,
                                              size_t n_biases);

/* Constrains sampling to a GBNF grammar (the reference engine's syntax: `name ::= ...`
 * rules, | alternation, ( ) grouping, * + ? {m} {m,} {m,n} repetition, "literals",
 * [a-z] / [^...] classes, `.`, escapes \n \r \t \xHH \uHHHH \UHHHHHHHH, # comments) starting
 * at rule root (NULL = "root"). Tokens are matched over their bytes in model's vocabulary:
 * a token that would break the grammar gets -INFINITY, control tokens never qualify, and
 * end-of-generation tokens qualify exactly when the grammar is complete (so once nothing
 * but the end can follow, only they remain). Each sampled or accepted token advances the
 * grammar; accepting a token it does not allow is INVALID_ARGUMENT (so accept a prompt's
 * tokens before adding this stage). Add it before stages that drop candidates (top-k,
 * top-p, ...); sampling fails with INVALID_ARGUMENT when no candidate is allowed.
 * moe_sampler_reset restarts the grammar. grammar, root and model are borrowed for the
 * call (the stage copies what it needs). A syntax error, an undefined rule or left
 * recursion is INVALID_ARGUMENT naming the rule and line; INVALID_VOCAB when model has no
 * tokenizer. */
MOE_API moe_status moe_sampler_add_grammar(moe_sampler *sampler, const moe_model *model, const char *grammar,
                                           const char *root);

/* moe_sampler_add_grammar with the grammar of a JSON Schema (moe_json_schema_to_grammar).
 * The output is a JSON document valid against the schema. */
MOE_API moe_status moe_sampler_add_json_schema(moe_sampler *sampler, const moe_model *model, const char *schema);

/* GBNF grammar (root rule "root") of a JSON Schema: type (string, number, integer,
 * boolean, null, object, array, or a list of them), properties, required, additionalProperties
 * (absent or false: no other members; true or a schema: more members after the listed
 * ones), items, minItems, maxItems, minLength, maxLength, enum, const, anyOf, oneOf and
 * local $ref. Listed properties come in schema order. A keyword that would constrain values
 * further (pattern, format, minimum, allOf, ...) is MOE_STATUS_UNSUPPORTED naming it,
 * never a looser grammar. Written to buf with the buffer protocol (*out_len = length
 * without the NUL). */
MOE_API moe_status moe_json_schema_to_grammar(const char *schema, char *buf, size_t buf_size, size_t *out_len);

/* Samples a token from logits[0..n_vocab) into *out_token and records it in the history
 * (as moe_sampler_accept). */
MOE_API moe_status moe_sampler_sample(moe_sampler *sampler, const float *logits, int32_t n_vocab,
                                      int32_t *out_token);

/* moe_sampler_sample on moe_get_logits(ctx, i). */
MOE_API moe_status moe_sampler_sample_context(moe_sampler *sampler, moe_context *ctx, int32_t i,
                                              int32_t *out_token);

/* Records token in the penalty history (e.g. the prompt's tokens). */
MOE_API moe_status moe_sampler_accept(moe_sampler *sampler, int32_t token);

/* Clears the history and reseeds the PRNG with the chain's seed. */
MOE_API moe_status moe_sampler_reset(moe_sampler *sampler);

/* Replaces the seed and restarts the PRNG from it. */
MOE_API moe_status moe_sampler_set_seed(moe_sampler *sampler, uint64_t seed);

/* ------------------------------------------------------------------ chat templates */
/* A conversation rendered into a prompt with the model's own Jinja chat template
 * (GGUF tokenizer.chat_template) by moeinfer's interpreter; docs/chat.md lists the Jinja
 * features it covers. A template using anything else fails with MOE_STATUS_UNSUPPORTED and
 * a message naming the feature, line and column: never a silently different prompt. */

/* One message. Strings are UTF-8, NUL-terminated, borrowed for the call. NULL = absent.
 * The layout is fixed: later fields come with a new function, never by appending here. */
typedef struct moe_chat_message {
  const char *role;              /* required: "system", "user", "assistant", "tool", "developer", ... */
  const char *content;           /* NULL renders as none (e.g. an assistant turn with only tool calls) */
  const char *reasoning_content; /* earlier thinking of an assistant turn; also shown to templates as
                                  * `thinking` (the name gpt-oss reads) */
  const char *tool_calls;        /* JSON array [{"type":"function","id":..,"function":{"name":..,
                                  * "arguments":{..}}}], given to the template as parsed; whether
                                  * arguments is an object or JSON text is the template's choice */
  const char *tool_call_id;      /* tool results: the call they answer */
  const char *name;              /* tool results: the tool's name */
} moe_chat_message;

typedef struct moe_chat_params {
  size_t struct_size;            /* sizeof(moe_chat_params); set by moe_chat_default_params */
  const char *template_text;     /* a template to use instead of the model's; default NULL */
  const char *template_name;     /* NULL (default): tokenizer.chat_template; else the named variant
                                  * tokenizer.chat_template.<name> (e.g. "tool_use") */
  int32_t add_generation_prompt; /* nonzero: end with the opening of the assistant's turn; default 1 */
  int32_t enable_thinking;       /* -1 (default): not passed, the template's default applies;
                                  * 0 / 1: enable_thinking = false / true */
  const char *tools;             /* JSON array of tool definitions ({"type":"function","function":{..}});
                                  * default NULL (no tools) */
  const char *extra_context;     /* JSON object whose members become template variables
                                  * (reasoning_effort, clear_thinking, ...); default NULL */
  const char *bos_token;         /* NULL (default): the model's BOS text ("" without a model) */
  const char *eos_token;         /* NULL (default): the model's EOS text ("" without a model) */
  int64_t now_unix;              /* seconds since the epoch that strftime_now() formats (UTC);
                                  * 0 (default): the current time */
} moe_chat_params;
/* struct_size of the first layout (72 bytes on 64-bit targets). */
#define MOE_CHAT_PARAMS_SIZE_V1 (offsetof(moe_chat_params, now_unix) + sizeof(int64_t))

MOE_API moe_chat_params moe_chat_default_params(void);

/* Renders messages[0..n_messages) into buf (NUL-terminated) with the moe buffer protocol:
 * *out_len receives the prompt's length in bytes (without the NUL) even when buf is too
 * small (MOE_STATUS_BUFFER_TOO_SMALL; pass NULL/0 to query). model may be NULL when
 * params->template_text is set. params may be NULL (defaults).
 * INVALID_ARGUMENT: a NULL role, bad JSON in tool_calls/tools/extra_context, a template
 * error or the template's raise_exception() (its message is in moe_last_error), or a model
 * without the requested template. UNSUPPORTED: the template uses a Jinja feature moeinfer
 * does not implement. */
MOE_API moe_status moe_chat_apply_template(const moe_model *model, const moe_chat_message *messages,
                                           size_t n_messages, const moe_chat_params *params, char *buf,
                                           size_t buf_size, size_t *out_len);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* MOEINFER_H */
