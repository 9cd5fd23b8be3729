// XLA FFI handlers for NVIDIA cuDSS: diffsoup's sparse direct solver on GPUs.
//
// Four targets, all side-effecting, none CUDA-graph compatible (they keep host state and may
// synchronize the stream to read cuDSS's error indicator):
//
//   diffsoup_cudss_analyze_factor  (indptr, indices, values[L,nnz], after) -> info[L]
//       symbolic analysis (once per registry key) and a numerical factorization
//   diffsoup_cudss_refactor        (indptr, indices, values[L,nnz], after) -> info[L]
//       numerical refactorization on the analysis kept for the key
//   diffsoup_cudss_solve           (info[L], indptr, indices, values[L,nnz], b[L,k,n]) -> x[L,k,n]
//   diffsoup_cudss_solve_transpose (info[L], indptr, indices, values[L,nnz], b[L,k,n],
//                                   indptr_t, indices_t, perm_t) -> x[L,k,n]
//
// State: a process-global, mutex-protected registry of cuDSS objects keyed by (device ordinal,
// pattern hash, dtype, uniform-batch size L, slot, reordering, hybrid-memory settings, n, nnz).
// The analysis runs once per key; every call points cuDSS at the current XLA buffers
// (cudssMatrixSetCsrPointers / cudssMatrixSetValues), since cuDSS keeps raw pointers and XLA
// reuses its buffers. L > 1 is a cuDSS uniform batch (CUDSS_CONFIG_UBATCH_SIZE): values are
// L contiguous value arrays on one CSR pattern; right-hand sides are L contiguous n x k
// column-major blocks.
//
// Failures never become FFI errors (those abort the whole program): a factorization writes a
// per-system info code (0: success; > 0: cuDSS's CUDSS_DATA_INFO; kPerturbedPivots: cuDSS had to
// perturb a (numerically zero) pivot, i.e. the matrix is singular; < 0: a cuDSS or CUDA API call
// failed), and a solve that cannot run fills its output with NaN. Python turns both into a
// failed SolveInfo.
//
// Transposed solves use cuDSS 1.0's CUDSS_CONFIG_SOLVE_MODE = CUDSS_SOLVE_MODE_TRANSPOSE. The
// first few results are checked on the host against the matrix (r = A^T x - b); if the native
// transposed solve is refused or wrong for a configuration, that state switches to a second
// cuDSS object that factors A^T (values gathered through perm_t, once per factorization).
// DIFFSOUP_CUDSS_TRANSPOSE=native|refactor|auto (default auto) forces either path;
// DIFFSOUP_CUDSS_PIVOT_FAIL=0 stops counting perturbed pivots as failures;
// DIFFSOUP_CUDSS_DETERMINISTIC=0 drops CUDSS_CONFIG_DETERMINISTIC_MODE (on by default: the
// checkpointed adjoint needs replays that retrace the forward pass); DIFFSOUP_CUDSS_VERBOSE=1
// reports failed cuDSS calls and the transposed-solve checks on stderr.

#include <cuda_runtime.h>
#include <cudss.h>
#include <library_types.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// ------------------------------------------------------------------------------------------
// Codes and counters
// ------------------------------------------------------------------------------------------

constexpr int32_t kPerturbedPivots = 1 << 30;  // cuDSS replaced (numerically) zero pivots
constexpr int32_t kCudssApiError = -1000;      // -1000 - cudssStatus_t
constexpr int32_t kBadDtype = -3001;

enum Counter {
  kStates = 0,
  kAnalyses,
  kFactorizations,
  kRefactorizations,
  kSolves,
  kTransposeNative,
  kTransposeFallback,
  kFailedCalls,
  kInfoSyncs,
  kDeterminismOff,
  kNumCounters
};
std::atomic<int64_t> g_counters[kNumCounters];

void Count(Counter c, int64_t by = 1) { g_counters[c].fetch_add(by, std::memory_order_relaxed); }

int TransposePreference() {  // 0 auto, 1 native, 2 refactor
  static const int pref = [] {
    const char* v = std::getenv("DIFFSOUP_CUDSS_TRANSPOSE");
    if (v == nullptr) return 0;
    if (std::strcmp(v, "native") == 0) return 1;
    if (std::strcmp(v, "refactor") == 0) return 2;
    return 0;
  }();
  return pref;
}

bool PerturbedPivotsFail() {  // DIFFSOUP_CUDSS_PIVOT_FAIL=0: ignore CUDSS_DATA_NPIVOTS
  static const bool v = [] {
    const char* e = std::getenv("DIFFSOUP_CUDSS_PIVOT_FAIL");
    return e == nullptr || e[0] != '0';
  }();
  return v;
}

bool DeterministicDefault() {  // DIFFSOUP_CUDSS_DETERMINISTIC=0: cuDSS's faster, unordered mode
  static const bool v = [] {
    const char* e = std::getenv("DIFFSOUP_CUDSS_DETERMINISTIC");
    return e == nullptr || e[0] != '0';
  }();
  return v;
}

bool Verbose() {
  static const bool v = [] {
    const char* e = std::getenv("DIFFSOUP_CUDSS_VERBOSE");
    return e != nullptr && e[0] != '\0' && e[0] != '0';
  }();
  return v;
}

// ------------------------------------------------------------------------------------------
// Registry key
// ------------------------------------------------------------------------------------------

