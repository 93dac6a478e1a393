// The allocator's search over one step (spec_plugins/policy/allocator.py, allocate_batch) in one call:
// rank every (request, position) by prefix survival, walk the ranking with running tokens and step
// time read off the cost model's cached curves, and stop where the search says. The arithmetic is the
// numpy path's, operation for operation, so both choose the same lengths (tests/test_batched_policy.py).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

using f64 = py::array_t<double, py::array::c_style | py::array::forcecast>;
using i64 = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>;

// RooflineCost.attention_times for one (draft length, context length): same operations, same order.
struct Attention {
  double layers, kv_heads, head_dim, kv_bytes, attn_rate, byte_rate;
  std::int64_t group, tile_rows;
  double at(std::int64_t d, std::int64_t length) const {
    if (length <= 0) return 0.0;
    const double tiles = double(this->tiles(d));
    const double kv = 2.0 * double(length) * kv_heads * head_dim * kv_bytes * tiles;
    const double flops = 4.0 * kv_heads * tiles * double(tile_rows) * head_dim * double(length);
    return layers * std::max(flops / attn_rate, kv / byte_rate);
  }
  std::int64_t tiles(std::int64_t d) const { return (group * (1 + d) + tile_rows - 1) / tile_rows; }
};

// Indices of `gain` (all > 0) by decreasing value, equal values in index order: numpy's
// argsort(-gain, kind="stable"). A positive double's bits order like its value, so this is a stable LSD
// radix sort of the complemented bits, 8 bits a pass, passes where every key agrees skipped.
std::vector<std::int32_t> descending_stable(const std::vector<double>& gain) {
  const std::size_t m = gain.size();
  std::vector<std::uint64_t> key(m), key2(m);
  std::vector<std::int32_t> idx(m), idx2(m);
  for (std::size_t i = 0; i < m; ++i) {
    std::uint64_t bits;
    std::memcpy(&bits, &gain[i], sizeof bits);
    key[i] = ~bits;
    idx[i] = std::int32_t(i);
  }
  for (int shift = 0; shift < 64; shift += 8) {
    std::size_t count[257] = {0};
    for (std::size_t i = 0; i < m; ++i) ++count[((key[i] >> shift) & 0xff) + 1];
    if (m && count[((key[0] >> shift) & 0xff) + 1] == m) continue;  // this byte is the same everywhere
    for (int b = 0; b < 256; ++b) count[b + 1] += count[b];
    for (std::size_t i = 0; i < m; ++i) {
      const std::size_t at = count[(key[i] >> shift) & 0xff]++;
      key2[at] = key[i];
      idx2[at] = idx[i];
    }
    key.swap(key2);
    idx.swap(idx2);
  }
  return idx;
}

i64 walk(f64 survival, i64 lengths_in, double sunk, bool greedy, double min_gain, py::object rate_obj,
         long long budget, f64 curve_in, py::object attention_obj) {
  if (survival.ndim() != 2) throw py::value_error("allocate: survival must be a 2-D array");
  const py::ssize_t n = survival.shape(0), width = survival.shape(1);
  if (lengths_in.ndim() != 1 || lengths_in.shape(0) != n) throw py::value_error("allocate: one length per request");
  auto S = survival.unchecked<2>();
  auto L = lengths_in.unchecked<1>();
  auto C = curve_in.unchecked<1>();
  const bool has_rate = !rate_obj.is_none();
  const double rate = has_rate ? rate_obj.cast<double>() : 0.0;
  const bool has_attention = !attention_obj.is_none();
  Attention att{};
  i64 context;
  const std::int64_t* ctx = nullptr;
  if (has_attention) {
    py::tuple t = attention_obj.cast<py::tuple>();
    att = Attention{t[0].cast<double>(), t[1].cast<double>(), t[2].cast<double>(), t[3].cast<double>(),
                    t[4].cast<double>(), t[5].cast<double>(), t[6].cast<std::int64_t>(), t[7].cast<std::int64_t>()};
    context = t[8].cast<i64>();
    if (context.ndim() != 1 || context.shape(0) != n) throw py::value_error("allocate: one context length per request");
    ctx = context.data();
  }
  // Candidates in (request, position) order; a survival that rises along a draft is refused.
  std::vector<std::int32_t> row, pos;
  std::vector<double> gain;
  for (py::ssize_t r = 0; r < n; ++r) {
    const std::int64_t len = L(r);
    if (len < 0 || len > width) throw py::value_error("allocate: a draft length exceeds the survival matrix");
    for (std::int64_t j = 0; j < len; ++j) {
      if (j > 0 && S(r, j) - S(r, j - 1) > 1e-12)
        throw py::value_error("allocate: survival of request " + std::to_string(r) +
                              " increases along the draft; expected prefix survival");
      if (S(r, j) > 0.0) {
        row.push_back(std::int32_t(r));
        pos.push_back(std::int32_t(j));
        gain.push_back(S(r, j));
      }
    }
  }
  const std::vector<std::int32_t> order = descending_stable(gain);
  std::size_t m = order.size();
  if (budget >= 0 && std::size_t(budget) < m) m = std::size_t(budget);
  if (curve_in.ndim() != 1 || curve_in.shape(0) < py::ssize_t(n + m + 1))
    throw py::value_error("allocate: the cost curve is shorter than the rows of this step");

  double attn_total = 0.0;
  if (has_attention)  // Python's sum over the requests' attention at draft 0, in request order
    for (py::ssize_t r = 0; r < n; ++r) attn_total += att.at(0, ctx[r]);
  auto theta_at = [&](double tau, double verify) {
    const double time = sunk + verify;
    return has_rate ? tau - rate * time : tau / time;
  };
  double tau = double(n);
  double best = theta_at(tau, has_attention ? C(n) + attn_total : C(n));
  double prev = best;
  std::size_t best_k = 0;
  for (std::size_t k = 1; k <= m; ++k) {
    const std::int32_t c = order[k - 1];
    tau += gain[c];
    if (has_attention) {
      const std::int64_t j = pos[c], length = ctx[row[c]];
      // One more draft row costs attention only when it opens another query tile (else it adds 0.0).
      if (att.tiles(j + 1) != att.tiles(j)) attn_total += att.at(j + 1, length) - att.at(j, length);
    }
    const double theta = theta_at(tau, has_attention ? C(n + k) + attn_total : C(n + k));
    if (greedy) {
      if (theta <= prev) break;  // nothing after the first non-improvement is read
      prev = theta;
      best_k = k;
    } else if (min_gain == 0.0 ? theta > best : theta > best + std::abs(best) * min_gain) {
      best = theta;
      best_k = k;
    }
  }
  i64 out(n);
  auto O = out.mutable_unchecked<1>();
  for (py::ssize_t r = 0; r < n; ++r) O(r) = 0;
  for (std::size_t k = 0; k < best_k; ++k) O(row[order[k]]) += 1;
  return out;
}

