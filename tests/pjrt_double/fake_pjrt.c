/* A fake PJRT plugin for the registrar's tests: just enough of PJRT_Api
 * (head, error functions, extension chain) to exercise every branch of
 * plugin/pjrt_register.cc.  $FAKE_PJRT_MODE, read by each GetPjrtApi():
 *   typed      FFI extension, register_handler takes the newer layout
 *   versioned  register_handler takes the older layout (with api_version) and
 *              rejects smaller structs the way XLA does
 *   no_ffi     an extension chain without the FFI extension
 *   ffi_v1     an FFI extension of 40 bytes (no register_handler)
 *   error      register_handler fails with ALREADY_EXISTS
 *   major1     PJRT API major version 1
 * fake_pjrt_log() returns one line per accepted registration. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef struct Ext {
  size_t struct_size;
  int32_t type;
  struct Ext* next;
} Ext;
typedef struct {
  int32_t code;
  char msg[256];
} Err;
typedef struct {
  size_t struct_size;
  void* ext;
  Err* error;
} DestroyArgs;
typedef struct {
  size_t struct_size;
  void* ext;
  const Err* error;
  const char* message;
  size_t message_size;
} MessageArgs;
typedef struct {
  size_t struct_size;
  void* ext;
  const Err* error;
  int32_t code;
} CodeArgs;
typedef struct {
  size_t struct_size;
  void* ext;
  size_t v_struct_size;
  void* v_ext;
  int major, minor;
  void (*destroy)(DestroyArgs*);
  void (*message)(MessageArgs*);
  Err* (*code)(CodeArgs*);
  void* more[8];
} Api;
typedef struct {
  Ext base;
  void* type_id_register;
  void* user_data_add;
  Err* (*register_handler)(void*);
} Ffi;
typedef struct {
  size_t struct_size;
  const char* target;
  size_t target_size;
  void* handler;
  const char* platform;
  size_t platform_size;
  uint32_t traits;
} TypedArgs;
typedef struct {
  size_t struct_size;
  const char* target;
  size_t target_size;
  int api_version;
  void* handler;
  const char* platform;
  size_t platform_size;
  uint32_t traits;
} VersionedArgs;

static char logbuf[8192];

static void destroy(DestroyArgs* a) { free(a->error); }
static void message(MessageArgs* a) {
  a->message = a->error->msg;
  a->message_size = strlen(a->error->msg);
}
static Err* code(CodeArgs* a) {
  a->code = a->error->code;
  return NULL;
}
static Err* make_err(int32_t c, const char* fmt, size_t x, size_t y) {
  Err* e = calloc(1, sizeof *e);
  e->code = c;
  snprintf(e->msg, sizeof e->msg, fmt, x, y);
  return e;
}
static void log_reg(const char* layout, const char* t, size_t tn, const char* p, size_t pn,
                    int version, void* h) {
  size_t len = strlen(logbuf);
  snprintf(logbuf + len, sizeof logbuf - len, "%s %.*s %.*s %d %p\n", layout, (int)tn, t, (int)pn,
           p, version, h);
}
static Err* reg_typed(void* v) {
  TypedArgs* a = v;
  if (a->struct_size < 52)
    return make_err(3, "Unexpected PJRT_FFI_Register_Handler_Args size: expected %zu, got %zu.",
                    52, a->struct_size);
  log_reg("typed", a->target, a->target_size, a->platform, a->platform_size, -1, a->handler);
  return NULL;
}
static Err* reg_versioned(void* v) {
  VersionedArgs* a = v;
  if (a->struct_size < 60)
    return make_err(3, "Unexpected PJRT_FFI_Register_Handler_Args size: expected %zu, got %zu.",
                    60, a->struct_size);
  log_reg("versioned", a->target, a->target_size, a->platform, a->platform_size, a->api_version,
          a->handler);
  return NULL;
}
static Err* reg_error(void* v) {
  (void)v;
  return make_err(6, "handler already registered (%zu%zu)", 4, 2);
}

static Ext other = {24, 1, NULL};
static Ffi ffi;
static Api api;

EXPORT const void* GetPjrtApi(void) {
  const char* mode = getenv("FAKE_PJRT_MODE");
  if (!mode) mode = "typed";
  memset(&api, 0, sizeof api);
  memset(&ffi, 0, sizeof ffi);
  api.struct_size = sizeof api;
  api.v_struct_size = 24;
  api.major = strcmp(mode, "major1") == 0 ? 1 : 0;
  api.minor = 99;
  api.destroy = destroy;
  api.message = message;
  api.code = code;
  ffi.base.struct_size = strcmp(mode, "ffi_v1") == 0 ? 40 : sizeof ffi;
  ffi.base.type = 5;
  ffi.base.next = NULL;
  ffi.register_handler = strcmp(mode, "versioned") == 0 ? reg_versioned
                         : strcmp(mode, "error") == 0   ? reg_error
                                                        : reg_typed;
  other.next = strcmp(mode, "no_ffi") == 0 ? NULL : &ffi.base;
  api.ext = &other;
  return &api;
}

EXPORT const char* fake_pjrt_log(void) { return logbuf; }
