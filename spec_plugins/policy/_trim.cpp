// The allocator's search over one step (spec_plugins/policy/allocator.py, allocate_batch) in one call:
// rank every (request, position) by prefix survival, walk the ranking with running tokens and step
// time read off the cost model's cached curves, and stop where the search says. The arithmetic is that of
// the numpy twin the tests keep (tests/policy_reference.py), operation for operation, so both choose the same
// lengths (tests/test_batched_policy.py).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "../fast_array.hpp"
#include "numeric.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace py = pybind11;
using spec_plugins_policy::calibrated;
using spec_plugins_policy::calibration_cell;
using spec_plugins_policy::clip01;
using spec_plugins_policy::calibrator_bins;
using spec_plugins_policy::numpy_sum;

namespace {

using f64 = spec_plugins::CArray<double, py::array::c_style | py::array::forcecast>;
using i64 = spec_plugins::CArray<std::int64_t, py::array::c_style | py::array::forcecast>;

// Each request's attention by its draft rows: its context length times the roofline's seconds per context token
// (RooflineCost.attention_curve: the same product as in Python), or a table the cost model's attention_time
// filled (allocator.curve_source, for a cost model without curves).
struct Attention {
  const double* per_token = nullptr;  // [len]: by draft rows 0, 1, ...
  const double* table = nullptr;      // [n, len]
  const std::int64_t* context = nullptr;
  py::ssize_t len = 0;
  double at(py::ssize_t r, std::int64_t d) const {
    if (table) return table[r * len + d];
    const std::int64_t length = context[r];
    return length <= 0 ? 0.0 : double(length) * per_token[d];
  }
};

// Indices of `gain` (all > 0) by decreasing value, equal values in index order: numpy's
// argsort(-gain, kind="stable"). A positive double's bits order like its value, so this is a stable LSD
// radix sort of the complemented bits, 8 bits a pass, passes where every key agrees skipped. Only the
// high 32 bits are radix-sorted (survivals share their sign and most of their exponent, so the low bits
// rarely decide); runs whose high bits tie are then put in full order by insertion, which keeps index
// order among equal values: the same permutation as sorting all 64 bits.
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
  for (int shift = 32; shift < 64; shift += 8) {
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
  for (std::size_t lo = 0; lo < m;) {
    std::size_t hi = lo + 1;
    while (hi < m && (key[hi] >> 32) == (key[lo] >> 32)) ++hi;
    for (std::size_t i = lo + 1; i < hi; ++i) {  // insertion: (key, index) ascending within the run
      const std::uint64_t k = key[i];
      const std::int32_t x = idx[i];
      std::size_t j = i;
      for (; j > lo && (key[j - 1] > k || (key[j - 1] == k && idx[j - 1] > x)); --j) {
        key[j] = key[j - 1];
        idx[j] = idx[j - 1];
      }
      key[j] = k;
      idx[j] = x;
    }
    lo = hi;
  }
  return idx;
}

// MeasuredCost.context_terms: each request's context priced on its own. After admitting k drafted rows whose
// requests' weights on the longer profiled contexts sum to W_g, the step costs the reference curve at n + k
// plus base + sum_g W_g (delta_g[n + k] - delta_g[n]) / k.
struct ContextCost {
  double base;
  const double* delta;  // [grids, len]
  py::ssize_t grids, len;
  const double* alpha;  // [n, grids]
  // The extra seconds over the reference curve with weights W after k admissions (k >= 1), n requests.
  double extra(const std::vector<double>& W, py::ssize_t n, std::size_t k) const {
    double e = base;
    for (py::ssize_t g = 0; g < grids; ++g) {
      const double* dg = delta + g * len;
      e += W[g] * ((dg[n + k] - dg[n]) / double(k));
    }
    return e;
  }
};

// The cost model's extra terms from Python (allocator.curve_source): none (a measured profile at one context: its
// curve includes attention), ("per_token", RooflineCost.attention_curve, context lengths), ("per_row", table
// [n, draft rows]), or ("per_request", base, delta, alpha) from MeasuredCost.context_terms. The arrays stay
// alive in the holders.
struct Extras {
  bool has_attention = false, has_contexts = false;
  Attention att{};
  i64 context;
  f64 attention;
  ContextCost cc{};
  f64 delta, alpha;
};

void read_extras(const py::object& obj, Extras& x, py::ssize_t n) {
  if (obj.is_none()) return;
  py::tuple t = obj.cast<py::tuple>();
  const std::string kind = t.size() > 0 && py::isinstance<py::str>(t[0]) ? t[0].cast<std::string>() : "";
  if (kind == "per_request" && t.size() == 4) {
    x.delta = t[2].cast<f64>();
    x.alpha = t[3].cast<f64>();
    if (x.delta.ndim() != 2 || x.alpha.ndim() != 2 || x.alpha.shape(0) != n || x.alpha.shape(1) != x.delta.shape(0))
      throw py::value_error("allocate: context terms of different shapes (delta [grids, rows], alpha [n, grids])");
    x.cc = ContextCost{t[1].cast<double>(), x.delta.data(), x.delta.shape(0), x.delta.shape(1), x.alpha.data()};
    x.has_contexts = true;
    return;
  }
  if (kind == "per_token" && t.size() == 3) {
    x.attention = t[1].cast<f64>();
    x.context = t[2].cast<i64>();
    if (x.attention.ndim() != 1) throw py::value_error("allocate: the attention curve must be 1-D");
    if (x.context.ndim() != 1 || x.context.shape(0) != n)
      throw py::value_error("allocate: one context length per request");
    x.att = Attention{x.attention.data(), nullptr, x.context.data(), x.attention.shape(0)};
  } else if (kind == "per_row" && t.size() == 2) {
    x.attention = t[1].cast<f64>();
    if (x.attention.ndim() != 2 || x.attention.shape(0) != n)
      throw py::value_error("allocate: one row of attention times per request");
    x.att = Attention{nullptr, x.attention.data(), nullptr, x.attention.shape(1)};
  } else {
    throw py::value_error("allocate: expected ('per_token', curve, context lengths), ('per_row', table) or "
                          "('per_request', base, delta, alpha) attention terms");
  }
  x.has_attention = true;
}

// What the step pays beyond the curve at n rows when no request keeps a draft: each request's attention at 0 draft
// rows (summed in request order, as Python sums it), or the contexts' base; 0 for a curve that holds it all.
double no_draft_extra(const Extras& x, py::ssize_t n) {
  double total = 0.0;
  if (x.has_attention) {
    if (x.att.len < 1) throw py::value_error("allocate: the attention terms are shorter than the drafts");
    for (py::ssize_t r = 0; r < n; ++r) total += x.att.at(r, 0);
  } else if (x.has_contexts) {
    total = x.cc.base;
  }
  return total;
}

struct Search {
  double sunk;       // seconds paid whatever is kept: overhead + drafting
  bool greedy;       // stop at the first non-improvement
  double min_gain;   // relative margin a longer allocation must beat the best by (global search)
  bool has_rate;     // maximise tau - rate * time instead of tau / time
  double rate;
  long long budget;  // at most this many kept tokens (-1: no limit)
};

// allocate_batch's walk on a dense survival matrix S [n, width]: writes each request's kept length.
void walk_into(const double* S, py::ssize_t n, py::ssize_t width, const std::int64_t* L, const Search& q,
               const double* C, py::ssize_t curve_len, const Extras& x, std::int64_t* out) {
  const Attention* att = x.has_attention ? &x.att : nullptr;
  const ContextCost* cc = x.has_contexts ? &x.cc : nullptr;
  // Candidates in (request, position) order; a survival that rises along a draft is refused.
  std::vector<std::int32_t> row, pos;
  std::vector<double> gain;
  row.reserve(n * width);
  pos.reserve(n * width);
  gain.reserve(n * width);
  for (py::ssize_t r = 0; r < n; ++r) {
    const std::int64_t len = L[r];
    if (len < 0 || len > width) throw py::value_error("allocate: a draft length exceeds the survival matrix");
    const double* s = S + r * width;
    for (std::int64_t j = 0; j < len; ++j) {
      if (j > 0 && s[j] - s[j - 1] > 1e-12)
        throw py::value_error("allocate: survival of request " + std::to_string(r) +
                              " increases along the draft; expected prefix survival");
      if (s[j] > 0.0) {
        row.push_back(std::int32_t(r));
        pos.push_back(std::int32_t(j));
        gain.push_back(s[j]);
      }
    }
  }
  const std::vector<std::int32_t> order = descending_stable(gain);
  std::size_t m = order.size();
  if (q.budget >= 0 && std::size_t(q.budget) < m) m = std::size_t(q.budget);
  if (curve_len < py::ssize_t(n + m + 1) || (cc && cc->len < py::ssize_t(n + m + 1)))
    throw py::value_error("allocate: the cost curve is shorter than the rows of this step");
  std::vector<double> W(cc ? cc->grids : 0, 0.0);  // running sums of the admitted rows' context weights

  if (att && att->len < width + 2) throw py::value_error("allocate: the attention terms are shorter than the drafts");
  const double zero_extra = no_draft_extra(x, n);
  double attn_total = att ? zero_extra : 0.0;  // the requests' attention, updated row by row below
  auto theta_at = [&](double tau, double verify) {
    const double time = q.sunk + verify;
    return q.has_rate ? tau - q.rate * time : tau / time;
  };
  double tau = double(n);
  double best = theta_at(tau, C[n] + zero_extra);
  double prev = best;
  std::size_t best_k = 0;
  for (std::size_t k = 1; k <= m; ++k) {
    const std::int32_t c = order[k - 1];
    tau += gain[c];
    if (att) {  // one more draft row of request row[c]: exactly 0.0 where it opens no other query tile
      const std::int64_t j = pos[c];
      attn_total += att->at(row[c], j + 1) - att->at(row[c], j);
    }
    double verify = C[n + k];
    if (att) {
      verify += attn_total;
    } else if (cc) {
      const double* a = cc->alpha + std::size_t(row[c]) * cc->grids;
      for (py::ssize_t g = 0; g < cc->grids; ++g) W[g] += a[g];
      verify += cc->extra(W, n, k);
    }
    const double theta = theta_at(tau, verify);
    if (q.greedy) {
      if (theta <= prev) break;  // nothing after the first non-improvement is read
      prev = theta;
      best_k = k;
    } else if (q.min_gain == 0.0 ? theta > best : theta > best + std::abs(best) * q.min_gain) {
      best = theta;
      best_k = k;
    }
  }
  std::fill(out, out + n, std::int64_t(0));
  for (std::size_t k = 0; k < best_k; ++k) out[row[order[k]]] += 1;
}

i64 walk(f64 survival, i64 lengths_in, double sunk, bool greedy, double min_gain, py::object rate_obj,
         long long budget, f64 curve_in, py::object attention_obj) {
  if (survival.ndim() != 2) throw py::value_error("allocate: survival must be a 2-D array");
  const py::ssize_t n = survival.shape(0), width = survival.shape(1);
  if (lengths_in.ndim() != 1 || lengths_in.shape(0) != n) throw py::value_error("allocate: one length per request");
  if (curve_in.ndim() != 1) throw py::value_error("allocate: the cost curve must be 1-D");
  Extras extras;
  read_extras(attention_obj, extras, n);
  const Search q{sunk, greedy, min_gain, !rate_obj.is_none(), rate_obj.is_none() ? 0.0 : rate_obj.cast<double>(), budget};
  i64 out(n);
  walk_into(survival.data(), n, width, lengths_in.data(), q, curve_in.data(), curve_in.shape(0), extras,
            out.mutable_data());
  return out;
}

// The calibrator's bins (numeric.hpp calibrator_bins), or a one-line error.
std::int64_t calibrator_shape(const f64& trials, const f64& successes) {
  const std::int64_t bins = calibrator_bins(trials.ndim(), trials.shape(), successes.ndim(), successes.shape());
  if (bins == 0) throw py::value_error("survival: calibrator tables must be [5, bins]");
  return bins;
}

// One draft's prefix survival from its raw confidences x[0..len): calibrated per cell, scaled by the
// request's correction (when corrected) and clipped, multiplied along the draft. Writes surv[0..len) and,
// when given, the raw values to raw[0..len).
void survival_row(const double* x, std::int64_t len, const double* trials, const double* successes,
                  std::int64_t bins, double prior_weight, bool corrected, double correction, double* surv,
                  double* raw) {
  double prod = 1.0;
  for (std::int64_t j = 0; j < len; ++j) {
    if (raw) raw[j] = x[j];
    const double c = clip01(x[j]);
    double cond = calibrated(trials, successes, calibration_cell(j, c, bins), prior_weight, c);
    if (corrected) cond = clip01(cond * correction);
    prod *= clip01(cond);
    surv[j] = prod;
  }
}

// The walk's input from drafts with confidences (AdaptiveLength._survival): each request's first
// usable[r] confidences as a dense [n, width] matrix, calibrated (histogram cells by position bucket and
// bin), scaled by the request's correction and clipped, then multiplied along the draft. Returns (survival,
// raw confidences), both zero past each request's usable length.
py::tuple calibrated_survival(f64 flat, i64 offsets, i64 usable, py::ssize_t width, f64 cal_trials,
                              f64 cal_successes, double prior_weight, py::object correction_obj) {
  const py::ssize_t n = usable.size();
  if (offsets.size() != n + 1) throw py::value_error("survival: one offset per draft, plus one");
  const std::int64_t bins = calibrator_shape(cal_trials, cal_successes);
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
    survival_row(x + o[r], u[r], ct, cs, bins, prior_weight, corrected, corrected ? correction.data()[r] : 1.0,
                 sv + r * width, cf + r * width);
  }
  return py::make_tuple(surv, conf);
}


