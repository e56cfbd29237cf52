/* Core of the CANN test double (see cann_double.h).
 *
 * It implements aclnnAmpUpdateScale on host memory as CANN's published
 * kernel computes it (see "the operator's rule" below, cited by file:line),
 * on its own: it shares no code with ffi/update_scale.h.  Every call
 * is checked the way the operator documents (dtypes, shapes, format,
 * attribute range, two-phase order) and recorded as one JSON line.  Tests
 * drive it through the exported cd_* control functions (ctypes). */
#define _GNU_SOURCE
#include "cann_double.h"

#include <fenv.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

enum { ACL_FLOAT = 0, ACL_FLOAT16 = 1, ACL_INT32 = 3, ACL_BF16 = 27, ACL_FORMAT_ND = 2 };
enum { ST_NULLPTR = 161001, ST_INVALID = 161002, ST_TILING = 561002 };
/* An operator on a SoC that CANN's page lists as unsupported: the page gives
 * no status for it, so the double answers 561003, aclnn's inner "kernel not
 * found" code (an assumption, not a source; the library never makes such a
 * call under backend="auto", and "ffi" refuses before tracing). */
enum { ST_NO_KERNEL = 561003 };
/* aclError ACL_ERROR_INVALID_PARAM (acl/acl_base.h), for the runtime calls. */
enum { ACL_INVALID_PARAM = 100000 };
#define MAXDIMS 8
#define TENSOR_MAGIC 0x7e45044bu
#define EXEC_MAGIC 0xe8ec0701u

struct cd_tensor {
  uint32_t magic;
  int64_t id;
  uint64_t ndims, nstorage;
  int64_t dims[MAXDIMS], strides[MAXDIMS], storage[MAXDIMS];
  int64_t offset;
  int32_t dtype, format;
  void* data;
};

#define CD_MAX_LIST 256 /* foreach_non_finite_check_and_unscale_tiling.h:30 */
#define LIST_MAGIC 0x1157a11cu

struct cd_tensor_list {
  uint32_t magic;
  int64_t id;
  uint64_t size;
  cd_tensor** tensors;
};

enum { EXEC_UPDATE_SCALE = 0, EXEC_FOREACH = 1 };

struct cd_executor {
  uint32_t magic;
  int64_t id;
  int kind;
  /* foreach: the list's tensors at GetWorkspaceSize time */
  uint64_t ntensors;
  void* datas[CD_MAX_LIST];
  int64_t counts[CD_MAX_LIST];
  void* inv;
  int32_t dtype;
  void *scale, *tracker, *found, *scale_out, *tracker_out;
  double gf, bf;
  int64_t gi;
  uint64_t ws_size;
};

typedef struct {
  void* ptr;
  size_t size;
} cd_alloc;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int logging = 1;
static char* logbuf;
static size_t loglen, logcap;
static char recent[1024];
static uint64_t ws_knob;
static struct {
  char api[64];
  int32_t status;
  char msg[512];
} failure;
/* stats */
static int64_t live_tensors, created, destroyed, live_execs, gws_calls, run_calls, bad_calls;
static int64_t live_lists, lists_created, lists_destroyed;
static int64_t next_id = 1;
static cd_alloc* allocs;
static size_t nallocs, capallocs;
static int64_t total_allocs, total_frees;

/* ---- the device: its SoC, its overflow mode, its float status register ----
 *
 * The SoC name comes from $JAS_CANN_DOUBLE_SOC (default Ascend910B2, an Atlas
 * A2), the mode from $JAS_CANN_DOUBLE_OVERFLOW_MODE ("saturation" or
 * "inf_nan", default inf_nan), as CANN's INF_NAN_MODE_ENABLE lets an A2/A3
 * choose; the products that have one mode only ignore it (hiascend
 * Pytorch/600 Envvariables Envir_004; hicann/runtime 25-02_Enumerations.md):
 * saturation on the Atlas training series (910), the inference series (310P),
 * INF_NAN on the 950.  One register per device (the anchors all-reduce it:
 * it is per device), sticky until reset; the current device is per thread
 * (aclrtSetDevice), as in ACL. */
static void set_msg(const char* fmt, ...);
#define CD_MAX_DEVICES 64
static uint32_t float_status[CD_MAX_DEVICES];
static int64_t flag_clears, flag_reads;
static __thread int32_t current_device;

static const char* const kTrainingSeries[] = {"Ascend910A", "Ascend910B", "Ascend910ProA",
                                              "Ascend910ProB", "Ascend910PremiumA", NULL};
static const char* const kInferenceSeries[] = {"Ascend310P1", "Ascend310P2", "Ascend310P3",
                                               "Ascend310P4", "Ascend310P5", "Ascend310P7",
                                               NULL};

static int in_list(const char* soc, const char* const* list) {
  for (; *list; ++list)
    if (strcmp(soc, *list) == 0) return 1; /* exact: "Ascend910B" is not "Ascend910B2" */
  return 0;
}