struct Key {
  int32_t device;
  int64_t pattern;
  int32_t dtype;  // 1: float32, 2: float64
  int64_t batch;
  int32_t slot;
  int32_t reorder;  // 0: cuDSS default, 1: nested dissection (METIS)
  int32_t hybrid;
  int64_t hybrid_limit_mb;
  int64_t n;
  int64_t nnz;

  bool operator==(const Key& o) const {
    return device == o.device && pattern == o.pattern && dtype == o.dtype && batch == o.batch &&
           slot == o.slot && reorder == o.reorder && hybrid == o.hybrid &&
           hybrid_limit_mb == o.hybrid_limit_mb && n == o.n && nnz == o.nnz;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) {
      h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    };
    mix(static_cast<uint64_t>(k.device));
    mix(static_cast<uint64_t>(k.pattern));
    mix(static_cast<uint64_t>(k.dtype));
    mix(static_cast<uint64_t>(k.batch));
    mix(static_cast<uint64_t>(k.slot));
    mix(static_cast<uint64_t>(k.reorder));
    mix(static_cast<uint64_t>(k.hybrid));
    mix(static_cast<uint64_t>(k.hybrid_limit_mb));
    mix(static_cast<uint64_t>(k.n));
    mix(static_cast<uint64_t>(k.nnz));
    return static_cast<size_t>(h);
  }
};

// ------------------------------------------------------------------------------------------
// One cuDSS system: handle, config, data and matrix descriptors
// ------------------------------------------------------------------------------------------

struct Solver {
  cudssHandle_t handle = nullptr;
  cudssConfig_t config = nullptr;
  cudssData_t data = nullptr;
  cudssMatrix_t A = nullptr;
  cudssMatrix_t X = nullptr;
  cudssMatrix_t B = nullptr;
  int64_t n = 0, nnz = 0, batch = 1, nrhs = 0;
  cudaDataType_t vtype = CUDA_R_64F;
  bool analyzed = false;
  bool factored = false;
  bool info_dirty = false;
  bool deterministic = false;
  bool columns_only = false;  // several right-hand sides are solved one by one
  int solve_mode = 0;

  Solver() = default;
  Solver(const Solver&) = delete;
  Solver& operator=(const Solver&) = delete;

  ~Solver() {
    if (A != nullptr) cudssMatrixDestroy(A);
    if (X != nullptr) cudssMatrixDestroy(X);
    if (B != nullptr) cudssMatrixDestroy(B);
    if (data != nullptr && handle != nullptr) cudssDataDestroy(handle, data);
    if (config != nullptr) cudssConfigDestroy(config);
    if (handle != nullptr) cudssDestroy(handle);
  }

  cudssStatus_t Init(const Key& k) {
    n = k.n;
    nnz = k.nnz;
    batch = k.batch;
    vtype = k.dtype == 1 ? CUDA_R_32F : CUDA_R_64F;
    cudssStatus_t s = cudssCreate(&handle);
    if (s != CUDSS_STATUS_SUCCESS) return s;
    if ((s = cudssConfigCreate(&config)) != CUDSS_STATUS_SUCCESS) return s;
    if ((s = cudssDataCreate(handle, &data)) != CUDSS_STATUS_SUCCESS) return s;
    cudssReorderingAlg_t alg =
        k.reorder == 1 ? CUDSS_REORDERING_ALG_NESTED_DISSECTION : CUDSS_REORDERING_ALG_DEFAULT;
    if ((s = cudssConfigSet(config, CUDSS_CONFIG_REORDERING_ALG, &alg, sizeof(alg))) !=
        CUDSS_STATUS_SUCCESS)
      return s;
    // No matching/scaling: the analysis runs on placeholder values (the identity), and the
    // integrator's W = I/(h gamma) - J always holds its diagonal.
    cudssMatchingAlg_t matching = CUDSS_MATCHING_ALG_NONE;
    (void)cudssConfigSet(config, CUDSS_CONFIG_MATCHING_ALG, &matching, sizeof(matching));
    // Perturb only pivots that are zero to working precision; a perturbation then means a
    // singular matrix and is reported as a failure (CUDSS_DATA_NPIVOTS > 0).
    double eps = vtype == CUDA_R_32F ? 1e-30 : 1e-280;
    if (cudssConfigSet(config, CUDSS_CONFIG_PIVOT_EPSILON, &eps, sizeof(eps)) !=
        CUDSS_STATUS_SUCCESS) {
      float epsf = 1e-30f;
      (void)cudssConfigSet(config, CUDSS_CONFIG_PIVOT_EPSILON, &epsf, sizeof(epsf));
    }
    // Bitwise-reproducible factorizations and solves: the checkpointed adjoint replays forward
    // steps and checks that they retrace the forward pass exactly.
    if (DeterministicDefault()) {
      int one = 1;
      deterministic = cudssConfigSet(config, CUDSS_CONFIG_DETERMINISTIC_MODE, &one, sizeof(one)) ==
                      CUDSS_STATUS_SUCCESS;
    }
    if (batch > 1) {
      int ub = static_cast<int>(batch);
      if ((s = cudssConfigSet(config, CUDSS_CONFIG_UBATCH_SIZE, &ub, sizeof(ub))) !=
          CUDSS_STATUS_SUCCESS)
        return s;
    }
    if (k.hybrid != 0) {
      int one = 1;
      if ((s = cudssConfigSet(config, CUDSS_CONFIG_HYBRID_MEMORY_MODE, &one, sizeof(one))) !=
          CUDSS_STATUS_SUCCESS)
        return s;
      if (k.hybrid_limit_mb > 0) {
        int64_t bytes = k.hybrid_limit_mb * int64_t{1024} * int64_t{1024};
        if ((s = cudssConfigSet(config, CUDSS_CONFIG_HYBRID_DEVICE_MEMORY_LIMIT, &bytes,
                                sizeof(bytes))) != CUDSS_STATUS_SUCCESS)
          return s;
      }
    }
    return CUDSS_STATUS_SUCCESS;
  }

