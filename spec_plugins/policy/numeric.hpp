// Arithmetic the adaptive policy's compiled paths (_walk.cpp, _observe.cpp) share with its numpy path, so
// that both compute the same values bit for bit.
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

// AdaptiveLength `calibrate_by_outcome`: how a request's last step fared picks the calibrator table its next
// draft is read from and learnt into (acceptance.draft_outcome): 0 nothing verified (new, or nothing kept), 1
// every token accepted, 2 some, 3 none. Tables are stacked [tables * 5, bins]; table t starts at cell t * 5 * bins.
inline std::int64_t draft_outcome(std::int64_t drafted, std::int64_t accepted) {
  return accepted == drafted ? 1 : (accepted > 0 ? 2 : 3);
}

// ConfidenceCalibrator's tables, stacked [tables * 5, bins] (five position buckets each) in trials and successes
// of the same shape: their bins and how many tables (tables 0 where the shapes are not such a stack).
struct CalibratorShape {
  std::int64_t bins, tables;
};
template <class Index>
inline CalibratorShape stacked_tables(int ndim, const Index* shape, int successes_ndim, const Index* successes_shape) {
  if (ndim != 2 || shape[0] < 5 || shape[0] % 5 != 0 || successes_ndim != 2 || successes_shape[0] != shape[0] ||
      successes_shape[1] != shape[1])
    return {0, 0};
  return {std::int64_t(shape[1]), std::int64_t(shape[0] / 5)};
}

// Whether every table[at[i]] (table[i] where at is null) names one of `tables` tables.
inline bool tables_in_range(const std::int64_t* table, const std::int64_t* at, std::size_t n, std::int64_t tables) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t t = table[at ? at[i] : std::int64_t(i)];
    if (t < 0 || t >= tables) return false;
  }
  return true;
}

inline double clip01(double x) { return x < 0.0 ? 0.0 : (x > 1.0 ? 1.0 : x); }

}  // namespace spec_plugins_policy