static const char* soc_name(void) {
  const char* v = getenv("JAS_CANN_DOUBLE_SOC");
  return v && *v ? v : "Ascend910B2";
}

/* 0 saturation, 1 INF_NAN (aclrtFloatOverflowMode). */
static int sat_mode(void) {
  const char* soc = soc_name();
  if (in_list(soc, kTrainingSeries) || in_list(soc, kInferenceSeries)) return 0;
  if (strncmp(soc, "Ascend950", 9) == 0) return 1;
  const char* v = getenv("JAS_CANN_DOUBLE_OVERFLOW_MODE");
  return v && strcmp(v, "saturation") == 0 ? 0 : 1;
}

/* Whether `op` runs on this SoC: aclnnAmpUpdateScale not on the training
 * series nor 310P (hicann/ops-math math/amp_update_scale/docs/
 * aclnnAmpUpdateScale.md); aclnnForeachNonFiniteCheckAndUnscale not on the
 * training series (hicann/ops-nn foreach/foreach_non_finite_check_and_unscale/
 * docs/aclnnForeachNonFiniteCheckAndUnscale.md). */
static int32_t refused_on_soc(const char* op, int update_scale) {
  const char* soc = soc_name();
  if (in_list(soc, kTrainingSeries) || (update_scale && in_list(soc, kInferenceSeries))) {
    set_msg("%s is not supported on SoC %s", op, soc);
    return ST_NO_KERNEL;
  }
  return 0;
}

static void raise_status(void) {
  const int32_t d = current_device;
  if (d >= 0 && d < CD_MAX_DEVICES) float_status[d] = 1;
}

static void logf_(const char* fmt, ...) {
  if (!logging) return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n >= sizeof line) n = sizeof line - 1;
  if (loglen + (size_t)n + 2 > logcap) {
    size_t cap = logcap ? logcap * 2 : 1 << 16;
    while (cap < loglen + (size_t)n + 2) cap *= 2;
    char* p = realloc(logbuf, cap);
    if (!p) return;
    logbuf = p;
    logcap = cap;
  }
  memcpy(logbuf + loglen, line, (size_t)n);
  loglen += (size_t)n;
  logbuf[loglen++] = '\n';
  logbuf[loglen] = '\0';
}

static void set_msg(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(recent, sizeof recent, fmt, ap);
  va_end(ap);
}

/* Returns the injected status for `api` (0: none) and sets its message. */
static int32_t injected(const char* api) {
  if (failure.status != 0 && strcmp(failure.api, api) == 0) {
    set_msg("%s", failure.msg);
    return failure.status;
  }
  return 0;
}

/* ---- the operator's rule, as CANN's published kernel computes it ----
 *
 * hicann/ops-math (commit c41933244) math/amp_update_scale/:
 * - op_host/amp_update_scale_tiling.cpp:63-71: the factors reach the kernel
 *   as float (the API's double is rounded to float32 on the way: a C cast,
 *   nearest even); :73-80: the interval must lie in [1, INT32_MAX] (tiling
 *   error 561002, checked in cd_get_workspace_size).
 * - op_kernel/amp_update_scale.h:115-134: scale and found_inf widened to
 *   float32; :140 `if (foundInf_)` (float to bool: nonzero, subnormal, NaN);
 *   :141 backoff as a float32 product, no finiteness test; :144 int32
 *   tracker + 1; :146-147 growth as a float32 product kept when IsFinite
 *   (:86-93, on the float32 exponent bits); :162-172 the cast to the scale's
 *   dtype happens at the store, after that test (so float16 32768 * 2 is
 *   stored as inf).
 * Host float32 arithmetic in the default environment (IEEE, subnormals
 * kept) stands in for the vector unit; the float16 store uses the
 * compiler's _Float16 conversion (nearest even), bfloat16 CAST_RINT. */
static float load(int32_t dt, const void* p) {
  if (dt == ACL_FLOAT) {
    float f;
    memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, p, 2);
  if (dt == ACL_FLOAT16) {
    _Float16 x;
    memcpy(&x, &h, 2);
    return (float)x;
  }
  uint32_t u = (uint32_t)h << 16; /* bfloat16 is float32's top half */
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* float32 -> bfloat16 with round-to-nearest-even (CAST_RINT), on the bits. */
static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN */
  const uint32_t lsb = (u >> 16) & 1u;
  u += 0x7FFFu + lsb; /* carries into the exponent; overflow gives inf */
  return (uint16_t)(u >> 16);
}

/* In saturation mode a kernel stores an overflow as +-MAX of the dtype and
 * NaN as 0, and sets the device's float status register (Envir_004: "overflow
 * becomes the maximum of the data type, NaN becomes 0"). */
static float saturate(int32_t dt, float v) {
  const float max = dt == ACL_FLOAT ? 3.40282347e38f : dt == ACL_FLOAT16 ? 65504.0f : 3.38953139e38f;
  if (v != v) {
    raise_status();
    return 0.0f;
  }
  if (v > max || v < -max) {
    raise_status();
    return v > 0 ? max : -max;
  }
  if (dt == ACL_FLOAT16 && (v >= 65520.0f || v <= -65520.0f)) { /* rounds to inf */
    raise_status();
    return v > 0 ? max : -max;
  }
  return v;
}

