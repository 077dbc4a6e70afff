// C ABI: errors, version, logging, devices.
#include <cstddef>
#include <cstdio>
#include <string>

#include "backends/device_list.h"
#include "c_api_internal.h"
#include "core/log.h"

#ifndef MOEINFER_VERSION_STRING
#define MOEINFER_VERSION_STRING "0.0.0"
#endif

// The C status codes must stay numerically identical to moe::Status (bindings cast).
static_assert(sizeof(moe_status) == sizeof(int), "moe_status must be int-sized");
static_assert(MOE_STATUS_INTERNAL == static_cast<int>(moe::Status::Internal), "status mirror");
static_assert(MOE_STATUS_CONTEXT_FULL == static_cast<int>(moe::Status::ContextFull), "status mirror");
static_assert(MOE_STATUS_TIMEOUT == static_cast<int>(moe::Status::Timeout), "status mirror");
static_assert(MOE_STATUS_BUFFER_TOO_SMALL == static_cast<int>(moe::Status::BufferTooSmall), "status mirror");
static_assert(MOE_STATUS_BUSY == static_cast<int>(moe::Status::Busy), "status mirror");
static_assert(MOE_STATUS_CONTEXT_UNUSABLE == static_cast<int>(moe::Status::ContextUnusable), "status mirror");
static_assert(MOE_STATUS_NUMERIC_ERROR == static_cast<int>(moe::Status::NumericError), "status mirror");
static_assert(MOE_LOG_LEVEL_ERROR == static_cast<int>(moe::LogLevel::Error), "log level mirror");
static_assert(MOE_KV_TYPE_Q8_0 == static_cast<int>(moe::KvType::Q8_0), "kv type mirror");
// The public callback type must be exactly the internal one (passed through uncast).
static_assert(std::is_same<moe_log_callback, moe::LogCallback>::value, "log callback type");
// Layout pins for the v1 ABI (LP64): changing these breaks old binaries.
#if UINTPTR_MAX == 0xFFFFFFFFFFFFFFFFu
static_assert(offsetof(moe_model_params, cpu_moe) == 64, "moe_model_params v1 layout (64 bytes)");
// v2: the placement fields appended after the first layout; every offset is pinned so a
// field can only ever be appended.
static_assert(offsetof(moe_model_params, n_cpu_moe) == 68, "moe_model_params v2 layout");
static_assert(offsetof(moe_model_params, n_gpu_layers) == 72, "moe_model_params v2 layout");
static_assert(offsetof(moe_model_params, tensor_split) == 80, "moe_model_params v2 layout");
static_assert(offsetof(moe_model_params, n_tensor_split) == 88, "moe_model_params v2 layout");
static_assert(offsetof(moe_model_params, tensor_overrides) == 96, "moe_model_params v2 layout");
static_assert(offsetof(moe_model_params, n_tensor_overrides) == 104, "moe_model_params v2 layout");
static_assert(offsetof(moe_model_params, main_device) == 112, "moe_model_params v2 layout");
static_assert(offsetof(moe_model_params, allow_fallback) == 120, "moe_model_params v2 layout");
static_assert(offsetof(moe_model_params, zero_copy) == 124, "moe_model_params v2 layout");
static_assert(offsetof(moe_model_params, fit) == 128, "moe_model_params v2 layout");
static_assert(offsetof(moe_model_params, fit_budgets) == 136, "moe_model_params v2 layout");
static_assert(offsetof(moe_model_params, n_fit_budgets) == 144, "moe_model_params v2 layout");
static_assert(offsetof(moe_model_params, fit_margin) == 152, "moe_model_params v2 layout");
static_assert(offsetof(moe_model_params, fit_n_ctx) == 160, "moe_model_params v2 layout");
static_assert(offsetof(moe_model_params, fit_n_ubatch) == 164, "moe_model_params v2 layout");
static_assert(offsetof(moe_model_params, fit_n_seq_max) == 168, "moe_model_params v2 layout");
static_assert(offsetof(moe_model_params, fit_kv_type) == 172, "moe_model_params v2 layout");
static_assert(offsetof(moe_model_params, fit_shrink_ctx) == 176, "moe_model_params v2 layout");
static_assert(sizeof(moe_model_params) == 184, "moe_model_params v2 layout (184 bytes)");
static_assert(sizeof(moe_device_plan) == 80, "moe_device_plan v1 layout");
static_assert(offsetof(moe_fit_plan, n_devices) == 32, "moe_fit_plan v1 layout");
static_assert(offsetof(moe_fit_plan, devices) == 40, "moe_fit_plan v1 layout");
static_assert(sizeof(moe_fit_plan) == 680, "moe_fit_plan v1 layout");
static_assert(sizeof(moe_context_params) == 56, "moe_context_params v2 layout");
static_assert(sizeof(moe_device_info) == 192, "moe_device_info v1 layout");
static_assert(sizeof(moe_model_info) == 120, "moe_model_info v1 layout");
static_assert(sizeof(moe_sampler_params) == 16, "moe_sampler_params v1 layout");
static_assert(sizeof(moe_logit_bias) == 8, "moe_logit_bias layout");
#endif