  cudssStatus_t BindA(void* indptr, void* indices, void* values) {
    if (A == nullptr) {
      return cudssMatrixCreateCsr(&A, n, n, nnz, indptr, nullptr, indices, values, CUDA_R_32I,
                                  CUDA_R_32I, vtype, CUDSS_MTYPE_GENERAL, CUDSS_MVIEW_FULL,
                                  CUDSS_BASE_ZERO);
    }
    return cudssMatrixSetCsrPointers(A, indptr, nullptr, indices, values);
  }

  cudssStatus_t BindXB(int64_t k, void* x, void* b) {
    cudssStatus_t s;
    if (X == nullptr || B == nullptr || k != nrhs) {
      if (X != nullptr) cudssMatrixDestroy(X);
      if (B != nullptr) cudssMatrixDestroy(B);
      X = B = nullptr;
      nrhs = 0;
      if ((s = cudssMatrixCreateDn(&X, n, k, n, x, vtype, CUDSS_LAYOUT_COL_MAJOR)) !=
          CUDSS_STATUS_SUCCESS)
        return s;
      if ((s = cudssMatrixCreateDn(&B, n, k, n, b, vtype, CUDSS_LAYOUT_COL_MAJOR)) !=
          CUDSS_STATUS_SUCCESS)
        return s;
      nrhs = k;
      return CUDSS_STATUS_SUCCESS;
    }
    if ((s = cudssMatrixSetValues(X, x)) != CUDSS_STATUS_SUCCESS) return s;
    return cudssMatrixSetValues(B, b);
  }

  // Reads an integer data parameter that is one value or one per batch member.
  bool ReadPerSystem(cudssDataParam_t param, std::vector<int>* out) {
    out->assign(static_cast<size_t>(batch), 0);
    size_t need = 0;
    std::vector<int> buf;
    if (cudssDataGet(handle, data, param, nullptr, 0, &need) == CUDSS_STATUS_SUCCESS &&
        need >= sizeof(int)) {
      buf.assign(need / sizeof(int), 0);
    } else {
      buf.assign(1, 0);
    }
    size_t written = 0;
    if (cudssDataGet(handle, data, param, buf.data(), buf.size() * sizeof(int), &written) !=
        CUDSS_STATUS_SUCCESS)
      return false;
    size_t got = std::max<size_t>(1, written / sizeof(int));
    if (got >= static_cast<size_t>(batch)) {
      std::copy(buf.begin(), buf.begin() + batch, out->begin());
    } else {
      // One aggregate value for the whole batch: a failure marks every member.
      int v = 0;
      for (size_t i = 0; i < got && i < buf.size(); ++i) v = v != 0 ? v : buf[i];
      std::fill(out->begin(), out->end(), v);
    }
    return true;
  }

  void ResetInfo() {
    size_t need = 0;
    if (cudssDataGet(handle, data, CUDSS_DATA_INFO, nullptr, 0, &need) != CUDSS_STATUS_SUCCESS ||
        need < sizeof(int))
      need = sizeof(int);
    std::vector<int> zeros(need / sizeof(int), 0);
    if (cudssDataSet(handle, data, CUDSS_DATA_INFO, zeros.data(), need) != CUDSS_STATUS_SUCCESS)
      (void)cudssDataSet(handle, data, CUDSS_DATA_INFO, zeros.data(), sizeof(int));
  }

  // Where a configuration refuses the deterministic mode, drop it (fresh data object).
  cudssStatus_t DisableDeterminism(cudssStatus_t why) {
    if (Verbose())
      std::fprintf(stderr, "diffsoup cuDSS: deterministic mode refused (status %d); turned off\n",
                   static_cast<int>(why));
    Count(kDeterminismOff);
    deterministic = false;
    int zero = 0;
    (void)cudssConfigSet(config, CUDSS_CONFIG_DETERMINISTIC_MODE, &zero, sizeof(zero));
    if (data != nullptr) cudssDataDestroy(handle, data);
    data = nullptr;
    analyzed = factored = info_dirty = false;
    return cudssDataCreate(handle, &data);
  }

