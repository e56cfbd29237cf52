// The one pattern of jax_amp_scale's nanobind modules: they hand out XLA FFI
// handlers as capsules and never register anything themselves (the Python
// side registers them with XLA).
//
//   NB_MODULE(_native_cpu, m) {
//     jas::DefineCapsuleModule(m, "CPU XLA FFI handlers",
//                              {{jas::kUpdateScaleTarget, &JasUpdateScaleCpu}});
//   }
//
// gives the module UPDATE_SCALE_TARGET and UNSCALE_AND_CHECK_TARGET (the
// names of targets.h) and registrations() -> {target name: capsule}.
#ifndef JAX_AMP_SCALE_FFI_CAPSULE_MODULE_H_
#define JAX_AMP_SCALE_FFI_CAPSULE_MODULE_H_

#include <nanobind/nanobind.h>

#include <initializer_list>
#include <vector>

#include "targets.h"
#include "xla/ffi/api/c_api.h"

namespace jas {

// One handler a module hands out, under the target name it implements.
struct Registration {
  const char* target;  // a name with static storage duration (targets.h)
  XLA_FFI_Handler* handler;
};

// The target names of targets.h, as module attributes.
inline void AddTargetNames(nanobind::module_& m) {
  m.attr("UPDATE_SCALE_TARGET") = kUpdateScaleTarget;
  m.attr("UNSCALE_AND_CHECK_TARGET") = kUnscaleAndCheckTarget;
}

// Sets the module's doc, its target-name attributes and registrations(),
// which returns {target: capsule} for every entry of `table`.
inline void DefineCapsuleModule(nanobind::module_& m, const char* doc,
                                std::initializer_list<Registration> table) {
  m.doc() = doc;
  AddTargetNames(m);
  m.def("registrations", [entries = std::vector<Registration>(table)]() {
    nanobind::dict out;
    for (const Registration& r : entries) {
      out[r.target] = nanobind::capsule(reinterpret_cast<void*>(r.handler));
    }
    return out;
  });
}

}  // namespace jas

#endif  // JAX_AMP_SCALE_FFI_CAPSULE_MODULE_H_