using f64_out = spec_plugins::CArray<double, py::array::c_style>;
using i64_out = spec_plugins::CArray<std::int64_t, py::array::c_style>;

// One AdaptiveLength.trim_batch (adaptive.py) in one call, for a cost model that exposes its curves:
//   survival  from the drafts' confidences (conf: flat, per token; calibrated by the histogram tables,
//             scaled by each request's fit (ok + k) / (predicted + k) when k > 0) or, with conf None,
//             from the history (pooled trials, successes, prior and prior weight; per-request trials and
//             successes [S, P]; the request prior weight), as HistoryEstimator.conditional_slots;
//   the walk  (walk_into) over the cost curve and attention;
//   the store of each request's kept raw confidences and length (kept, kept_len at its slot; -1 without
//             confidences), which its next observation learns from.
// The seconds every step pays whatever is kept are overhead + offset + draft_seconds, where a negative offset (the
// measured steps' fit: verified tokens dearer than modelled) is bounded by offset_cut times the step with no
// drafts, read off the same curves.
// Returns (lengths [n], expected tokens of the kept drafts, linear seconds, attention seconds, the offset as
// bounded, the linear and attention seconds of the same step with no drafts): what the policy's long-run rate
// adds up, and what it weighs drafting at all against (AdaptiveLength's DraftingPause). The arithmetic is the numpy twin's
// (tests/policy_reference.py, NumpyAdaptive).
// conditional (None, or float64 [drafted tokens], the drafts' flat layout): filled with each token's conditional
// acceptance estimate from the same survival, survival[j] / survival[j - 1] (0 where the one before is 0, and past
// the positions the estimates keep): on the kept prefixes, what BatchDrafts.with_survival makes of
// AdaptiveLength.survival_batch.
py::tuple trim_step(py::object conf_obj, i64 offsets, i64 drafted, py::object history_obj, i64 slots, f64 cal_trials,
                    f64 cal_successes, double prior_weight, f64 fit_ok, f64 fit_predicted, double correction_k,
                    f64_out kept, i64_out kept_len, double overhead, double draft_seconds, double offset,
                    double offset_cut, bool greedy, double min_gain, py::object rate_obj, long long budget, f64 curve,
                    py::object attention_obj, py::object conditional_obj) {
  const py::ssize_t n = drafted.size();
  if (offsets.size() != n + 1 || slots.size() != n) throw py::value_error("trim: one offset (plus one) and slot per draft");
  if (kept.ndim() != 2 || kept_len.size() != kept.shape(0) || fit_ok.size() != kept.shape(0) ||
      fit_predicted.size() != kept.shape(0) || !kept.writeable() || !kept_len.writeable())
    throw py::value_error("trim: per-request columns of different sizes, or read-only");
  if (curve.ndim() != 1) throw py::value_error("allocate: the cost curve must be 1-D");
  const py::ssize_t positions = kept.shape(1), capacity = kept.shape(0);
  const std::int64_t* o = offsets.data();
  const std::int64_t* d = drafted.data();
  const std::int64_t* sl = slots.data();
  std::vector<std::int64_t> usable(n);
  py::ssize_t width = 0;
  for (py::ssize_t r = 0; r < n; ++r) {
    if (d[r] < 0 || o[r + 1] - o[r] != d[r]) throw py::value_error("trim: draft lengths disagree with the offsets");
    if (sl[r] < 0 || sl[r] >= capacity) throw py::value_error("trim: slot out of range");
    usable[r] = std::min<std::int64_t>(d[r], positions);
    width = std::max<py::ssize_t>(width, usable[r]);
  }
  std::vector<double> surv(n * width, 0.0);
  const bool with_conf = !conf_obj.is_none();
  f64 conf_flat;
  std::vector<double> raw;
  if (with_conf) {
    conf_flat = conf_obj.cast<f64>();
    if (conf_flat.size() != o[n]) throw py::value_error("trim: one confidence per drafted token");
    const std::int64_t bins = calibrator_shape(cal_trials, cal_successes);
    const double* ct = cal_trials.data();
    const double* cs = cal_successes.data();
    const double* x = conf_flat.data();
    const double* fo = fit_ok.data();
    const double* fp = fit_predicted.data();
    raw.assign(n * width, 0.0);
    for (py::ssize_t r = 0; r < n; ++r) {
      const double correction = correction_k > 0 ? (fo[sl[r]] + correction_k) / (fp[sl[r]] + correction_k) : 1.0;
      survival_row(x + o[r], usable[r], ct, cs, bins, prior_weight, correction_k > 0, correction,
                   surv.data() + r * width, raw.data() + r * width);
    }
  } else {
    // HistoryEstimator.conditional_slots: each request's rates shrunk to the pooled ones.
    const py::tuple h = history_obj.cast<py::tuple>();
    const f64 pooled_trials = h[0].cast<f64>(), pooled_successes = h[1].cast<f64>(), pooled_prior = h[2].cast<f64>();
    const double pooled_weight = h[3].cast<double>();
    const f64 trials = h[4].cast<f64>(), successes = h[5].cast<f64>();
    const double weight = h[6].cast<double>();
    const py::ssize_t p = pooled_trials.size();
    if (pooled_successes.size() != p || pooled_prior.size() != p || trials.ndim() != 2 || trials.shape(1) != p ||
        successes.size() != trials.size() || width > p)
      throw py::value_error("trim: history counts of different shapes");
    std::vector<double> pooled(width);
    for (py::ssize_t j = 0; j < width; ++j)
      pooled[j] = (pooled_successes.data()[j] + pooled_weight * pooled_prior.data()[j]) /
                  (pooled_trials.data()[j] + pooled_weight);
    for (py::ssize_t r = 0; r < n; ++r) {
      if (sl[r] >= trials.shape(0)) throw py::value_error("trim: slot out of range");
      const double* t = trials.data() + sl[r] * p;
      const double* su = successes.data() + sl[r] * p;
      double prod = 1.0;
      for (py::ssize_t j = 0; j < width; ++j) {
        prod *= clip01((su[j] + weight * pooled[j]) / (t[j] + weight));
        surv[r * width + j] = prod;
      }
    }
  }
  if (!conditional_obj.is_none()) {
    f64_out cond = conditional_obj.cast<f64_out>();
    if (cond.size() != o[n] || !cond.writeable()) throw py::value_error("trim: conditional: one writeable slot per drafted token");
    double* c = cond.mutable_data();
    for (py::ssize_t r = 0; r < n; ++r) {
      const double* sr = surv.data() + r * width;
      for (std::int64_t j = 0; j < d[r]; ++j) {
        const double prev = j == 0 ? 1.0 : sr[j - 1];
        c[o[r] + j] = j < usable[r] && prev > 0.0 ? sr[j] / prev : 0.0;
      }
    }
  }
  Extras extras;
  read_extras(attention_obj, extras, n);
  if (curve.shape(0) <= n) throw py::value_error("allocate: the cost curve is shorter than the rows of this step");
  const double bare = curve.data()[n] + no_draft_extra(extras, n);  // the step with no drafts, past its overhead
  if (offset < 0.0) offset = std::max(offset, -offset_cut * (overhead + bare));  // bounded by offset_cut of it
  const double sunk = overhead + offset + draft_seconds;
  const Search q{sunk, greedy, min_gain, !rate_obj.is_none(), rate_obj.is_none() ? 0.0 : rate_obj.cast<double>(), budget};
  i64 out(n);
  std::int64_t* len = out.mutable_data();
  walk_into(surv.data(), n, width, usable.data(), q, curve.data(), curve.shape(0), extras, len);

  // Expected tokens and modelled time of the kept drafts, summed as the numpy twin sums them.
  std::vector<double> kept_surv(n * width, 0.0);
  std::int64_t rows = n;
  for (py::ssize_t r = 0; r < n; ++r) {
    rows += len[r];
    for (std::int64_t j = 0; j < len[r]; ++j) kept_surv[r * width + j] = surv[r * width + j];
  }
  const double tau = double(n) + numpy_sum(kept_surv.data(), kept_surv.size());
  double attention = 0.0;  // what the step pays beyond the curve: attention, or the contexts' extra
  if (extras.has_attention)
    for (py::ssize_t r = 0; r < n; ++r) attention += extras.att.at(r, len[r]);
  if (extras.has_contexts) {
    const ContextCost& cc = extras.cc;
    std::vector<double> W(cc.grids, 0.0);
    for (py::ssize_t r = 0; r < n; ++r)
      for (py::ssize_t g = 0; g < cc.grids; ++g) W[g] += cc.alpha[r * cc.grids + g] * double(len[r]);
    attention = rows > n ? cc.extra(W, n, std::size_t(rows - n)) : cc.base;
  }
  if (rows >= curve.shape(0)) throw py::value_error("allocate: the cost curve is shorter than the rows of this step");
  const double linear = curve.data()[rows];

  double* k = kept.mutable_data();
  std::int64_t* kl = kept_len.mutable_data();
  for (py::ssize_t r = 0; r < n; ++r) {
    if (with_conf) {
      std::copy(raw.begin() + r * width, raw.begin() + (r + 1) * width, k + sl[r] * positions);
      kl[sl[r]] = len[r];
    } else {
      kl[sl[r]] = -1;
    }
  }
  return py::make_tuple(out, tau, linear, attention, offset, bare);
}

}  // namespace