static void store(int32_t dt, void* p, float v) {
  if (sat_mode() == 0) v = saturate(dt, v);
  if (dt == ACL_FLOAT) {
    memcpy(p, &v, 4);
  } else if (dt == ACL_FLOAT16) {
    _Float16 x = (_Float16)v; /* amp_update_scale.h:165 static_cast<half> */
    memcpy(p, &x, 2);
  } else {
    uint16_t b = to_bf16(v); /* amp_update_scale.h:171 CAST_RINT */
    memcpy(p, &b, 2);
  }
}

/* IsFinite of amp_update_scale.h:86-93: exponent bits not all ones. */
static int is_finite_f32(float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  return ((u & 0x7FFFFFFFu) >> 23) != 0xFFu;
}

static void apply_rule(const cd_executor* e) {
  const float gf = (float)e->gf, bf = (float)e->bf; /* tiling: float attributes */
  float scale = load(e->dtype, e->scale);
  const float found = load(e->dtype, e->found);
  int32_t tracker;
  memcpy(&tracker, e->tracker, 4);
  if (found != 0.0f || found != found) { /* :140, float -> bool */
    scale *= bf;                         /* :141 */
    tracker = 0;
  } else {
    const int32_t successful = (int32_t)((uint32_t)tracker + 1u); /* :144, wraps */
    if ((int64_t)successful == e->gi) {
      const float grown = scale * gf; /* :146 */
      if (is_finite_f32(grown)) scale = grown;
      tracker = 0;
    } else {
      tracker = successful;
    }
  }
  store(e->dtype, e->scale_out, scale); /* :162-172, after the test */
  memcpy(e->tracker_out, &tracker, 4);
}

/* ---- aclnnForeachNonFiniteCheckAndUnscale, as CANN's published kernel ----
 *
 * hicann/ops-nn (commit e5c3fa932) foreach/foreach_non_finite_check_and_unscale/
 * op_kernel/foreach_non_finite_check_and_unscale_n_d.h: float16/bfloat16
 * grads are cast to float32 (:242, CAST_NONE: exact); the float32 values
 * are checked (:187-209: ReduceMax/ReduceMin of the *scaled* input tested by
 * IsNonFinite, :259-267, on the exponent bits) and foundInf is *set* to 1.0
 * (:195, :205), never cleared; each value is multiplied by invScale in
 * float32 (:211, Muls) and cast back with CAST_RINT (:252), in place. */
static void apply_foreach(const cd_executor* e) {
  float inv, one = 1.0f;
  memcpy(&inv, e->inv, 4);
  int found = 0;
  for (uint64_t k = 0; k < e->ntensors; ++k) {
    const size_t item = e->dtype == ACL_FLOAT ? 4 : 2;
    char* base = e->datas[k];
    for (int64_t i = 0; i < e->counts[k]; ++i) {
      float v = load(e->dtype, base + (size_t)i * item);
      if (!is_finite_f32(v)) found = 1;
      store(e->dtype, base + (size_t)i * item, v * inv);
    }
  }
  if (found) memcpy(e->found, &one, 4); /* set only */
}

/* ---- registry helpers ---- */
static int tensor_ok(const cd_tensor* t) { return t && t->magic == TENSOR_MAGIC; }

static void fmt_dims(char* out, size_t n, const int64_t* d, uint64_t k) {
  size_t off = 0;
  off += (size_t)snprintf(out + off, n - off, "[");
  for (uint64_t i = 0; i < k && off < n; ++i)
    off += (size_t)snprintf(out + off, n - off, "%s%lld", i ? "," : "", (long long)d[i]);
  if (off < n) snprintf(out + off, n - off, "]");
}

EXPORT cd_tensor* cd_create_tensor(const int64_t* view_dims, uint64_t view_dims_num,
                                   int32_t dtype, const int64_t* stride, int64_t offset,
                                   int32_t format, const int64_t* storage_dims,
                                   uint64_t storage_dims_num, void* data) {
  pthread_mutex_lock(&mu);
  cd_tensor* t = NULL;
  if (injected("aclCreateTensor")) goto out;
  if (view_dims_num > MAXDIMS || storage_dims_num > MAXDIMS ||
      (view_dims_num && (!view_dims || !stride)) || (storage_dims_num && !storage_dims)) {
    set_msg("aclCreateTensor: bad dims");
    ++bad_calls;
    goto out;
  }
  t = calloc(1, sizeof *t);
  if (!t) goto out;
  t->magic = TENSOR_MAGIC;
  t->id = next_id++;
  t->ndims = view_dims_num;
  t->nstorage = storage_dims_num;
  for (uint64_t i = 0; i < view_dims_num; ++i) {
    t->dims[i] = view_dims[i];
    t->strides[i] = stride[i];
  }
  for (uint64_t i = 0; i < storage_dims_num; ++i) t->storage[i] = storage_dims[i];
  t->offset = offset;
  t->dtype = dtype;
  t->format = format;
  t->data = data;
  ++live_tensors;
  ++created;
  {
    char d[128], s[128], st[128];
    fmt_dims(d, sizeof d, t->dims, t->ndims);
    fmt_dims(s, sizeof s, t->strides, t->ndims);
    fmt_dims(st, sizeof st, t->storage, t->nstorage);
    logf_("{\"ev\":\"create\",\"id\":%lld,\"dims\":%s,\"strides\":%s,\"offset\":%lld,"
          "\"dtype\":%d,\"format\":%d,\"storage\":%s,\"data\":%llu,\"live\":%lld}",
          (long long)t->id, d, s, (long long)offset, dtype, format, st,
          (unsigned long long)(uintptr_t)data, (long long)live_tensors);
  }
out:
  pthread_mutex_unlock(&mu);
  return t;
}