  // Numerical (re)factorization; the analysis first if this object has none. Writes one code
  // per batch member into info (host memory) and returns the cuDSS status of the API calls.
  cudssStatus_t Factor(cudaStream_t stream, void* indptr, void* indices, void* values,
                       bool refactor, bool check, int32_t* info) {
    cudssStatus_t s;
    if ((s = cudssSetStream(handle, stream)) != CUDSS_STATUS_SUCCESS) return s;
    if ((s = BindA(indptr, indices, values)) != CUDSS_STATUS_SUCCESS) return s;
    if (X == nullptr && (s = BindXB(1, values, values)) != CUDSS_STATUS_SUCCESS) return s;
    if (info_dirty) {
      ResetInfo();
      info_dirty = false;
    }
    bool fresh = false;
    if (!analyzed) {
      s = cudssExecute(handle, CUDSS_PHASE_ANALYSIS, config, data, A, X, B);
      if (s != CUDSS_STATUS_SUCCESS && deterministic) {
        if (DisableDeterminism(s) != CUDSS_STATUS_SUCCESS) return s;
        s = cudssExecute(handle, CUDSS_PHASE_ANALYSIS, config, data, A, X, B);
      }
      if (s != CUDSS_STATUS_SUCCESS) return s;
      analyzed = true;
      factored = false;
      fresh = true;
      Count(kAnalyses);
    }
    const bool re = refactor && factored;
    factored = false;
    s = cudssExecute(handle, re ? CUDSS_PHASE_REFACTORIZATION : CUDSS_PHASE_FACTORIZATION, config,
                     data, A, X, B);
    if (s != CUDSS_STATUS_SUCCESS && deterministic && fresh) {
      if (DisableDeterminism(s) != CUDSS_STATUS_SUCCESS) return s;
      if ((s = cudssExecute(handle, CUDSS_PHASE_ANALYSIS, config, data, A, X, B)) !=
          CUDSS_STATUS_SUCCESS)
        return s;
      analyzed = true;
      s = cudssExecute(handle, CUDSS_PHASE_FACTORIZATION, config, data, A, X, B);
    }
    if (s != CUDSS_STATUS_SUCCESS) return s;
    factored = true;
    Count(re ? kRefactorizations : kFactorizations);
    std::fill(info, info + batch, 0);
    if (check) {
      // cudssDataGet of these device-side indicators synchronizes the stream.
      Count(kInfoSyncs);
      std::vector<int> codes, npiv;
      if (ReadPerSystem(CUDSS_DATA_INFO, &codes)) {
        for (int64_t i = 0; i < batch; ++i) info[i] = codes[i];
      }
      if (PerturbedPivotsFail() && ReadPerSystem(CUDSS_DATA_NPIVOTS, &npiv)) {
        for (int64_t i = 0; i < batch; ++i)
          if (info[i] == 0 && npiv[i] > 0) info[i] = kPerturbedPivots;
      }
      for (int64_t i = 0; i < batch; ++i)
        if (info[i] != 0) info_dirty = true;
    }
    return CUDSS_STATUS_SUCCESS;
  }

  cudssStatus_t Solve(cudaStream_t stream, void* indptr, void* indices, void* values, void* b,
                      void* x, int64_t k, int mode) {
    cudssStatus_t s;
    if ((s = cudssSetStream(handle, stream)) != CUDSS_STATUS_SUCCESS) return s;
    if ((s = BindA(indptr, indices, values)) != CUDSS_STATUS_SUCCESS) return s;
    if (mode != solve_mode) {
      int m = mode;
      if ((s = cudssConfigSet(config, CUDSS_CONFIG_SOLVE_MODE, &m, sizeof(m))) !=
          CUDSS_STATUS_SUCCESS)
        return s;
      solve_mode = mode;
    }
    if (!(k > 1 && columns_only)) {
      if ((s = BindXB(k, x, b)) != CUDSS_STATUS_SUCCESS) return s;
      s = cudssExecute(handle, CUDSS_PHASE_SOLVE, config, data, A, X, B);
      // cuDSS 1.0 refuses several right-hand sides at once in its deterministic mode (seen on an
      // H200: CUDSS_STATUS_NOT_SUPPORTED): solve them one column at a time from then on.
      if (!(s == CUDSS_STATUS_NOT_SUPPORTED && k > 1 && batch == 1 && deterministic)) return s;
      columns_only = true;
      if (Verbose())
        std::fprintf(stderr, "diffsoup cuDSS: %lld right-hand sides refused at once; solving by column\n",
                     static_cast<long long>(k));
    }
    if (batch != 1) return CUDSS_STATUS_NOT_SUPPORTED;
    const size_t step = static_cast<size_t>(n) * (vtype == CUDA_R_32F ? 4 : 8);
    for (int64_t j = 0; j < k; ++j) {
      if ((s = BindXB(1, static_cast<char*>(x) + j * step, static_cast<char*>(b) + j * step)) !=
          CUDSS_STATUS_SUCCESS)
        return s;
      if ((s = cudssExecute(handle, CUDSS_PHASE_SOLVE, config, data, A, X, B)) !=
          CUDSS_STATUS_SUCCESS)
        return s;
    }
    return CUDSS_STATUS_SUCCESS;
  }
};

// ------------------------------------------------------------------------------------------
// Registry
// ------------------------------------------------------------------------------------------

enum TransposeMode { kTransposeUnknown, kTransposeNativeOk, kTransposeFallbackOnly };

struct State {
  std::mutex mu;
  Key key{};
  Solver main;
  uint64_t epoch = 0;  // bumped by every factorization
  TransposeMode tmode = kTransposeUnknown;
  int checks = 0;
  std::unique_ptr<Solver> trans;  // factors A^T when native transposed solves are unavailable
  uint64_t trans_epoch = ~uint64_t{0};
  void* trans_values = nullptr;
  size_t trans_bytes = 0;

  ~State() {
    if (trans_values != nullptr) cudaFree(trans_values);
  }
};

std::mutex& RegistryMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}

std::unordered_map<Key, std::shared_ptr<State>, KeyHash>& Registry() {
  static auto* map = new std::unordered_map<Key, std::shared_ptr<State>, KeyHash>();
  return *map;
}