PYBIND11_MODULE(_trim, m) {
  m.doc() = "The adaptive allocator's ranking walk for one step, its survival input, and the whole trim (see allocator.py, adaptive.py).";
  m.def("calibrated_survival", &calibrated_survival, py::arg("flat"), py::arg("offsets"), py::arg("usable"),
        py::arg("width"), py::arg("cal_trials"), py::arg("cal_successes"), py::arg("prior_weight"),
        py::arg("correction"));
  m.def("trim_step", &trim_step, py::arg("conf"), py::arg("offsets"), py::arg("drafted"), py::arg("history"),
        py::arg("slots"), py::arg("cal_trials"), py::arg("cal_successes"), py::arg("prior_weight"), py::arg("fit_ok"),
        py::arg("fit_predicted"), py::arg("correction_k"), py::arg("kept"), py::arg("kept_len"), py::arg("overhead"),
        py::arg("draft_seconds"), py::arg("offset"), py::arg("offset_cut"), py::arg("greedy"), py::arg("min_gain"),
        py::arg("rate"), py::arg("budget"), py::arg("curve"), py::arg("attention"), py::arg("conditional") = py::none());
  m.def("ranking", [](std::vector<double> gain) { return descending_stable(gain); },
        "The order the walk reads candidates in: numpy's argsort(-gain, kind='stable') for gains > 0.");
  m.def("walk", &walk, py::arg("survival"), py::arg("lengths"), py::arg("sunk"), py::arg("greedy"),
        py::arg("min_gain"), py::arg("rate"), py::arg("budget"), py::arg("curve"), py::arg("attention"));
}