EXPORT int32_t cd_destroy_tensor(const cd_tensor* tc) {
  pthread_mutex_lock(&mu);
  int32_t st = 0;
  cd_tensor* t = (cd_tensor*)tc;
  if (!t) {
    st = ST_NULLPTR;
  } else if (!tensor_ok(t)) {
    st = ST_INVALID;
    ++bad_calls;
  } else {
    logf_("{\"ev\":\"destroy\",\"id\":%lld,\"live\":%lld}", (long long)t->id,
          (long long)(live_tensors - 1));
    t->magic = 0;
    free(t);
    --live_tensors;
    ++destroyed;
  }
  pthread_mutex_unlock(&mu);
  return st;
}

static int32_t check_tensor(const cd_tensor* t, const char* name, int32_t want_dtype) {
  if (!t) {
    set_msg("%s is nullptr", name);
    return ST_NULLPTR;
  }
  if (!tensor_ok(t)) {
    set_msg("%s is not a live aclTensor", name);
    ++bad_calls;
    return ST_INVALID;
  }
  if (want_dtype >= 0 && t->dtype != want_dtype) {
    set_msg("%s has dtype %d, expected %d", name, t->dtype, want_dtype);
    return ST_INVALID;
  }
  if (t->ndims != 1 || t->dims[0] != 1 || t->strides[0] != 1 || t->offset != 0) {
    set_msg("%s must be a contiguous tensor of shape [1]", name);
    return ST_INVALID;
  }
  if (!(t->nstorage == 0 || (t->nstorage == 1 && t->storage[0] == 1))) {
    /* amp_update_scale_tiling.cpp:82-95: a storage shape other than [1] (0-d
     * counts as [1], :32-37) is a tiling error. */
    set_msg("%s: storage shape must be [1]", name);
    return ST_TILING;
  }
  if (t->format != ACL_FORMAT_ND) {
    set_msg("%s must have format ND", name);
    return ST_INVALID;
  }
  if (!t->data) {
    set_msg("%s has no data", name);
    return ST_NULLPTR;
  }
  return 0;
}

/* A live executor of `kind` (the caller holds mu), or NULL with *st set. */
static cd_executor* new_executor(int kind, int32_t dtype, int32_t* st) {
  cd_executor* e = calloc(1, sizeof *e);
  if (!e) {
    *st = 561001;
    return NULL;
  }
  e->magic = EXEC_MAGIC;
  e->id = next_id++;
  e->kind = kind;
  e->dtype = dtype;
  e->ws_size = ws_knob;
  ++live_execs;
  return e;
}

EXPORT cd_tensor_list* cd_create_tensor_list(cd_tensor* const* value, uint64_t size) {
  pthread_mutex_lock(&mu);
  cd_tensor_list* l = NULL;
  if (injected("aclCreateTensorList")) goto out;
  if (size > 0 && !value) {
    set_msg("aclCreateTensorList: value is nullptr");
    goto out;
  }
  for (uint64_t i = 0; i < size; ++i) {
    if (!tensor_ok(value[i])) {
      set_msg("aclCreateTensorList: element %llu is not a live aclTensor", (unsigned long long)i);
      ++bad_calls;
      goto out;
    }
  }
  l = calloc(1, sizeof *l);
  if (!l) goto out;
  l->tensors = calloc(size ? size : 1, sizeof *l->tensors);
  if (!l->tensors) {
    free(l);
    l = NULL;
    goto out;
  }
  l->magic = LIST_MAGIC;
  l->id = next_id++;
  l->size = size;
  for (uint64_t i = 0; i < size; ++i) l->tensors[i] = value[i];
  ++live_lists;
  ++lists_created;
  logf_("{\"ev\":\"create_list\",\"id\":%lld,\"size\":%llu,\"first\":%lld}", (long long)l->id,
        (unsigned long long)size, (long long)(size ? value[0]->id : 0));
out:
  pthread_mutex_unlock(&mu);
  return l;
}

