#include "ascend_loader.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace jas {
namespace {

std::mutex g_mu;
const LoadedCann* g_cann = nullptr;  // guarded by g_mu
// Every table ever loaded; never freed, so pointers handed out stay valid.
std::vector<std::unique_ptr<LoadedCann>>& AllTables() {
  static auto* tables = new std::vector<std::unique_ptr<LoadedCann>>();
  return *tables;
}

std::vector<std::string> SearchDirs() {
  std::vector<std::string> dirs;
  for (const char* var : {"ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && *v != '\0') dirs.push_back(std::string(v) + "/lib64");
  }
  return dirs;
}

// Candidate paths for `soname`: each directory, then the bare name (the
// loader's own search: LD_LIBRARY_PATH, rpath, ld.so.cache).
std::vector<std::string> Candidates(const std::string& soname) {
  std::vector<std::string> out;
  for (const std::string& d : SearchDirs()) out.push_back(d + "/" + soname);
  out.push_back(soname);
  return out;
}

// Opens `path` and resolves every symbol in `names` into `slots`.  Appends
// to `tried` why it failed.  Returns the handle, or nullptr (slots cleared).
// Handles are never closed: code from them may be in use by a handler at any
// time.
void* TryOpen(const std::string& path, const std::vector<const char*>& names,
              const std::vector<void**>& slots, std::string* tried) {
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* e = dlerror();
    *tried += "\n  " + path + ": " + (e ? e : "cannot be opened");
    return nullptr;
  }
  std::string missing;
  for (size_t i = 0; i < names.size(); ++i) {
    *slots[i] = dlsym(handle, names[i]);
    if (*slots[i] == nullptr) missing += std::string(missing.empty() ? "" : ", ") + names[i];
  }
  if (!missing.empty()) {
    *tried += "\n  " + path + ": opened, but lacks symbol(s) " + missing;
    for (void** slot : slots) *slot = nullptr;
    return nullptr;
  }
  return handle;
}

template <typename Fn>
void** Slot(Fn* fn) {
  return reinterpret_cast<void**>(fn);
}

std::string RealPath(const std::string& path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) != nullptr ? std::string(buf) : path;
}

