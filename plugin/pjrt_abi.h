// The few PJRT C API declarations the registrar needs, declared from the
// public headers xla/pjrt/c/pjrt_c_api.h and pjrt_c_api_ffi_extension.h.
// Only the leading, ABI-stable parts of each struct are declared: PJRT
// appends fields and signals what a caller/plugin knows by struct_size.
#ifndef JAX_AMP_SCALE_PLUGIN_PJRT_ABI_H_
#define JAX_AMP_SCALE_PLUGIN_PJRT_ABI_H_

#include <cstddef>
#include <cstdint>

namespace jas {
namespace pjrt {

struct Error;  // PJRT_Error, opaque

// PJRT_Extension_Type: the FFI extension is the sixth enumerator.
constexpr int32_t kExtensionTypeFfi = 5;

struct ExtensionBase {  // PJRT_Extension_Base
  size_t struct_size;
  int32_t type;  // a C enum
  ExtensionBase* next;
};

struct ApiVersion {  // PJRT_Api_Version
  size_t struct_size;
  ExtensionBase* extension_start;
  int major_version;
  int minor_version;
};

struct ErrorDestroyArgs {  // PJRT_Error_Destroy_Args
  size_t struct_size;
  ExtensionBase* extension_start;
  Error* error;
};
struct ErrorMessageArgs {  // PJRT_Error_Message_Args
  size_t struct_size;
  ExtensionBase* extension_start;
  const Error* error;
  const char* message;
  size_t message_size;
};
struct ErrorGetCodeArgs {  // PJRT_Error_GetCode_Args
  size_t struct_size;
  ExtensionBase* extension_start;
  const Error* error;
  int32_t code;  // PJRT_Error_Code
};
constexpr int32_t kErrorCodeInvalidArgument = 3;

// The head of PJRT_Api: struct_size, extension chain, version, then the
// three error functions (the first function pointers of the table).
struct ApiHead {
  size_t struct_size;
  ExtensionBase* extension_start;
  ApiVersion pjrt_api_version;
  void (*error_destroy)(ErrorDestroyArgs*);
  void (*error_message)(ErrorMessageArgs*);
  Error* (*error_get_code)(ErrorGetCodeArgs*);
};

// PJRT_FFI_Register_Handler_Args exists in two layouts under the same
// extension version: older XLA carries an api_version (0 untyped, 1 typed)
// before the handler; newer XLA (typed handlers only) dropped it.  The
// extension struct is the same size in both, so the registrar tells them
// apart by the struct-size check every PJRT function performs first.
struct RegisterHandlerArgsTyped {
  size_t struct_size;
  const char* target_name;
  size_t target_name_size;
  void* handler;  // XLA_FFI_Handler*
  const char* platform_name;
  size_t platform_name_size;
  uint32_t traits;  // PJRT_FFI_Handler_TraitsBits
};
constexpr size_t kRegisterHandlerArgsTypedSize =
    offsetof(RegisterHandlerArgsTyped, traits) + sizeof(uint32_t);  // 52

struct RegisterHandlerArgsVersioned {
  size_t struct_size;
  const char* target_name;
  size_t target_name_size;
  int api_version;  // 1: typed XLA FFI handler
  void* handler;
  const char* platform_name;
  size_t platform_name_size;
  uint32_t traits;
};
constexpr size_t kRegisterHandlerArgsVersionedSize =
    offsetof(RegisterHandlerArgsVersioned, traits) + sizeof(uint32_t);  // 60
// The versioned layout before traits were added.
constexpr size_t kRegisterHandlerArgsVersionedNoTraitsSize =
    offsetof(RegisterHandlerArgsVersioned, platform_name_size) + sizeof(size_t);  // 56

using RegisterHandlerFn = Error* (*)(void* args);

// PJRT_FFI_Extension: base, then type-id registration, user data, handler
// registration.  The oldest FFI extension (two functions, 40 bytes) has no
// register_handler.
struct FfiExtension {
  ExtensionBase base;
  void* type_id_register;
  void* user_data_add;
  RegisterHandlerFn register_handler;
};
constexpr size_t kFfiExtensionSize = sizeof(FfiExtension);  // 48

}  // namespace pjrt
}  // namespace jas

#endif  // JAX_AMP_SCALE_PLUGIN_PJRT_ABI_H_