/* Destroying a list destroys its tensors (CANN: aclDestroyTensorList). */
EXPORT int32_t cd_destroy_tensor_list(const cd_tensor_list* lc) {
  cd_tensor_list* l = (cd_tensor_list*)lc;
  pthread_mutex_lock(&mu);
  int32_t st = 0;
  if (!l) {
    st = ST_NULLPTR;
    pthread_mutex_unlock(&mu);
    return st;
  }
  if (l->magic != LIST_MAGIC) {
    ++bad_calls;
    pthread_mutex_unlock(&mu);
    return ST_INVALID;
  }
  logf_("{\"ev\":\"destroy_list\",\"id\":%lld,\"size\":%llu}", (long long)l->id,
        (unsigned long long)l->size);
  l->magic = 0;
  --live_lists;
  ++lists_destroyed;
  pthread_mutex_unlock(&mu);
  for (uint64_t i = 0; i < l->size; ++i) {
    if (cd_destroy_tensor(l->tensors[i]) != 0) st = ST_INVALID;
  }
  free(l->tensors);
  free(l);
  return st;
}

static int elements(const cd_tensor* t, int64_t* n) {
  int64_t c = 1;
  for (uint64_t i = 0; i < t->nstorage; ++i) c *= t->storage[i];
  *n = c;
  return 0;
}

EXPORT int32_t cd_foreach_get_workspace_size(const char* lib, const cd_tensor_list* l,
                                             const cd_tensor* found, const cd_tensor* inv,
                                             uint64_t* ws_size, cd_executor** executor) {
  pthread_mutex_lock(&mu);
  ++gws_calls;
  int32_t st = 0;
  cd_executor* e = NULL;
  if (!ws_size || !executor || !l || !found || !inv) {
    set_msg("scaledGrads, foundInf, invScale, workspaceSize or executor is nullptr");
    st = ST_NULLPTR;
    goto out;
  }
  *executor = NULL;
  if (l->magic != LIST_MAGIC) {
    set_msg("scaledGrads is not a live aclTensorList");
    ++bad_calls;
    st = ST_INVALID;
    goto out;
  }
  if ((st = refused_on_soc("aclnnForeachNonFiniteCheckAndUnscale", 0))) goto out;
  if ((st = check_tensor(found, "foundInf", ACL_FLOAT)) ||
      (st = check_tensor(inv, "invScale", ACL_FLOAT)))
    goto out;
  /* tiling.cpp:88-91: 1..256 tensors; :107-114 one dtype; :119-123 none empty */
  if (l->size == 0 || l->size > CD_MAX_LIST) {
    set_msg("scaledGrads has %llu tensors; must be in [1, %d]", (unsigned long long)l->size,
            CD_MAX_LIST);
    st = ST_TILING;
    goto out;
  }
  const int32_t dt = l->tensors[0]->dtype;
  for (uint64_t i = 0; i < l->size; ++i) {
    const cd_tensor* t = l->tensors[i];
    if (!tensor_ok(t)) {
      set_msg("scaledGrads[%llu] is not live", (unsigned long long)i);
      ++bad_calls;
      st = ST_INVALID;
      goto out;
    }
    if (t->dtype != ACL_FLOAT && t->dtype != ACL_FLOAT16 && t->dtype != ACL_BF16) {
      set_msg("scaledGrads[%llu] dtype %d is not FLOAT, FLOAT16 or BFLOAT16",
              (unsigned long long)i, t->dtype);
      st = ST_INVALID;
      goto out;
    }
    if (t->dtype != dt) {
      set_msg("The dtypes of all tensors in tensor list scaled_grads must be the same");
      st = ST_TILING;
      goto out;
    }
    int64_t n;
    elements(t, &n);
    if (n == 0) {
      set_msg("The shape size of scaled_grads must be greater than 0");
      st = ST_TILING;
      goto out;
    }
    if (t->ndims != 1 || t->dims[0] != n || t->strides[0] != 1 || t->offset != 0 ||
        t->format != ACL_FORMAT_ND || !t->data) {
      set_msg("scaledGrads[%llu] must be a contiguous ND tensor with data", (unsigned long long)i);
      st = ST_INVALID;
      goto out;
    }
  }
  if ((st = injected("aclnnForeachNonFiniteCheckAndUnscaleGetWorkspaceSize"))) goto out;
  if (!(e = new_executor(EXEC_FOREACH, dt, &st))) goto out;
  e->ntensors = l->size;
  for (uint64_t i = 0; i < l->size; ++i) {
    e->datas[i] = l->tensors[i]->data;
    elements(l->tensors[i], &e->counts[i]);
  }
  e->found = found->data;
  e->inv = inv->data;
  *ws_size = e->ws_size;
  *executor = e;
out:
  int64_t total = 0; /* elements in the list: a shard's, not the global array's */
  for (uint64_t i = 0; e && i < e->ntensors; ++i) total += e->counts[i];
  logf_("{\"ev\":\"foreach_gws\",\"lib\":\"%s\",\"list\":%lld,\"n\":%llu,\"dtype\":%d,"
        "\"elements\":%lld,\"status\":%d,\"exec\":%lld}",
        lib, (long long)(l && l->magic == LIST_MAGIC ? l->id : 0),
        (unsigned long long)(l && l->magic == LIST_MAGIC ? l->size : 0),
        l && l->magic == LIST_MAGIC && l->size ? l->tensors[0]->dtype : -1, (long long)total, st,
        (long long)(e ? e->id : 0));
  pthread_mutex_unlock(&mu);
  return st;
}

