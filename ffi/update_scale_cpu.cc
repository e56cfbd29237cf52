// CPU handler for the update-scale custom call: host memory, one loop over
// the (possibly vmapped) batch of independent states.  Checks and binding
// are handler_common.h's; the rule is update_scale.h's.
#include <cstdint>

#include "update_scale_ffi.h"
#include "xla/ffi/api/ffi.h"

namespace jas {
namespace {

using Cpu = UpdateScaleFfi<>;  // no context: XLA:CPU runs it on its thread

ffi::Error RunOnHost(const UpdateScaleCall& call) {
  const Factor gf = FactorFor(call.rule, call.growth_factor);
  const Factor bf = FactorFor(call.rule, call.backoff_factor);
  for (int64_t i = 0; i < call.count; ++i) {
    UpdateElement(call.dtype, call.scale, call.tracker, call.found_inf,
                  call.scale_out, call.tracker_out, i, gf, bf,
                  call.growth_interval, call.rule);
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jas

XLA_FFI_DEFINE_HANDLER_SYMBOL(JasUpdateScaleCpu, jas::Cpu::Impl(jas::RunOnHost),
                              jas::Cpu::Bind());