void EnsureDevice(int32_t device) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device) cudaSetDevice(device);
}

std::shared_ptr<State> FindState(const Key& key) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto it = Registry().find(key);
  return it == Registry().end() ? nullptr : it->second;
}

std::shared_ptr<State> GetOrCreateState(const Key& key, cudssStatus_t* status) {
  *status = CUDSS_STATUS_SUCCESS;
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto it = Registry().find(key);
  if (it != Registry().end()) return it->second;
  auto st = std::make_shared<State>();
  st->key = key;
  *status = st->main.Init(key);
  if (*status != CUDSS_STATUS_SUCCESS) return nullptr;
  Registry().emplace(key, st);
  Count(kStates);
  return st;
}

int32_t DtypeCode(ffi::DataType t) {
  if (t == ffi::DataType::F32) return 1;
  if (t == ffi::DataType::F64) return 2;
  return 0;
}

size_t DtypeBytes(int32_t code) { return code == 1 ? 4 : 8; }

ffi::Error ShapeError(const char* what) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, std::string("diffsoup cuDSS: ") + what);
}

void FillNaN(void* x, size_t bytes, cudaStream_t stream) {
  // All-ones bit patterns are NaN in float32 and float64.
  cudaMemsetAsync(x, 0xFF, bytes, stream);
}

void WriteInfo(int32_t* device_info, const std::vector<int32_t>& host, cudaStream_t stream) {
  bool any = false;
  for (int32_t v : host) any = any || v != 0;
  if (!any) {
    cudaMemsetAsync(device_info, 0, host.size() * sizeof(int32_t), stream);
  } else {
    // Pageable source: the call returns once the bytes are staged, so `host` may go away.
    cudaMemcpyAsync(device_info, host.data(), host.size() * sizeof(int32_t),
                    cudaMemcpyHostToDevice, stream);
  }
}

// ------------------------------------------------------------------------------------------
// Kernels (the fallback transposed path only)
// ------------------------------------------------------------------------------------------

template <typename T>
__global__ void GatherKernel(int64_t batch, int64_t nnz, const int32_t* __restrict__ perm,
                             const T* __restrict__ src, T* __restrict__ dst) {
  int64_t total = batch * nnz;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{blockDim.x} * gridDim.x) {
    int64_t b = i / nnz;
    int64_t j = i - b * nnz;
    dst[i] = src[b * nnz + perm[j]];
  }
}

cudaError_t Gather(int32_t dtype, int64_t batch, int64_t nnz, const int32_t* perm,
                   const void* src, void* dst, cudaStream_t stream) {
  int64_t total = batch * nnz;
  int threads = 256;
  int64_t blocks64 = std::min<int64_t>((total + threads - 1) / threads, 65535);
  int blocks = static_cast<int>(std::max<int64_t>(blocks64, 1));
  if (dtype == 1) {
    GatherKernel<float><<<blocks, threads, 0, stream>>>(batch, nnz, perm,
                                                       static_cast<const float*>(src),
                                                       static_cast<float*>(dst));
  } else {
    GatherKernel<double><<<blocks, threads, 0, stream>>>(batch, nnz, perm,
                                                        static_cast<const double*>(src),
                                                        static_cast<double*>(dst));
  }
  return cudaGetLastError();
}

// Host check of a transposed solve on the first system and right-hand side:
// +1 verified transposed, -1 wrong (the untransposed solution, or garbage), 0 inconclusive.
int VerifyTransposed(cudaStream_t stream, int32_t dtype, int64_t n, int64_t nnz,
                     const void* indptr, const void* indices, const void* values,
                     const void* b, const void* x) {
  std::vector<int32_t> p(n + 1), j(nnz);
  std::vector<double> a(nnz), xv(n), bv(n);
  size_t e = DtypeBytes(dtype);
  std::vector<unsigned char> ra(nnz * e), rx(n * e), rb(n * e);
  if (cudaMemcpyAsync(p.data(), indptr, (n + 1) * 4, cudaMemcpyDeviceToHost, stream) !=
          cudaSuccess ||
      cudaMemcpyAsync(j.data(), indices, nnz * 4, cudaMemcpyDeviceToHost, stream) !=
          cudaSuccess ||
      cudaMemcpyAsync(ra.data(), values, nnz * e, cudaMemcpyDeviceToHost, stream) !=
          cudaSuccess ||
      cudaMemcpyAsync(rx.data(), x, n * e, cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
      cudaMemcpyAsync(rb.data(), b, n * e, cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess)
    return 0;
  auto load = [&](const std::vector<unsigned char>& raw, std::vector<double>* out) {
    for (size_t i = 0; i < out->size(); ++i) {
      if (dtype == 1) {
        float f;
        std::memcpy(&f, raw.data() + i * 4, 4);
        (*out)[i] = f;
      } else {
        std::memcpy(&(*out)[i], raw.data() + i * 8, 8);
      }
    }
  };
  load(ra, &a);
  load(rx, &xv);
  load(rb, &bv);
  std::vector<double> yn(n, 0.0), yt(n, 0.0);
  double anorm = 0.0, xnorm = 0.0, bnorm = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    double row = 0.0, acc = 0.0;
    for (int32_t q = p[r]; q < p[r + 1]; ++q) {
      acc += a[q] * xv[j[q]];
      yt[j[q]] += a[q] * xv[r];
      row += std::fabs(a[q]);
    }
    yn[r] = acc;
    anorm = std::max(anorm, row);
    xnorm = std::max(xnorm, std::fabs(xv[r]));
    bnorm = std::max(bnorm, std::fabs(bv[r]));
  }
  double scale = anorm * xnorm + bnorm;
  if (!(scale > 0.0) || !std::isfinite(scale)) return 0;
  double rt = 0.0, rn = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    rt = std::max(rt, std::fabs(yt[r] - bv[r]));
    rn = std::max(rn, std::fabs(yn[r] - bv[r]));
  }
  rt /= scale;
  rn /= scale;
  const double tol = dtype == 1 ? 1e-4 : 1e-10;
  if (Verbose())
    std::fprintf(stderr, "diffsoup cuDSS: transposed-solve check r(A^T)=%.3e r(A)=%.3e\n", rt, rn);
  if (!std::isfinite(rt)) return 0;
  if (rt <= tol && rn > 1e3 * tol) return 1;
  if (rt > 1e3 * tol) return -1;
  return 0;
}