EXPORT int32_t cd_get_workspace_size(const char* lib, const cd_tensor* scale,
                                     const cd_tensor* tracker, const cd_tensor* found,
                                     double gf, double bf, int64_t gi,
                                     const cd_tensor* scale_out, const cd_tensor* tracker_out,
                                     uint64_t* ws_size, cd_executor** executor) {
  pthread_mutex_lock(&mu);
  ++gws_calls;
  int32_t st = 0;
  cd_executor* e = NULL;
  if (!ws_size || !executor) {
    set_msg("workspaceSize or executor is nullptr");
    st = ST_NULLPTR;
    goto out;
  }
  *executor = NULL;
  if ((st = refused_on_soc("aclnnAmpUpdateScale", 1))) goto out;
  if (!scale) {
    set_msg("currentScale is nullptr");
    st = ST_NULLPTR;
    goto out;
  }
  if ((st = check_tensor(scale, "currentScale", -1))) goto out;
  const int32_t dt = scale->dtype;
  if (dt != ACL_FLOAT && dt != ACL_FLOAT16 && dt != ACL_BF16) {
    set_msg("currentScale dtype %d is not FLOAT, FLOAT16 or BFLOAT16", dt);
    st = ST_INVALID;
    goto out;
  }
  if ((st = check_tensor(tracker, "growthTracker", ACL_INT32)) ||
      (st = check_tensor(found, "foundInf", dt)) ||
      (st = check_tensor(scale_out, "updatedScale", dt)) ||
      (st = check_tensor(tracker_out, "updatedGrowthTracker", ACL_INT32)))
    goto out;
  if (gi < 1 || gi > 2147483647) { /* amp_update_scale_tiling.cpp:75 */
    set_msg("growthInterval %lld must be in range [1, INT32_MAX]", (long long)gi);
    st = ST_TILING;
    goto out;
  }
  if ((st = injected("aclnnAmpUpdateScaleGetWorkspaceSize"))) goto out;
  if (!(e = new_executor(EXEC_UPDATE_SCALE, dt, &st))) goto out;
  e->scale = scale->data;
  e->tracker = tracker->data;
  e->found = found->data;
  e->scale_out = scale_out->data;
  e->tracker_out = tracker_out->data;
  e->gf = gf;
  e->bf = bf;
  e->gi = gi;
  *ws_size = e->ws_size;
  *executor = e;
out:
  logf_("{\"ev\":\"gws\",\"lib\":\"%s\",\"args\":[%lld,%lld,%lld,%lld,%lld],\"gf\":%.17g,"
        "\"bf\":%.17g,\"gi\":%lld,\"status\":%d,\"ws\":%llu,\"exec\":%lld}",
        lib, (long long)(tensor_ok(scale) ? scale->id : 0),
        (long long)(tensor_ok(tracker) ? tracker->id : 0),
        (long long)(tensor_ok(found) ? found->id : 0),
        (long long)(tensor_ok(scale_out) ? scale_out->id : 0),
        (long long)(tensor_ok(tracker_out) ? tracker_out->id : 0), gf, bf, (long long)gi, st,
        (unsigned long long)(e ? e->ws_size : 0), (long long)(e ? e->id : 0));
  pthread_mutex_unlock(&mu);
  return st;
}

static cd_alloc* find_alloc(const void* p) {
  for (size_t i = 0; i < nallocs; ++i) {
    const char* b = allocs[i].ptr;
    if ((const char*)p >= b && (const char*)p < b + allocs[i].size) return &allocs[i];
  }
  return NULL;
}

