// CPU handler for the host-report custom call: hands a few small values
// to a Python function, from inside a running program.
//
// jax.debug.callback does the same, but JAX runs any program that holds a
// host callback synchronously through its Python dispatch path, which slows
// every step of a program that only reports on rare overflow steps
// (bench/RESULTS.md).  This call is an ordinary custom call to
// JAX, and costs nothing on the steps where its branch does not run.
//
// Operands: flag (bool, any shape), then values (bool, float32 or int32,
//           any shape).
// Result:   flag, unchanged: the data dependency that keeps the call in the
//           program (it has no JAX effect).
// Attribute report (int64): the key of the Python function in
//           jax_amp_scale/operators/host_report.py (run), which runs it as
//           run(report, [flag, *values]), each operand a flat list.
//
// Nothing is called unless some element of flag is true (under vmap the
// call runs on every step, flagged or not).  An exception the function
// raises becomes the call's error, "ExceptionType: message", which JAX
// raises (JaxRuntimeError, or ValueError from its C++ dispatch path) when
// the result is read.
#include <nanobind/nanobind.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "handler_common.h"
#include "xla/ffi/api/ffi.h"

namespace jas {
namespace {

namespace nb = nanobind;

constexpr char kPythonModule[] = "jax_amp_scale.operators.host_report";

bool IsValueDtype(ffi::DataType dt) {
  return dt == ffi::DataType::PRED || dt == ffi::DataType::F32 || dt == ffi::DataType::S32;
}

ffi::Error CheckReportCall(const ffi::RemainingArgs& args, const ffi::AnyBuffer& out) {
  if (args.size() < 1) return ffi::Error::InvalidArgument("the report needs a flag operand");
  for (size_t k = 0; k < args.size(); ++k) {
    ffi::ErrorOr<ffi::AnyBuffer> arg = args.get<ffi::AnyBuffer>(k);
    if (arg.has_error()) return arg.error();
    const ffi::DataType dt = arg->element_type();
    if (k == 0 ? dt != ffi::DataType::PRED : !IsValueDtype(dt)) {
      return ffi::Error::InvalidArgument(
          "report operand " + std::to_string(k) + " must be " +
          (k == 0 ? "bool" : "bool, float32 or int32") + ", got " + DtypeName(dt));
    }
    if (arg->element_count() > 0 && arg->untyped_data() == nullptr) {
      return ffi::Error::InvalidArgument("report operand " + std::to_string(k) +
                                         " has no data");
    }
  }
  const ffi::AnyBuffer flag = *args.get<ffi::AnyBuffer>(0);
  if (out.element_type() != ffi::DataType::PRED ||
      out.element_count() != flag.element_count() ||
      (out.element_count() > 0 && out.untyped_data() == nullptr)) {
    return ffi::Error::InvalidArgument("the report's result must be the flag's shape, bool");
  }
  return ffi::Error::Success();
}

bool AnyTrue(const ffi::AnyBuffer& flag) {
  const auto* p = static_cast<const uint8_t*>(flag.untyped_data());
  for (size_t i = 0; i < flag.element_count(); ++i) {
    if (p[i] != 0) return true;
  }
  return false;
}

// One operand as a flat Python list (the GIL is held).
nb::list ToList(const ffi::AnyBuffer& b) {
  nb::list out;
  const size_t n = b.element_count();
  switch (b.element_type()) {
    case ffi::DataType::PRED: {
      const auto* p = static_cast<const uint8_t*>(b.untyped_data());
      for (size_t i = 0; i < n; ++i) out.append(nb::bool_(p[i] != 0));
      break;
    }
    case ffi::DataType::F32: {
      const auto* p = static_cast<const float*>(b.untyped_data());
      for (size_t i = 0; i < n; ++i) out.append(nb::float_(static_cast<double>(p[i])));
      break;
    }
    default: {  // S32: CheckReportCall admitted nothing else
      const auto* p = static_cast<const int32_t*>(b.untyped_data());
      for (size_t i = 0; i < n; ++i) out.append(nb::int_(p[i]));
      break;
    }
  }
  return out;
}

ffi::Error RunReport(int64_t report, const ffi::RemainingArgs& args) {
  nb::gil_scoped_acquire gil;
  try {
    nb::list values;
    for (size_t k = 0; k < args.size(); ++k) values.append(ToList(*args.get<ffi::AnyBuffer>(k)));
    // run() returns None, or "ExceptionType: message" for what the report raised.
    nb::object failure = nb::module_::import_(kPythonModule).attr("run")(report, values);
    if (failure.is_none()) return ffi::Error::Success();
    return ffi::Error::Internal(nb::str(failure).c_str());
  } catch (const std::exception& e) {  // the module failed to import, say
    return ffi::Error::Internal(std::string("host report failed: ") + e.what());
  }
}

ffi::Error HostReportCpu(int64_t report, ffi::RemainingArgs args,
                         ffi::Result<ffi::AnyBuffer> out) {
  if (ffi::Error err = CheckReportCall(args, *out); err.failure()) return err;
  const ffi::AnyBuffer flag = *args.get<ffi::AnyBuffer>(0);
  if (out->untyped_data() != flag.untyped_data() && flag.element_count() > 0) {
    std::memcpy(out->untyped_data(), flag.untyped_data(), flag.element_count());
  }
  if (!AnyTrue(flag) || !Py_IsInitialized()) return ffi::Error::Success();
  return RunReport(report, args);
}

}  // namespace
}  // namespace jas

XLA_FFI_DEFINE_HANDLER_SYMBOL(JasHostReportCpu, jas::HostReportCpu,
                              xla::ffi::Ffi::Bind()
                                  .Attr<int64_t>("report")
                                  .RemainingArgs()                    // flag, values
                                  .Ret<xla::ffi::AnyBuffer>());       // flag
