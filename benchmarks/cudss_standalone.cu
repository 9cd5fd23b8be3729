// Plain C++ cuDSS timing of refactorization + solve, the peer of diffsoup's FFI handler in
// benchmarks/bench_linear.py (same matrix, same settings: default reordering, no matching, the
// same pivot epsilon, and the same per-factorization read of CUDSS_DATA_INFO / NPIVOTS).
//
// Build:  nvcc -O2 -std=c++17 -I$CUDSS/include cudss_standalone.cu -o cudss_standalone \
//           -L$CUDSS/lib -Xlinker -l:libcudss.so.1 -Xlinker -rpath,$CUDSS/lib
// Run:    cudss_standalone MATRIX.bin REPS [check_info=1] [deterministic=1]
// MATRIX.bin: int64 n, int64 nnz, int32 indptr[n+1], int32 indices[nnz], float64 values[nnz],
//             float64 rhs[n]. Prints one JSON line.
#include <cuda_runtime.h>
#include <cudss.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                      \
  do {                                                                             \
    auto _s = (x);                                                                 \
    if (static_cast<int>(_s) != 0) {                                               \
      std::fprintf(stderr, "%s failed: %d (line %d)\n", #x, static_cast<int>(_s), __LINE__); \
      return 1;                                                                    \
    }                                                                              \
  } while (0)

using Clock = std::chrono::steady_clock;
static double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MATRIX.bin REPS [check_info]\n", argv[0]);
    return 2;
  }
  const int reps = std::atoi(argv[2]);
  const bool check = argc < 4 || std::atoi(argv[3]) != 0;
  const bool deterministic = argc < 5 || std::atoi(argv[4]) != 0;
  FILE* f = std::fopen(argv[1], "rb");
  if (!f) return 2;
  int64_t n = 0, nnz = 0;
  if (std::fread(&n, 8, 1, f) != 1 || std::fread(&nnz, 8, 1, f) != 1) return 2;
  std::vector<int32_t> ip(n + 1), ix(nnz);
  std::vector<double> v(nnz), b(n);
  if (std::fread(ip.data(), 4, n + 1, f) != static_cast<size_t>(n + 1) ||
      std::fread(ix.data(), 4, nnz, f) != static_cast<size_t>(nnz) ||
      std::fread(v.data(), 8, nnz, f) != static_cast<size_t>(nnz) ||
      std::fread(b.data(), 8, n, f) != static_cast<size_t>(n))
    return 2;
  std::fclose(f);

  int32_t *dip, *dix;
  double *dv, *db, *dx;
  CK(cudaMalloc(&dip, (n + 1) * 4));
  CK(cudaMalloc(&dix, nnz * 4));
  CK(cudaMalloc(&dv, nnz * 8));
  CK(cudaMalloc(&db, n * 8));
  CK(cudaMalloc(&dx, n * 8));
  CK(cudaMemcpy(dip, ip.data(), (n + 1) * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dix, ix.data(), nnz * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dv, v.data(), nnz * 8, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(db, b.data(), n * 8, cudaMemcpyHostToDevice));
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));

  auto t0 = Clock::now();
  cudssHandle_t h;
  cudssConfig_t cfg;
  cudssData_t data;
  cudssMatrix_t A, X, B;
  CK(cudssCreate(&h));
  CK(cudssSetStream(h, stream));
  CK(cudssConfigCreate(&cfg));
  CK(cudssDataCreate(h, &data));
  cudssReorderingAlg_t alg = CUDSS_REORDERING_ALG_DEFAULT;
  CK(cudssConfigSet(cfg, CUDSS_CONFIG_REORDERING_ALG, &alg, sizeof(alg)));
  cudssMatchingAlg_t matching = CUDSS_MATCHING_ALG_NONE;
  cudssConfigSet(cfg, CUDSS_CONFIG_MATCHING_ALG, &matching, sizeof(matching));
  double eps = 1e-280;
  cudssConfigSet(cfg, CUDSS_CONFIG_PIVOT_EPSILON, &eps, sizeof(eps));
  int det = deterministic ? 1 : 0;
  if (det) CK(cudssConfigSet(cfg, CUDSS_CONFIG_DETERMINISTIC_MODE, &det, sizeof(det)));
  CK(cudssMatrixCreateCsr(&A, n, n, nnz, dip, nullptr, dix, dv, CUDA_R_32I, CUDA_R_32I, CUDA_R_64F,
                          CUDSS_MTYPE_GENERAL, CUDSS_MVIEW_FULL, CUDSS_BASE_ZERO));
  CK(cudssMatrixCreateDn(&X, n, 1, n, dx, CUDA_R_64F, CUDSS_LAYOUT_COL_MAJOR));
  CK(cudssMatrixCreateDn(&B, n, 1, n, db, CUDA_R_64F, CUDSS_LAYOUT_COL_MAJOR));
  CK(cudssExecute(h, CUDSS_PHASE_ANALYSIS, cfg, data, A, X, B));
  CK(cudaStreamSynchronize(stream));
  auto t1 = Clock::now();
  CK(cudssExecute(h, CUDSS_PHASE_FACTORIZATION, cfg, data, A, X, B));
  CK(cudssExecute(h, CUDSS_PHASE_SOLVE, cfg, data, A, X, B));
  CK(cudaStreamSynchronize(stream));
  auto t2 = Clock::now();

  // Timed: refactorization + (info read) + solve, synchronized after each repetition, the way
  // a jitted call with block_until_ready runs.
  int info = 0, npiv = 0;
  size_t w = 0;
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    auto a = Clock::now();
    CK(cudssExecute(h, CUDSS_PHASE_REFACTORIZATION, cfg, data, A, X, B));
    if (check) {
      CK(cudssDataGet(h, data, CUDSS_DATA_INFO, &info, sizeof(info), &w));
      CK(cudssDataGet(h, data, CUDSS_DATA_NPIVOTS, &npiv, sizeof(npiv), &w));
    }
    CK(cudssExecute(h, CUDSS_PHASE_SOLVE, cfg, data, A, X, B));
    CK(cudaStreamSynchronize(stream));
    times.push_back(Seconds(a, Clock::now()));
  }
  std::sort(times.begin(), times.end());
  double median = times.empty() ? 0.0 : times[times.size() / 2];
  double best = times.empty() ? 0.0 : times.front();

  std::vector<double> x(n);
  CK(cudaMemcpy(x.data(), dx, n * 8, cudaMemcpyDeviceToHost));
  double rmax = 0.0, bmax = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    double acc = 0.0;
    for (int32_t q = ip[i]; q < ip[i + 1]; ++q) acc += v[q] * x[ix[q]];
    rmax = std::max(rmax, std::fabs(acc - b[i]));
    bmax = std::max(bmax, std::fabs(b[i]));
  }
  int64_t lu_nnz = 0;
  cudssDataGet(h, data, CUDSS_DATA_LU_NNZ, &lu_nnz, sizeof(lu_nnz), &w);
  std::printf(
      "{\"n\": %lld, \"nnz\": %lld, \"lu_nnz\": %lld, \"analysis_s\": %.6f, \"first_factor_solve_s\": %.6f, "
      "\"refactor_solve_median_s\": %.6e, \"refactor_solve_best_s\": %.6e, \"reps\": %d, \"check_info\": %d, "
      "\"deterministic\": %d, \"info\": %d, \"npivots\": %d, \"relative_residual\": %.3e}\n",
      static_cast<long long>(n), static_cast<long long>(nnz), static_cast<long long>(lu_nnz), Seconds(t0, t1),
      Seconds(t1, t2), median, best, reps, check ? 1 : 0, det, info, npiv, rmax / std::max(bmax, 1e-300));
  cudssMatrixDestroy(A);
  cudssMatrixDestroy(X);
  cudssMatrixDestroy(B);
  cudssDataDestroy(h, data);
  cudssConfigDestroy(cfg);
  cudssDestroy(h);
  return 0;
}