EXPORT int32_t cd_launch(const char* lib, void* ws, uint64_t ws_size, cd_executor* e,
                         void* stream) {
  pthread_mutex_lock(&mu);
  ++run_calls;
  int32_t st = 0;
  int64_t id = 0;
  if (!e) {
    set_msg("executor is nullptr (GetWorkspaceSize first)");
    st = ST_NULLPTR;
    goto out;
  }
  if (e->magic != EXEC_MAGIC) {
    set_msg("executor is not live");
    ++bad_calls;
    st = ST_INVALID;
    goto out;
  }
  id = e->id;
  if (ws_size != e->ws_size) {
    set_msg("workspaceSize %llu differs from GetWorkspaceSize's %llu",
            (unsigned long long)ws_size, (unsigned long long)e->ws_size);
    ++bad_calls;
    st = ST_INVALID;
    goto out;
  }
  if (ws_size > 0) {
    cd_alloc* a = find_alloc(ws);
    if (!a || (const char*)ws + ws_size > (const char*)a->ptr + a->size) {
      set_msg("workspace is not an aclrtMalloc block of %llu bytes", (unsigned long long)ws_size);
      ++bad_calls;
      st = ST_INVALID;
      goto out;
    }
    memset(ws, 0xA5, ws_size); /* the kernel uses all of it */
  }
  /* The executor is consumed by the launch, failed or not, as in CANN. */
  if (!(st = injected(e->kind == EXEC_FOREACH ? "aclnnForeachNonFiniteCheckAndUnscale"
                                               : "aclnnAmpUpdateScale"))) {
    /* The device kernel does not see the host's floating-point mode, but
     * this host code runs on XLA:CPU threads, which flush subnormals
     * (MXCSR FTZ/DAZ): compute in the default environment. */
    fenv_t saved;
    fegetenv(&saved);
    fesetenv(FE_DFL_ENV);
    if (e->kind == EXEC_FOREACH) {
      apply_foreach(e);
    } else {
      apply_rule(e);
    }
    fesetenv(&saved);
  }
  e->magic = 0;
  free(e);
  --live_execs;
out:
  logf_("{\"ev\":\"run\",\"lib\":\"%s\",\"exec\":%lld,\"ws_ptr\":%llu,\"ws\":%llu,"
        "\"stream\":%llu,\"status\":%d}",
        lib, (long long)id, (unsigned long long)(uintptr_t)ws, (unsigned long long)ws_size,
        (unsigned long long)(uintptr_t)stream, st);
  pthread_mutex_unlock(&mu);
  return st;
}

EXPORT int32_t cd_destroy_executor(cd_executor* e) {
  pthread_mutex_lock(&mu);
  int32_t st = 0;
  if (!e || e->magic != EXEC_MAGIC) {
    st = e ? ST_INVALID : ST_NULLPTR;
  } else {
    logf_("{\"ev\":\"destroy_exec\",\"exec\":%lld}", (long long)e->id);
    e->magic = 0;
    free(e);
    --live_execs;
  }
  pthread_mutex_unlock(&mu);
  return st;
}

/* The huge-memory bracket: logged; a bracket opened twice on a thread, or a
 * release/uninit without an open one, is a bad call. */
static __thread int huge_open;
EXPORT int cd_huge_mem(int what, void* arg, int sync) {
  static const char* const names[3] = {"huge_init", "huge_uninit", "huge_release"};
  pthread_mutex_lock(&mu);
  if (what < 0 || what > 2 || arg != NULL || sync) {
    ++bad_calls;
  } else if (what == 0) {
    if (huge_open) ++bad_calls;
    huge_open = 1;
  } else {
    if (!huge_open) ++bad_calls;
    if (what == 1) huge_open = 0;
  }
  if (what >= 0 && what <= 2) logf_("{\"ev\":\"%s\"}", names[what]);
  pthread_mutex_unlock(&mu);
  return 0;
}

EXPORT int cd_malloc(void** ptr, size_t size, int32_t policy) {
  pthread_mutex_lock(&mu);
  int st = injected("aclrtMalloc");
  if (!st) {
    if (!ptr || size == 0) {
      st = 107000;
    } else if (nallocs == capallocs &&
               !(allocs = realloc(allocs, (capallocs = capallocs ? capallocs * 2 : 16) *
                                              sizeof *allocs))) {
      st = 207001;
    } else {
      *ptr = malloc(size);
      if (!*ptr) {
        st = 207001;
      } else {
        allocs[nallocs++] = (cd_alloc){*ptr, size};
        ++total_allocs;
      }
    }
  }
  logf_("{\"ev\":\"malloc\",\"size\":%llu,\"policy\":%d,\"ptr\":%llu,\"status\":%d}",
        (unsigned long long)size, policy,
        (unsigned long long)(uintptr_t)(ptr && !st ? *ptr : NULL), st);
  pthread_mutex_unlock(&mu);
  return st;
}

EXPORT int cd_free(void* ptr) {
  pthread_mutex_lock(&mu);
  int st = 107000;
  for (size_t i = 0; i < nallocs; ++i) {
    if (allocs[i].ptr == ptr) {
      free(ptr);
      allocs[i] = allocs[--nallocs];
      ++total_frees;
      st = 0;
      break;
    }
  }
  logf_("{\"ev\":\"free\",\"ptr\":%llu,\"status\":%d}", (unsigned long long)(uintptr_t)ptr, st);
  pthread_mutex_unlock(&mu);
  return st;
}

EXPORT const char* cd_recent_err_msg(void) { return recent; }

/* ---- the runtime's device functions (acl/acl_rt.h) ---- */
EXPORT const char* cd_get_soc_name(void) { return soc_name(); }

EXPORT int cd_get_sat_mode(int32_t* mode) {
  if (!mode) return ACL_INVALID_PARAM;
  *mode = sat_mode();
  return 0;
}