namespace moe_c {
namespace {
thread_local char t_last_error[1024] = "";
}

const char *last_error() noexcept { return t_last_error; }

void clear_last_error() noexcept { t_last_error[0] = '\0'; }

void set_last_error(const char *msg) noexcept {
  if (!msg) msg = "";
  std::snprintf(t_last_error, sizeof t_last_error, "%s", msg);
}

moe_status fail(moe_status s, const char *fmt, ...) noexcept {
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(t_last_error, sizeof t_last_error, fmt, ap);
  va_end(ap);
  return s;
}

moe_status copy_string(const std::string &s, char *buf, size_t buf_size, size_t *out_len) {
  if (out_len) *out_len = s.size();
  if (buf_size < s.size() + 1 || !buf)
    return fail(MOE_STATUS_BUFFER_TOO_SMALL, "buffer of %zu bytes too small: %zu needed", buf_size,
                s.size() + 1);
  std::memcpy(buf, s.data(), s.size());
  buf[s.size()] = '\0';
  return MOE_STATUS_OK;
}

}  // namespace moe_c

using namespace moe_c;

extern "C" {

MOE_API const char *moe_status_string(moe_status status) {
  const int v = static_cast<int>(status);
  if (v < 0 || v > MOE_STATUS_NUMERIC_ERROR) return "unknown status";
  return moe::status_name(static_cast<moe::Status>(v));
}

MOE_API const char *moe_last_error(void) { return moe_c::last_error(); }

MOE_API void moe_clear_last_error(void) { moe_c::set_last_error(""); }

MOE_API const char *moe_version_string(void) { return MOEINFER_VERSION_STRING; }

MOE_API uint32_t moe_abi_version(void) { return MOE_ABI_VERSION; }

MOE_API void moe_set_log_callback(moe_log_callback callback, void *user_data) {
  moe::set_log_callback(callback, user_data);  // never throws (errors are contained in it)
}

MOE_API moe_status moe_device_count(size_t *out_count) {
  return guard([&] {
    MOE_CHECK_ARG(out_count, "moe_device_count: out_count is NULL");
    *out_count = moe::list_devices().size();
    return MOE_STATUS_OK;
  });
}

MOE_API moe_status moe_device_get_info(size_t index, moe_device_info *out) {
  return guard([&] {
    MOE_CHECK_ARG(out, "moe_device_get_info: out is NULL");
    MOE_CHECK_ARG(out->struct_size >= sizeof(moe_device_info) && out->struct_size <= sizeof(moe_device_info),
                  "moe_device_get_info: struct_size %zu, expected %zu", out->struct_size,
                  sizeof(moe_device_info));
    const auto devs = moe::list_devices();
    MOE_CHECK_ARG(index < devs.size(), "moe_device_get_info: index %zu out of range (%zu devices)", index,
                  devs.size());
    const moe::DeviceInfo &d = devs[index];
    moe_device_info r;
    std::memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    std::snprintf(r.id, sizeof r.id, "%s", d.name.c_str());
    std::snprintf(r.name, sizeof r.name, "%s", d.description.c_str());
    r.kind = d.is_gpu ? MOE_DEVICE_KIND_GPU : MOE_DEVICE_KIND_CPU;
    r.integrated = d.integrated ? 1 : 0;
    r.memory_total = d.total_memory;
    r.memory_free = d.free_memory;
    write_result(r, out);
    return MOE_STATUS_OK;
  });
}

}  // extern "C"