// ------------------------------------------------------------------------------------------
// Handlers
// ------------------------------------------------------------------------------------------

struct Attrs {
  int64_t pattern;
  int32_t slot;
  int32_t reorder;
  int32_t hybrid;
  int64_t hybrid_limit_mb;
  bool check;
};

ffi::Error FactorCommon(bool first, cudaStream_t stream, int32_t device,
                        ffi::Buffer<ffi::S32, 1> indptr, ffi::Buffer<ffi::S32, 1> indices,
                        ffi::AnyBuffer values, ffi::Result<ffi::Buffer<ffi::S32, 1>> info,
                        const Attrs& at) {
  auto vd = values.dimensions();
  if (vd.size() != 2) return ShapeError("values must be (L, nnz)");
  const int64_t batch = vd[0], nnz = vd[1];
  const int64_t n = indptr.dimensions()[0] - 1;
  if (n <= 0 || indices.dimensions()[0] != nnz || info->dimensions()[0] != batch)
    return ShapeError("inconsistent indptr / indices / values / info shapes");
  std::vector<int32_t> host(static_cast<size_t>(batch), 0);
  const int32_t dtype = DtypeCode(values.element_type());
  if (batch == 0) return ffi::Error::Success();
  if (dtype == 0) {
    std::fill(host.begin(), host.end(), kBadDtype);
    WriteInfo(info->typed_data(), host, stream);
    return ffi::Error::Success();
  }
  EnsureDevice(device);
  Key key{device, at.pattern, dtype, batch, at.slot, at.reorder, at.hybrid, at.hybrid_limit_mb,
          n, nnz};
  cudssStatus_t status;
  auto st = GetOrCreateState(key, &status);
  if (st == nullptr) {
    Count(kFailedCalls);
    std::fill(host.begin(), host.end(), kCudssApiError - static_cast<int32_t>(status));
  } else {
    std::lock_guard<std::mutex> lock(st->mu);
    status = st->main.Factor(stream, indptr.typed_data(), indices.typed_data(),
                             values.untyped_data(), /*refactor=*/!first, at.check, host.data());
    st->epoch++;
    if (status != CUDSS_STATUS_SUCCESS) {
      Count(kFailedCalls);
      if (Verbose())
        std::fprintf(stderr, "diffsoup cuDSS: factorization failed with cuDSS status %d\n",
                     static_cast<int>(status));
      std::fill(host.begin(), host.end(), kCudssApiError - static_cast<int32_t>(status));
    }
  }
  WriteInfo(info->typed_data(), host, stream);
  return ffi::Error::Success();
}

ffi::Error AnalyzeFactorImpl(cudaStream_t stream, int32_t device, ffi::Buffer<ffi::S32, 1> indptr,
                             ffi::Buffer<ffi::S32, 1> indices, ffi::AnyBuffer values,
                             ffi::AnyBuffer /*after*/, ffi::Result<ffi::Buffer<ffi::S32, 1>> info,
                             int64_t pattern, int32_t slot, int32_t reorder, int32_t hybrid,
                             int64_t hybrid_limit_mb, bool check) {
  return FactorCommon(true, stream, device, indptr, indices, values, info,
                      Attrs{pattern, slot, reorder, hybrid, hybrid_limit_mb, check});
}

ffi::Error RefactorImpl(cudaStream_t stream, int32_t device, ffi::Buffer<ffi::S32, 1> indptr,
                        ffi::Buffer<ffi::S32, 1> indices, ffi::AnyBuffer values,
                        ffi::AnyBuffer /*after*/, ffi::Result<ffi::Buffer<ffi::S32, 1>> info,
                        int64_t pattern, int32_t slot, int32_t reorder, int32_t hybrid,
                        int64_t hybrid_limit_mb, bool check) {
  return FactorCommon(false, stream, device, indptr, indices, values, info,
                      Attrs{pattern, slot, reorder, hybrid, hybrid_limit_mb, check});
}