// The walk's input from drafts with confidences (AdaptiveLength._survival): each request's first
// usable[r] confidences as a dense [n, width] matrix, calibrated (histogram cells by position bucket and
// bin), scaled by the request's correction and clipped, then multiplied along the draft. Returns
// (survival, raw confidences), both zero past each request's usable length.
py::tuple calibrated_survival(f64 flat, i64 offsets, i64 usable, py::ssize_t width, f64 cal_trials,
                              f64 cal_successes, double prior_weight, py::object correction_obj) {
  const py::ssize_t n = usable.size();
  if (offsets.size() != n + 1) throw py::value_error("survival: one offset per draft, plus one");
  if (cal_trials.ndim() != 2 || cal_trials.shape(0) != 5 || cal_successes.size() != cal_trials.size())
    throw py::value_error("survival: calibrator tables must be [5, bins]");
  const py::ssize_t bins = cal_trials.shape(1);
  const double* ct = cal_trials.data();
  const double* cs = cal_successes.data();
  const double* x = flat.data();
  const std::int64_t* o = offsets.data();
  const std::int64_t* u = usable.data();
  f64 correction;
  const bool corrected = !correction_obj.is_none();
  if (corrected) {
    correction = correction_obj.cast<f64>();
    if (correction.size() != n) throw py::value_error("survival: one correction per draft");
  }
  f64 surv({n, width}), conf({n, width});
  double* sv = surv.mutable_data();
  double* cf = conf.mutable_data();
  std::fill(sv, sv + n * width, 0.0);
  std::fill(cf, cf + n * width, 0.0);
  for (py::ssize_t r = 0; r < n; ++r) {
    if (u[r] < 0 || u[r] > width || o[r] + u[r] > flat.size()) throw py::value_error("survival: a draft outside its confidences");
    double prod = 1.0;
    for (std::int64_t j = 0; j < u[r]; ++j) {
      const double raw = x[o[r] + j];
      cf[r * width + j] = raw;
      const double c = std::min(1.0, std::max(0.0, raw));
      int bucket = 0;
      if (j > 0) {
        bucket = 1;
        while (bucket < 4 && (std::int64_t(1) << bucket) <= j) ++bucket;
      }
      const std::int64_t cell = bucket * bins + std::min<std::int64_t>(std::int64_t(c * double(bins)), bins - 1);
      double cond = (cs[cell] + prior_weight * c) / (ct[cell] + prior_weight);
      if (corrected) cond = std::min(1.0, std::max(0.0, cond * correction.data()[r]));
      prod *= std::min(1.0, std::max(0.0, cond));
      sv[r * width + j] = prod;
    }
  }
  return py::make_tuple(surv, conf);
}

}  // namespace

PYBIND11_MODULE(_walk, m) {
  m.doc() = "The adaptive allocator's ranking walk for one step, and its survival input (see allocator.py).";
  m.def("calibrated_survival", &calibrated_survival, py::arg("flat"), py::arg("offsets"), py::arg("usable"),
        py::arg("width"), py::arg("cal_trials"), py::arg("cal_successes"), py::arg("prior_weight"),
        py::arg("correction"));
  m.def("walk", &walk, py::arg("survival"), py::arg("lengths"), py::arg("sunk"), py::arg("greedy"),
        py::arg("min_gain"), py::arg("rate"), py::arg("budget"), py::arg("curve"), py::arg("attention"));
}
