#include "ascend_loader.h"

#include <dlfcn.h>

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
// to `tried` why it failed.  Handles are never closed: code from them may be
// in use by a handler at any time.
bool TryOpen(const std::string& path, const std::vector<const char*>& names,
             const std::vector<void**>& slots, std::string* tried) {
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* e = dlerror();
    *tried += "\n  " + path + ": " + (e ? e : "cannot be opened");
    return false;
  }
  std::string missing;
  for (size_t i = 0; i < names.size(); ++i) {
    *slots[i] = dlsym(handle, names[i]);
    if (*slots[i] == nullptr) missing += std::string(missing.empty() ? "" : ", ") + names[i];
  }
  if (!missing.empty()) {
    *tried += "\n  " + path + ": opened, but lacks symbol(s) " + missing;
    return false;
  }
  return true;
}

template <typename Fn>
void** Slot(Fn* fn) {
  return reinterpret_cast<void**>(fn);
}

bool Load(LoadedCann* out, std::string* error) {
  cann::CannApi& api = out->api;
  std::string tried;
  bool ok = false;

  const std::vector<const char*> op_names = {
      "aclnnAmpUpdateScaleGetWorkspaceSize", "aclnnAmpUpdateScale"};
  const std::vector<void**> op_slots = {Slot(&api.get_workspace_size),
                                        Slot(&api.launch)};
  const char* override_path = std::getenv("JAX_AMP_SCALE_CANN_OPAPI");
  if (override_path != nullptr && *override_path != '\0') {
    tried += "\n (JAX_AMP_SCALE_CANN_OPAPI is set: only that path is tried)";
    ok = TryOpen(override_path, op_names, op_slots, &tried);
    if (ok) out->opapi_path = override_path;
  } else {
    for (const char* soname : {"libopapi_math.so", "libopapi.so"}) {
      for (const std::string& p : Candidates(soname)) {
        if (TryOpen(p, op_names, op_slots, &tried)) {
          out->opapi_path = p;
          ok = true;
          break;
        }
      }
      if (ok) break;
    }
  }
  if (!ok) {
    *error = "aclnnAmpUpdateScale not found; searched:" + tried;
    return false;
  }

  tried.clear();
  ok = false;
  for (const std::string& p : Candidates("libnnopbase.so")) {
    if (TryOpen(p, {"aclCreateTensor", "aclDestroyTensor"},
                {Slot(&api.create_tensor), Slot(&api.destroy_tensor)}, &tried)) {
      out->nnopbase_path = p;
      ok = true;
      // Optional: frees an executor that is not launched (error paths).
      void* h = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (h != nullptr) *Slot(&api.destroy_executor) = dlsym(h, "aclDestroyAclOpExecutor");
      break;
    }
  }
  if (!ok) {
    *error = "libnnopbase.so (aclCreateTensor, aclDestroyTensor) not found; searched:" + tried;
    return false;
  }

  tried.clear();
  ok = false;
  for (const std::string& p : Candidates("libascendcl.so")) {
    if (TryOpen(p, {"aclrtMalloc", "aclrtFree", "aclGetRecentErrMsg"},
                {Slot(&api.rt_malloc), Slot(&api.rt_free), Slot(&api.recent_err_msg)},
                &tried)) {
      out->ascendcl_path = p;
      ok = true;
      break;
    }
  }
  if (!ok) {
    *error =
        "libascendcl.so (aclrtMalloc, aclrtFree, aclGetRecentErrMsg) not found; searched:" +
        tried;
    return false;
  }
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

void ForgetCannForTests() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_cann = nullptr;
}

}  // namespace jas