cudssStatus_t SolveTransposedFallback(State* st, cudaStream_t stream, int32_t dtype,
                                      void* indptr_t, void* indices_t, const int32_t* perm,
                                      void* values, void* b, void* x, int64_t k) {
  Solver& m = st->main;
  cudssStatus_t s;
  if (st->trans == nullptr) {
    auto t = std::make_unique<Solver>();
    if ((s = t->Init(st->key)) != CUDSS_STATUS_SUCCESS) return s;
    st->trans = std::move(t);
    st->trans_epoch = ~uint64_t{0};
  }
  if (st->trans_epoch != st->epoch) {
    size_t bytes = static_cast<size_t>(m.batch * m.nnz) * DtypeBytes(dtype);
    if (st->trans_bytes != bytes) {
      if (st->trans_values != nullptr) cudaFree(st->trans_values);
      st->trans_values = nullptr;
      st->trans_bytes = 0;
      if (cudaMalloc(&st->trans_values, bytes) != cudaSuccess) return CUDSS_STATUS_ALLOC_FAILED;
      st->trans_bytes = bytes;
    }
    if (Gather(dtype, m.batch, m.nnz, perm, values, st->trans_values, stream) != cudaSuccess)
      return CUDSS_STATUS_EXECUTION_FAILED;
    std::vector<int32_t> ignored(static_cast<size_t>(m.batch), 0);
    if ((s = st->trans->Factor(stream, indptr_t, indices_t, st->trans_values, true, false,
                               ignored.data())) != CUDSS_STATUS_SUCCESS)
      return s;
    st->trans_epoch = st->epoch;
  }
  Count(kTransposeFallback);
  return st->trans->Solve(stream, indptr_t, indices_t, st->trans_values, b, x, k, 0);
}

ffi::Error SolveCommon(bool transpose, cudaStream_t stream, int32_t device,
                       ffi::Buffer<ffi::S32, 1> indptr, ffi::Buffer<ffi::S32, 1> indices,
                       ffi::AnyBuffer values, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> x,
                       void* indptr_t, void* indices_t, const int32_t* perm, const Attrs& at) {
  auto vd = values.dimensions();
  auto bd = b.dimensions();
  if (vd.size() != 2 || bd.size() != 3) return ShapeError("values must be (L, nnz), b (L, k, n)");
  const int64_t batch = vd[0], nnz = vd[1], k = bd[1];
  const int64_t n = indptr.dimensions()[0] - 1;
  if (bd[0] != batch || bd[2] != n || indices.dimensions()[0] != nnz)
    return ShapeError("inconsistent shapes of values and right-hand sides");
  size_t out_bytes = 0;
  {
    size_t count = 1;
    for (int64_t d : x->dimensions()) count *= static_cast<size_t>(d);
    out_bytes = count * (x->element_type() == ffi::DataType::F32 ? 4 : 8);
  }
  if (out_bytes == 0) return ffi::Error::Success();
  const int32_t dtype = DtypeCode(values.element_type());
  if (dtype == 0 || b.element_type() != values.element_type()) {
    FillNaN(x->untyped_data(), out_bytes, stream);
    return ffi::Error::Success();
  }
  EnsureDevice(device);
  Key key{device, at.pattern, dtype, batch, at.slot, at.reorder, at.hybrid, at.hybrid_limit_mb,
          n, nnz};
  auto st = FindState(key);
  if (st == nullptr) {
    Count(kFailedCalls);
    FillNaN(x->untyped_data(), out_bytes, stream);
    return ffi::Error::Success();
  }
  std::lock_guard<std::mutex> lock(st->mu);
  if (!st->main.factored) {
    Count(kFailedCalls);
    FillNaN(x->untyped_data(), out_bytes, stream);
    return ffi::Error::Success();
  }
  void* ip = indptr.typed_data();
  void* ix = indices.typed_data();
  void* vv = values.untyped_data();
  void* bb = b.untyped_data();
  void* xx = x->untyped_data();
  cudssStatus_t s = CUDSS_STATUS_SUCCESS;
  Count(kSolves);
  if (!transpose) {
    s = st->main.Solve(stream, ip, ix, vv, bb, xx, k, CUDSS_SOLVE_MODE_NORMAL);
  } else {
    const int pref = TransposePreference();
    bool done = false;
    if (pref != 2 && st->tmode != kTransposeFallbackOnly) {
      s = st->main.Solve(stream, ip, ix, vv, bb, xx, k, CUDSS_SOLVE_MODE_TRANSPOSE);
      if (s == CUDSS_STATUS_SUCCESS) {
        done = true;
        if (pref == 0 && st->tmode == kTransposeUnknown) {
          int verdict = VerifyTransposed(stream, dtype, n, nnz, ip, ix, vv, bb, xx);
          if (verdict > 0 || ++st->checks >= 3) st->tmode = kTransposeNativeOk;
          if (verdict < 0) done = false;
        }
        if (done) Count(kTransposeNative);
      }
      if (!done && pref != 1) {
        std::fprintf(stderr,
                     "diffsoup cuDSS: native transposed solve %s (cuDSS status %d); this "
                     "configuration factors A^T instead\n",
                     s == CUDSS_STATUS_SUCCESS ? "failed its check" : "is unavailable",
                     static_cast<int>(s));
        st->tmode = kTransposeFallbackOnly;
      }
    }
    if (!done && pref != 1) {
      s = SolveTransposedFallback(st.get(), stream, dtype, indptr_t, indices_t, perm, vv, bb, xx,
                                  k);
    } else if (!done) {
      s = s == CUDSS_STATUS_SUCCESS ? CUDSS_STATUS_EXECUTION_FAILED : s;
    }
  }
  if (s != CUDSS_STATUS_SUCCESS) {
    Count(kFailedCalls);
    if (Verbose())
      std::fprintf(stderr, "diffsoup cuDSS: solve failed with cuDSS status %d\n",
                   static_cast<int>(s));
    FillNaN(xx, out_bytes, stream);
  }
  return ffi::Error::Success();
}