EXPORT int cd_set_device(int32_t device) {
  if (device < 0 || device >= CD_MAX_DEVICES) return ACL_INVALID_PARAM;
  current_device = device;
  return 0;
}

/* aclrtGetOverflowStatus: the register of the current device into the first
 * four bytes of a 64-byte buffer (what the other bytes mean is not
 * documented: zero here).  Synchronous on host memory. */
EXPORT int cd_get_overflow_status(void* out, size_t size, void* stream) {
  pthread_mutex_lock(&mu);
  int st = injected("aclrtGetOverflowStatus");
  const int32_t d = current_device;
  if (!st && (!out || size != 64)) {
    set_msg("aclrtGetOverflowStatus: outputAddr must hold 64 bytes");
    ++bad_calls;
    st = ACL_INVALID_PARAM;
  }
  if (!st) {
    memset(out, 0, size);
    memcpy(out, &float_status[d], 4);
    ++flag_reads;
  }
  logf_("{\"ev\":\"flag_get\",\"device\":%d,\"value\":%u,\"stream\":%llu,\"status\":%d}", d,
        float_status[d], (unsigned long long)(uintptr_t)stream, st);
  pthread_mutex_unlock(&mu);
  return st;
}

EXPORT int cd_reset_overflow_status(void* stream) {
  pthread_mutex_lock(&mu);
  int st = injected("aclrtResetOverflowStatus");
  const int32_t d = current_device;
  if (!st) {
    float_status[d] = 0;
    ++flag_clears;
  }
  logf_("{\"ev\":\"flag_clear\",\"device\":%d,\"stream\":%llu,\"status\":%d}", d,
        (unsigned long long)(uintptr_t)stream, st);
  pthread_mutex_unlock(&mu);
  return st;
}

/* ---- controls for the tests ---- */
/* Sets `device`'s register (the current device's when device < 0), as a
 * kernel that overflowed in saturation mode does. */
EXPORT void cd_raise_float_status(int32_t device) {
  pthread_mutex_lock(&mu);
  const int32_t d = device < 0 ? current_device : device;
  if (d < CD_MAX_DEVICES) float_status[d] = 1;
  logf_("{\"ev\":\"flag_raise\",\"device\":%d}", d);
  pthread_mutex_unlock(&mu);
}
EXPORT uint32_t cd_float_status(int32_t device) {
  pthread_mutex_lock(&mu);
  const uint32_t v = device >= 0 && device < CD_MAX_DEVICES ? float_status[device] : 0;
  pthread_mutex_unlock(&mu);
  return v;
}
EXPORT void cd_reset(void) {
  pthread_mutex_lock(&mu);
  loglen = 0;
  if (logbuf) logbuf[0] = '\0';
  recent[0] = '\0';
  ws_knob = 0;
  failure.status = 0;
  failure.api[0] = failure.msg[0] = '\0';
  logging = 1;
  memset(float_status, 0, sizeof float_status);
  flag_clears = flag_reads = 0;
  pthread_mutex_unlock(&mu);
}
EXPORT void cd_set_logging(int on) {
  pthread_mutex_lock(&mu);
  logging = on;
  pthread_mutex_unlock(&mu);
}
EXPORT void cd_set_workspace_size(uint64_t size) {
  pthread_mutex_lock(&mu);
  ws_knob = size;
  pthread_mutex_unlock(&mu);
}
/* Makes every call of `api` fail with `status` and `msg` (status 0 clears). */
EXPORT void cd_set_failure(const char* api, int32_t status, const char* msg) {
  pthread_mutex_lock(&mu);
  snprintf(failure.api, sizeof failure.api, "%s", api ? api : "");
  snprintf(failure.msg, sizeof failure.msg, "%s", msg ? msg : "");
  failure.status = status;
  pthread_mutex_unlock(&mu);
}
/* Copies the JSON-lines log into buf (truncated to n-1); returns its length. */
EXPORT size_t cd_log(char* buf, size_t n) {
  pthread_mutex_lock(&mu);
  size_t len = loglen;
  if (buf && n) {
    size_t k = len < n - 1 ? len : n - 1;
    if (k) memcpy(buf, logbuf, k);
    buf[k] = '\0';
  }
  pthread_mutex_unlock(&mu);
  return len;
}
/* live_tensors, created, destroyed, live_execs, gws_calls, run_calls,
 * live_allocs, total_allocs, total_frees, bad_calls, live_lists,
 * lists_created, lists_destroyed, flag_clears, flag_reads */
EXPORT void cd_stats(int64_t* out) {
  pthread_mutex_lock(&mu);
  int64_t v[15] = {live_tensors, created,      destroyed,   live_execs, gws_calls,
                   run_calls,    (int64_t)nallocs, total_allocs, total_frees, bad_calls,
                   live_lists,   lists_created, lists_destroyed, flag_clears, flag_reads};
  memcpy(out, v, sizeof v);
  pthread_mutex_unlock(&mu);
}
