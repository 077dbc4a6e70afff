// Pins the offset of every field of the public structs (64-bit targets) and the size of each
// published layout: inserting, reordering or resizing a field, or appending one into tail
// padding (where a caller of the previous layout has garbage), fails to compile.
// Compiled by CTest (abi.struct_layout) with -fsyntax-only.
#include <cstddef>

#include "moeinfer/moeinfer.h"

#define PIN(type, field, off) static_assert(offsetof(type, field) == (off), #type "." #field " moved")

#if UINTPTR_MAX == 0xFFFFFFFFFFFFFFFFu
PIN(moe_device_info, struct_size, 0);
PIN(moe_device_info, id, 8);
PIN(moe_device_info, name, 40);
PIN(moe_device_info, kind, 168);
PIN(moe_device_info, integrated, 172);
PIN(moe_device_info, memory_total, 176);
PIN(moe_device_info, memory_free, 184);
static_assert(sizeof(moe_device_info) == 192 && MOE_DEVICE_INFO_SIZE_V1 == 192, "moe_device_info v1");

PIN(moe_model_params, struct_size, 0);
PIN(moe_model_params, devices, 8);
PIN(moe_model_params, n_devices, 16);
PIN(moe_model_params, kv_overrides, 24);
PIN(moe_model_params, n_kv_overrides, 32);
PIN(moe_model_params, progress, 40);
PIN(moe_model_params, progress_user_data, 48);
PIN(moe_model_params, use_mmap, 56);
PIN(moe_model_params, vocab_only, 60);
static_assert(MOE_MODEL_PARAMS_SIZE_V1 == 64, "moe_model_params v1 ends at vocab_only");
PIN(moe_model_params, cpu_moe, 64);
PIN(moe_model_params, n_cpu_moe, 68);
PIN(moe_model_params, n_gpu_layers, 72);
PIN(moe_model_params, tensor_split, 80);
PIN(moe_model_params, n_tensor_split, 88);
PIN(moe_model_params, tensor_overrides, 96);
PIN(moe_model_params, n_tensor_overrides, 104);
PIN(moe_model_params, main_device, 112);
PIN(moe_model_params, allow_fallback, 120);
PIN(moe_model_params, zero_copy, 124);
PIN(moe_model_params, fit, 128);
PIN(moe_model_params, fit_budgets, 136);
PIN(moe_model_params, n_fit_budgets, 144);
PIN(moe_model_params, fit_margin, 152);
PIN(moe_model_params, fit_n_ctx, 160);
PIN(moe_model_params, fit_n_ubatch, 164);
PIN(moe_model_params, fit_n_seq_max, 168);
PIN(moe_model_params, fit_kv_type, 172);
PIN(moe_model_params, fit_shrink_ctx, 176);
PIN(moe_model_params, unused_v2, 180);
static_assert(sizeof(moe_model_params) == 184 && MOE_MODEL_PARAMS_SIZE_V2 == 184, "moe_model_params v2");

PIN(moe_device_plan, id, 0);
PIN(moe_device_plan, weights, 32);
PIN(moe_device_plan, kv_cache, 40);
PIN(moe_device_plan, activations, 48);
PIN(moe_device_plan, workspace, 56);
PIN(moe_device_plan, total, 64);
PIN(moe_device_plan, budget, 72);
static_assert(sizeof(moe_device_plan) == 80, "moe_device_plan");

PIN(moe_fit_plan, struct_size, 0);
PIN(moe_fit_plan, n_cpu_moe, 8);
PIN(moe_fit_plan, n_gpu_layers, 12);
PIN(moe_fit_plan, cpu_moe, 16);
PIN(moe_fit_plan, n_ctx, 20);
PIN(moe_fit_plan, fitted, 24);
PIN(moe_fit_plan, n_devices, 32);
PIN(moe_fit_plan, devices, 40);
static_assert(sizeof(moe_fit_plan) == 680 && MOE_FIT_PLAN_SIZE_V1 == 680, "moe_fit_plan v1");

PIN(moe_model_info, struct_size, 0);
PIN(moe_model_info, n_vocab, 8);
PIN(moe_model_info, n_ctx_train, 12);
PIN(moe_model_info, n_embd, 16);
PIN(moe_model_info, n_layer, 20);
PIN(moe_model_info, n_head, 24);
PIN(moe_model_info, n_head_kv, 28);
PIN(moe_model_info, n_expert, 32);
PIN(moe_model_info, n_expert_used, 36);
PIN(moe_model_info, n_params, 40);
PIN(moe_model_info, weight_bytes, 48);
PIN(moe_model_info, arch, 56);
static_assert(sizeof(moe_model_info) == 120 && MOE_MODEL_INFO_SIZE_V1 == 120, "moe_model_info v1");

PIN(moe_context_params, struct_size, 0);
PIN(moe_context_params, n_ctx, 8);
PIN(moe_context_params, n_batch, 12);
PIN(moe_context_params, n_ubatch, 16);
PIN(moe_context_params, n_seq_max, 20);
PIN(moe_context_params, kv_type, 24);
PIN(moe_context_params, n_threads, 28);
PIN(moe_context_params, device, 32);
PIN(moe_context_params, flash_attn, 40);
// The first layout was 48 bytes: flash_attn and 4 bytes of tail padding.
static_assert(MOE_CONTEXT_PARAMS_SIZE_V1 == 48, "moe_context_params v1");
PIN(moe_context_params, cpu_float_order, 44);
PIN(moe_context_params, unused_v2, 48);
static_assert(sizeof(moe_context_params) == 56 && MOE_CONTEXT_PARAMS_SIZE_V2 == 56, "moe_context_params v2");

PIN(moe_sampler_params, struct_size, 0);
PIN(moe_sampler_params, seed, 8);
static_assert(sizeof(moe_sampler_params) == 16 && MOE_SAMPLER_PARAMS_SIZE_V1 == 16, "moe_sampler_params v1");

PIN(moe_logit_bias, token, 0);
PIN(moe_logit_bias, bias, 4);
static_assert(sizeof(moe_logit_bias) == 8, "moe_logit_bias");
#endif

// Every layout constant is also the struct's size for the newest layout (on any target).
static_assert(MOE_CONTEXT_PARAMS_SIZE_V2 == sizeof(moe_context_params), "newest context layout");
static_assert(MOE_MODEL_PARAMS_SIZE_V2 == sizeof(moe_model_params), "newest model layout");
static_assert(MOE_SAMPLER_PARAMS_SIZE_V1 == sizeof(moe_sampler_params), "newest sampler layout");

int main() { return 0; }