// The file that defines `fn` (dladdr), or "".
std::string FileOf(void* fn) {
  Dl_info info{};
  if (fn == nullptr || dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

// Resolves `names` through `handle` and the libraries it depends on, as
// torch_npu resolves CANN's descriptor functions through the operator
// library's own handle: the descriptors then come from the very copy of
// `soname` the operator was linked against.  Returns the path of that copy
// (a search candidate with the same real path when there is one, for a
// readable report), or "" when `handle` does not reach every name.
std::string ResolveThrough(void* handle, const char* soname,
                           const std::vector<const char*>& names,
                           const std::vector<void**>& slots) {
  for (size_t i = 0; i < names.size(); ++i) {
    *slots[i] = dlsym(handle, names[i]);
    if (*slots[i] == nullptr) {
      for (void** slot : slots) *slot = nullptr;
      return "";
    }
  }
  const std::string file = FileOf(*slots[0]);
  const std::string real = RealPath(file);
  for (const std::string& c : Candidates(soname)) {
    if (c.find('/') != std::string::npos && RealPath(c) == real) return c;
  }
  return file;
}

// The error for a mixed installation, or "": `soname` as the operator
// library uses it (`used`) must be the copy the environment's CANN
// directories provide and the copy already loaded in the process, if any.
std::string CheckOneCopy(const char* soname, const std::string& used,
                         const std::string& op_path) {
  const std::string real = RealPath(used);
  std::vector<std::string> others;
  for (const std::string& d : SearchDirs()) {
    const std::string c = d + "/" + soname;
    if (access(c.c_str(), F_OK) == 0 && RealPath(c) != real) others.push_back(c);
  }
  // A copy loaded by someone else (the PJRT plugin, say), found by soname.
  if (void* h = dlopen(soname, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) {
    void* sym = dlsym(h, std::string(soname) == "libnnopbase.so" ? "aclCreateTensor"
                                                                  : "aclrtMalloc");
    const std::string loaded = FileOf(sym);
    if (!loaded.empty() && RealPath(loaded) != real) others.push_back(loaded + " (loaded)");
    dlclose(h);  // drops only the reference RTLD_NOLOAD added
  }
  if (others.empty()) return "";
  std::string msg = std::string("mixed CANN installation: ") + op_path + " uses " + soname +
                    " at " + used + ", but another copy is in use or on the search path:";
  for (const std::string& o : others) msg += "\n  " + o;
  msg += "\n Descriptors made by one copy cannot go to an operator linked against the other."
         " Point ASCEND_HOME_PATH (and JAX_AMP_SCALE_CANN_OPAPI, if set) at one installation.";
  return msg;
}

// Loads `soname`'s functions through the operator's handle (else by the
// search) and refuses a second copy.  Sets `*path`.
bool LoadDependency(void* op_handle, const std::string& op_path, const char* soname,
                    const std::vector<const char*>& names, const std::vector<void**>& slots,
                    std::string* path, std::string* error) {
  *path = ResolveThrough(op_handle, soname, names, slots);
  if (path->empty()) {
    // The operator library does not link it (not CANN's layout): search.
    std::string tried;
    for (const std::string& p : Candidates(soname)) {
      if (TryOpen(p, names, slots, &tried) != nullptr) {
        *path = p;
        break;
      }
    }
    if (path->empty()) {
      std::string list;
      for (const char* n : names) list += std::string(list.empty() ? "" : ", ") + n;
      *error = std::string(soname) + " (" + list + ") not found; searched:" + tried;
      return false;
    }
  }
  *error = CheckOneCopy(soname, *path, op_path);
  return error->empty();
}

// The fused-pass operator (optional): its functions and the tensor-list
// functions, consistent with the descriptors already loaded.  Returns "" or
// why the fused pass is unavailable.
std::string LoadFusedPass(LoadedCann* out, const char* override_path) {
  cann::CannApi& api = out->api;
  const std::vector<const char*> op_names = {
      "aclnnForeachNonFiniteCheckAndUnscaleGetWorkspaceSize",
      "aclnnForeachNonFiniteCheckAndUnscale"};
  const std::vector<void**> op_slots = {Slot(&api.foreach_get_workspace_size),
                                        Slot(&api.foreach_launch)};
  std::string tried;
  void* handle = nullptr;
  std::vector<std::string> paths;
  if (override_path != nullptr) paths.push_back(override_path);  // older CANN: one library
  for (const char* soname : {"libopapi_nn.so", "libopapi.so"}) {
    for (const std::string& p : Candidates(soname)) paths.push_back(p);
  }
  for (const std::string& p : paths) {
    handle = TryOpen(p, op_names, op_slots, &tried);
    if (handle != nullptr) {
      out->opapi_nn_path = p;
      break;
    }
  }
  if (handle == nullptr) return "aclnnForeachNonFiniteCheckAndUnscale not found; searched:" + tried;
  // The operator's own descriptors must be the ones already loaded.
  void* own = dlsym(handle, "aclCreateTensor");
  if (own != nullptr && own != reinterpret_cast<void*>(api.create_tensor)) {
    api.foreach_get_workspace_size = nullptr;
    api.foreach_launch = nullptr;
    return "mixed CANN installation: " + out->opapi_nn_path + " uses libnnopbase.so at " +
           FileOf(own) + ", " + out->opapi_path + " uses " + out->nnopbase_path;
  }
  void* lists = own != nullptr ? handle : dlopen(out->nnopbase_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  *Slot(&api.create_tensor_list) = lists ? dlsym(lists, "aclCreateTensorList") : nullptr;
  *Slot(&api.destroy_tensor_list) = lists ? dlsym(lists, "aclDestroyTensorList") : nullptr;
  if (api.create_tensor_list == nullptr || api.destroy_tensor_list == nullptr) {
    api.foreach_get_workspace_size = nullptr;
    api.foreach_launch = nullptr;
    return out->nnopbase_path + " lacks aclCreateTensorList or aclDestroyTensorList";
  }
  return "";
}

// The optional runtime functions (the SoC, the overflow mode and flag), from
// the libascendcl.so the descriptors came from; then the SoC and the mode,
// once: the dispatch decides from them at trace time.
void LearnDevice(LoadedCann* out) {
  cann::CannApi& api = out->api;
  // Already loaded (RTLD_NOLOAD would do too); never closed, as every handle.
  void* rt = dlopen(out->ascendcl_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (rt != nullptr) {
    *Slot(&api.get_soc_name) = dlsym(rt, "aclrtGetSocName");
    *Slot(&api.get_sat_mode) = dlsym(rt, "aclrtGetDeviceSatMode");
    *Slot(&api.get_overflow_status) = dlsym(rt, "aclrtGetOverflowStatus");
    *Slot(&api.reset_overflow_status) = dlsym(rt, "aclrtResetOverflowStatus");
  }
  const char* soc = api.get_soc_name != nullptr ? api.get_soc_name() : nullptr;
  out->soc = soc != nullptr ? soc : "";
  out->overflow_mode = "unknown";
  cann::aclrtFloatOverflowMode mode = cann::ACL_RT_OVERFLOW_MODE_UNDEF;
  if (api.get_sat_mode != nullptr && api.get_sat_mode(&mode) == 0) {
    switch (mode) {
      case cann::ACL_RT_OVERFLOW_MODE_SATURATION: out->overflow_mode = "saturation"; break;
      case cann::ACL_RT_OVERFLOW_MODE_INFNAN: out->overflow_mode = "inf_nan"; break;
      default: out->overflow_mode = "undef"; break;
    }
  }
}

bool Load(LoadedCann* out, std::string* error) {
  cann::CannApi& api = out->api;
  std::string tried;
  void* op = nullptr;

  const std::vector<const char*> op_names = {
      "aclnnAmpUpdateScaleGetWorkspaceSize", "aclnnAmpUpdateScale"};
  const std::vector<void**> op_slots = {Slot(&api.get_workspace_size),
                                        Slot(&api.launch)};
  const char* override_path = std::getenv("JAX_AMP_SCALE_CANN_OPAPI");
  if (override_path != nullptr && *override_path == '\0') override_path = nullptr;
  if (override_path != nullptr) {
    tried += "\n (JAX_AMP_SCALE_CANN_OPAPI is set: only that path is tried)";
    op = TryOpen(override_path, op_names, op_slots, &tried);
    if (op != nullptr) out->opapi_path = override_path;
  } else {
    for (const char* soname : {"libopapi_math.so", "libopapi.so"}) {
      for (const std::string& p : Candidates(soname)) {
        op = TryOpen(p, op_names, op_slots, &tried);
        if (op != nullptr) {
          out->opapi_path = p;
          break;
        }
      }
      if (op != nullptr) break;
    }
  }
  if (op == nullptr) {
    *error = "aclnnAmpUpdateScale not found; searched:" + tried;
    return false;
  }
  if (!LoadDependency(op, out->opapi_path, "libnnopbase.so",
                      {"aclCreateTensor", "aclDestroyTensor"},
                      {Slot(&api.create_tensor), Slot(&api.destroy_tensor)},
                      &out->nnopbase_path, error)) {
    return false;
  }
  if (!LoadDependency(op, out->opapi_path, "libascendcl.so",
                      {"aclrtMalloc", "aclrtFree", "aclGetRecentErrMsg"},
                      {Slot(&api.rt_malloc), Slot(&api.rt_free), Slot(&api.recent_err_msg)},
                      &out->ascendcl_path, error)) {
    return false;
  }
  // Optional, through the operator's dependencies as torch_npu finds them.
  *Slot(&api.init_huge_mem) = dlsym(op, "InitHugeMemThreadLocal");
  *Slot(&api.uninit_huge_mem) = dlsym(op, "UnInitHugeMemThreadLocal");
  *Slot(&api.release_huge_mem) = dlsym(op, "ReleaseHugeMem");
  out->foreach_error = LoadFusedPass(out, override_path);
  LearnDevice(out);
  return true;
}

}  // namespace

const LoadedCann* GetCann(std::string* error) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_cann != nullptr) return g_cann;
  auto table = std::make_unique<LoadedCann>();
  std::string err;
  if (!Load(table.get(), &err)) {
    *error = "jax_amp_scale: cannot load CANN (" + err +
             "\n Set ASCEND_HOME_PATH (e.g. by sourcing CANN's set_env.sh) or "
             "JAX_AMP_SCALE_CANN_OPAPI to the library that exports "
             "aclnnAmpUpdateScale.)";
    return nullptr;
  }
  g_cann = table.get();
  AllTables().push_back(std::move(table));
  return g_cann;
}

#ifdef JAS_TESTING_BUILD
void ForgetCannForTests() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_cann = nullptr;
}
#endif

}  // namespace jas