ffi::Error SolveImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer /*info*/,
                     ffi::Buffer<ffi::S32, 1> indptr, ffi::Buffer<ffi::S32, 1> indices,
                     ffi::AnyBuffer values, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> x,
                     int64_t pattern, int32_t slot, int32_t reorder, int32_t hybrid,
                     int64_t hybrid_limit_mb, bool check) {
  return SolveCommon(false, stream, device, indptr, indices, values, b, x, nullptr, nullptr,
                     nullptr, Attrs{pattern, slot, reorder, hybrid, hybrid_limit_mb, check});
}

ffi::Error SolveTransposeImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer /*info*/,
                              ffi::Buffer<ffi::S32, 1> indptr, ffi::Buffer<ffi::S32, 1> indices,
                              ffi::AnyBuffer values, ffi::AnyBuffer b,
                              ffi::Buffer<ffi::S32, 1> indptr_t, ffi::Buffer<ffi::S32, 1> indices_t,
                              ffi::Buffer<ffi::S32, 1> perm_t, ffi::Result<ffi::AnyBuffer> x,
                              int64_t pattern, int32_t slot, int32_t reorder, int32_t hybrid,
                              int64_t hybrid_limit_mb, bool check) {
  if (indptr_t.dimensions()[0] != indptr.dimensions()[0] ||
      indices_t.dimensions()[0] != indices.dimensions()[0] ||
      perm_t.dimensions()[0] != indices.dimensions()[0])
    return ShapeError("transposed pattern does not match the pattern");
  return SolveCommon(true, stream, device, indptr, indices, values, b, x, indptr_t.typed_data(),
                     indices_t.typed_data(), perm_t.typed_data(),
                     Attrs{pattern, slot, reorder, hybrid, hybrid_limit_mb, check});
}

}  // namespace

// Aliases without commas, for the handler macros below.
using I32Vector = ffi::Buffer<ffi::S32, 1>;
using CudaStream = ffi::PlatformStream<cudaStream_t>;

#define DIFFSOUP_CUDSS_ATTRS                                                               \
  .Attr<int64_t>("pattern")                                                               \
      .Attr<int32_t>("slot")                                                              \
      .Attr<int32_t>("reorder")                                                           \
      .Attr<int32_t>("hybrid")                                                            \
      .Attr<int64_t>("hybrid_limit_mb")                                                   \
      .Attr<bool>("check")

XLA_FFI_DEFINE_HANDLER_SYMBOL(DiffsoupCudssAnalyzeFactor, AnalyzeFactorImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<CudaStream>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<I32Vector>()
                                  .Arg<I32Vector>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<I32Vector>() DIFFSOUP_CUDSS_ATTRS);

XLA_FFI_DEFINE_HANDLER_SYMBOL(DiffsoupCudssRefactor, RefactorImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<CudaStream>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<I32Vector>()
                                  .Arg<I32Vector>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<I32Vector>() DIFFSOUP_CUDSS_ATTRS);

XLA_FFI_DEFINE_HANDLER_SYMBOL(DiffsoupCudssSolve, SolveImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<CudaStream>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<I32Vector>()
                                  .Arg<I32Vector>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>() DIFFSOUP_CUDSS_ATTRS);

XLA_FFI_DEFINE_HANDLER_SYMBOL(DiffsoupCudssSolveTranspose, SolveTransposeImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<CudaStream>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<I32Vector>()
                                  .Arg<I32Vector>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<I32Vector>()
                                  .Arg<I32Vector>()
                                  .Arg<I32Vector>()
                                  .Ret<ffi::AnyBuffer>() DIFFSOUP_CUDSS_ATTRS);

// ------------------------------------------------------------------------------------------
// Plain C entry points (ctypes): counters, version, releasing the registry
// ------------------------------------------------------------------------------------------

extern "C" {

__attribute__((visibility("default"))) int diffsoup_cudss_version() {
  int major = 0, minor = 0, patch = 0;
  if (cudssGetProperty(MAJOR_VERSION, &major) != CUDSS_STATUS_SUCCESS) return -1;
  cudssGetProperty(MINOR_VERSION, &minor);
  cudssGetProperty(PATCH_LEVEL, &patch);
  return major * 10000 + minor * 100 + patch;
}

__attribute__((visibility("default"))) int diffsoup_cudss_counters(int64_t* out, int count) {
  int m = std::min<int>(count, kNumCounters);
  for (int i = 0; i < m; ++i) out[i] = g_counters[i].load(std::memory_order_relaxed);
  return kNumCounters;
}

// Frees every cuDSS object (factors included). Only while no computation that uses them is in
// flight: it synchronizes each device first.
__attribute__((visibility("default"))) int diffsoup_cudss_release_all() {
  std::unordered_map<Key, std::shared_ptr<State>, KeyHash> taken;
  {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    taken.swap(Registry());
  }
  int released = 0;
  for (auto& kv : taken) {
    EnsureDevice(kv.first.device);
    cudaDeviceSynchronize();
    { std::lock_guard<std::mutex> lock(kv.second->mu); }  // waits for a call in progress
    kv.second.reset();  // destroyed with its own device current
    ++released;
  }
  taken.clear();
  g_counters[kStates].store(0);
  return released;
}

}  // extern "C"
