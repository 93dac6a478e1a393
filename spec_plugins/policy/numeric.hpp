// Arithmetic the adaptive policy's compiled paths (_trim.cpp, _observe.cpp) share with the numpy code they
// are checked against (ConfidenceCalibrator, tests/policy_reference.py), so that both compute the same values
// bit for bit.
#pragma once
#include <cstddef>
#include <cstdint>

namespace spec_plugins_policy {

// numpy's float64 sum of a contiguous array (pairwise: 8 accumulators up to 128 values, halves above).
inline double numpy_sum(const double* a, std::size_t n) {
  if (n < 8) {
    double res = 0.0;
    for (std::size_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int k = 0; k < 8; ++k) r[k] = a[k];
    std::size_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int k = 0; k < 8; ++k) r[k] += a[i + k];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  std::size_t half = n / 2;
  half -= half % 8;
  return numpy_sum(a, half) + numpy_sum(a + half, n - half);
}

// acceptance.position_bucket: draft positions 0, 1, 2-3, 4-7, 8+.
inline int position_bucket(std::int64_t j) {
  if (j == 0) return 0;
  int b = 1;
  while (b < 4 && (std::int64_t(1) << b) <= j) ++b;
  return b;
}

// ConfidenceCalibrator: the histogram cell of a clipped confidence c at draft position j, and the
// calibrated acceptance there (an empty cell trusts c, a full one what was observed).
inline std::int64_t calibration_cell(std::int64_t j, double c, std::int64_t bins) {
  const std::int64_t b = std::int64_t(c * double(bins));
  return position_bucket(j) * bins + (b < bins - 1 ? b : bins - 1);
}
inline double calibrated(const double* trials, const double* successes, std::int64_t cell, double prior_weight,
                         double c) {
  return (successes[cell] + prior_weight * c) / (trials[cell] + prior_weight);
}

// ConfidenceCalibrator's trials and successes, both [5, bins] (five position buckets): their bins (0 where the
// shapes are not such).
template <class Index>
inline std::int64_t calibrator_bins(int ndim, const Index* shape, int successes_ndim, const Index* successes_shape) {
  if (ndim != 2 || shape[0] != 5 || successes_ndim != 2 || successes_shape[0] != 5 || successes_shape[1] != shape[1])
    return 0;
  return std::int64_t(shape[1]);
}

inline double clip01(double x) { return x < 0.0 ? 0.0 : (x > 1.0 ? 1.0 : x); }

}  // namespace spec_plugins_policy
