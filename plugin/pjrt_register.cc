// Registers XLA FFI handlers in a PJRT plugin's FFI registry through the
// PJRT C API FFI extension: GetPjrtApi(), walk PJRT_Api.extension_start to
// the FFI extension, call register_handler with the platform name.  This is
// the route into plugins whose Python side does not forward
// jax.ffi.register_ffi_target (see jax_amp_scale/plugin.py).
#include "pjrt_register.h"

#include <dlfcn.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "pjrt_abi.h"

namespace jas {
namespace {

struct ErrorInfo {
  int32_t code = 0;
  std::string message;
};

// Reads code and message of `err` and frees it.
ErrorInfo Consume(const pjrt::ApiHead* api, pjrt::Error* err) {
  ErrorInfo info;
  pjrt::ErrorMessageArgs m{sizeof(pjrt::ErrorMessageArgs), nullptr, err, nullptr, 0};
  api->error_message(&m);
  if (m.message != nullptr) info.message.assign(m.message, m.message_size);
  pjrt::ErrorGetCodeArgs c{sizeof(pjrt::ErrorGetCodeArgs), nullptr, err, 0};
  if (api->error_get_code(&c) == nullptr) info.code = c.code;
  pjrt::ErrorDestroyArgs d{sizeof(pjrt::ErrorDestroyArgs), nullptr, err};
  api->error_destroy(&d);
  return info;
}

// The size a struct-size error says the plugin expected, or 0.
size_t ExpectedStructSize(const std::string& msg) {
  const std::string key = "size: expected ";
  const size_t at = msg.find(key);
  if (at == std::string::npos) return 0;
  return static_cast<size_t>(std::strtoull(msg.c_str() + at + key.size(), nullptr, 10));
}

}  // namespace

const pjrt::ApiHead* CheckedApi(uintptr_t address) {
  const auto* api = reinterpret_cast<const pjrt::ApiHead*>(address);
  if (api == nullptr) throw std::runtime_error("GetPjrtApi() returned null");
  if (api->struct_size < sizeof(pjrt::ApiHead)) {
    throw std::runtime_error("not a PJRT C API: PJRT_Api.struct_size is " +
                             std::to_string(api->struct_size) + ", expected at least " +
                             std::to_string(sizeof(pjrt::ApiHead)));
  }
  if (api->pjrt_api_version.major_version != 0) {
    throw std::runtime_error("unknown PJRT C API major version " +
                             std::to_string(api->pjrt_api_version.major_version) +
                             " (this registrar knows major version 0)");
  }
  return api;
}

uintptr_t ApiFromLibrary(const std::string& path) {
  dlerror();
  // Never closed: the plugin is (or will be) in use by JAX in this process;
  // opening the file JAX loaded returns JAX's own handle.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* e = dlerror();
    throw std::runtime_error("cannot open PJRT plugin library " + path + ": " +
                             (e ? e : "unknown error"));
  }
  using GetApiFn = const void* (*)();
  auto get_api = reinterpret_cast<GetApiFn>(dlsym(handle, "GetPjrtApi"));
  if (get_api == nullptr) {
    throw std::runtime_error(path + " is not a PJRT plugin: it does not export GetPjrtApi");
  }
  return reinterpret_cast<uintptr_t>(get_api());
}

std::vector<std::pair<int32_t, size_t>> Extensions(uintptr_t address) {
  const pjrt::ApiHead* api = CheckedApi(address);
  std::vector<std::pair<int32_t, size_t>> out;
  int guard = 0;
  for (const pjrt::ExtensionBase* e = api->extension_start; e != nullptr; e = e->next) {
    if (++guard > 256) throw std::runtime_error("PJRT extension chain does not end");
    out.emplace_back(e->type, e->struct_size);
  }
  return out;
}

namespace {

// The FFI extension of `api`, checked: present, of the version with
// register_handler.
const pjrt::FfiExtension* FfiExtensionOf(const pjrt::ApiHead* api) {
  const pjrt::ExtensionBase* ext = api->extension_start;
  int guard = 0;
  while (ext != nullptr && ext->type != pjrt::kExtensionTypeFfi) {
    if (++guard > 256) throw std::runtime_error("PJRT extension chain does not end");
    ext = ext->next;
  }
  if (ext == nullptr) {
    throw std::runtime_error("the PJRT plugin has no FFI extension (PJRT_Extension_Type_FFI)");
  }
  if (ext->struct_size != pjrt::kFfiExtensionSize) {
    throw std::runtime_error(
        "unknown PJRT FFI extension version: struct_size " + std::to_string(ext->struct_size) +
        " (this registrar knows struct_size " + std::to_string(pjrt::kFfiExtensionSize) +
        ", the extension with register_handler)");
  }
  const auto* ffi = reinterpret_cast<const pjrt::FfiExtension*>(ext);
  if (ffi->register_handler == nullptr) {
    throw std::runtime_error("the PJRT FFI extension has no register_handler");
  }
  return ffi;
}

std::runtime_error RegisterFailed(const std::string& target, const std::string& platform,
                                  const ErrorInfo& info) {
  return std::runtime_error("PJRT register_handler failed for '" + target + "' on platform '" +
                            platform + "' (error code " + std::to_string(info.code) +
                            "): " + info.message);
}

}  // namespace

std::string RegisterHandler(uintptr_t address, const std::string& target, void* handler,
                            const std::string& platform) {
  const pjrt::ApiHead* api = CheckedApi(address);
  if (handler == nullptr) throw std::runtime_error("handler is null");
  const pjrt::FfiExtension* ffi = FfiExtensionOf(api);

  // Newer layout first: an older plugin rejects it by struct size (52 is
  // below both older sizes) before reading any field.
  pjrt::RegisterHandlerArgsTyped typed{pjrt::kRegisterHandlerArgsTypedSize,
                                       target.data(),
                                       target.size(),
                                       handler,
                                       platform.data(),
                                       platform.size(),
                                       0};
  pjrt::Error* err = ffi->register_handler(&typed);
  if (err == nullptr) return "typed";
  const ErrorInfo info = Consume(api, err);
  const size_t expected = ExpectedStructSize(info.message);
  const bool older_layout = info.code == pjrt::kErrorCodeInvalidArgument &&
                            (expected == pjrt::kRegisterHandlerArgsVersionedSize ||
                             expected == pjrt::kRegisterHandlerArgsVersionedNoTraitsSize);
  if (!older_layout) throw RegisterFailed(target, platform, info);
  pjrt::RegisterHandlerArgsVersioned versioned{pjrt::kRegisterHandlerArgsVersionedSize,
                                               target.data(),
                                               target.size(),
                                               /*api_version=*/1,
                                               handler,
                                               platform.data(),
                                               platform.size(),
                                               0};
  err = ffi->register_handler(&versioned);
  if (err == nullptr) return "versioned";
  throw RegisterFailed(target, platform, Consume(api, err));
}

}  // namespace jas
