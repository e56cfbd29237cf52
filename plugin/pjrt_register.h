// PJRT C API registrar: puts XLA FFI handlers into a PJRT plugin's registry.
// Every function throws std::runtime_error with a clear message on failure.
#ifndef JAX_AMP_SCALE_PLUGIN_PJRT_REGISTER_H_
#define JAX_AMP_SCALE_PLUGIN_PJRT_REGISTER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace jas {

// dlopen(path) and GetPjrtApi(); returns the PJRT_Api address.
uintptr_t ApiFromLibrary(const std::string& path);

// (type, struct_size) of every extension in the chain of the PJRT_Api at
// `api`, in chain order.
std::vector<std::pair<int32_t, size_t>> Extensions(uintptr_t api);

// Registers the typed XLA FFI `handler` as `target` for `platform` through
// the FFI extension.  Returns which argument layout the plugin took
// ("typed" or "versioned").
std::string RegisterHandler(uintptr_t api, const std::string& target, void* handler,
                            const std::string& platform);

}  // namespace jas

#endif  // JAX_AMP_SCALE_PLUGIN_PJRT_REGISTER_H_
