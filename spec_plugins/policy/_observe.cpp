// One step's verification results into the adaptive policy's estimators (acceptance.py, adaptive.py), in
// one call: the observations are applied one at a time, in order, exactly as the per-request updates do
// (decay everything, then count what this draft tried and got accepted), without a numpy call per step
// of the way. The arrays are the estimators' own and are updated in place.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "../fast_array.hpp"
#include "numeric.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

namespace py = pybind11;
using spec_plugins_policy::numpy_sum;
using spec_plugins_policy::calibrator_bins;

namespace {

using f64 = spec_plugins::CArray<double, py::array::c_style>;
using i64 = spec_plugins::CArray<std::int64_t, py::array::c_style | py::array::forcecast>;
using i64_out = spec_plugins::CArray<std::int64_t, py::array::c_style>;  // written in place: no converted copy

void check_outcome(std::int64_t drafted, std::int64_t accepted) {
  if (accepted < 0 || accepted > drafted)
    throw py::value_error("observation: expected 0 <= accepted <= drafted, got accepted=" + std::to_string(accepted) +
                          ", drafted=" + std::to_string(drafted));
}

double* data(f64& a, const char* what, py::ssize_t size) {
  if (a.size() != size) throw py::value_error(std::string(what) + ": wrong size");
  return a.mutable_data();
}

// One verified draft into the history: decay everything, then count what it tried and got accepted.
void history_update(double* pt, double* ps, double* t, double* s, py::ssize_t p, std::int64_t drafted,
                    std::int64_t accepted, double decay, double pooled_decay) {
  const std::int64_t tried = std::min<std::int64_t>(std::min(accepted + 1, drafted), p);
  const std::int64_t ok = std::min<std::int64_t>(accepted, p);
  for (py::ssize_t j = 0; j < p; ++j) {
    pt[j] *= pooled_decay;
    ps[j] *= pooled_decay;
    t[j] *= decay;
    s[j] *= decay;
  }
  for (std::int64_t j = 0; j < tried; ++j) pt[j] += 1.0, t[j] += 1.0;
  for (std::int64_t j = 0; j < ok; ++j) ps[j] += 1.0, s[j] += 1.0;
}

// HistoryEstimator: pooled counts [P], per-request counts [S, P] at `slots`.
void history_observe(f64 pooled_trials, f64 pooled_successes, f64 trials, f64 successes, i64 slots, i64 drafted,
                     i64 accepted, double decay, double pooled_decay) {
  const py::ssize_t p = pooled_trials.size();
  double* pt = data(pooled_trials, "pooled_trials", p);
  double* ps = data(pooled_successes, "pooled_successes", p);
  if (trials.ndim() != 2 || trials.shape(1) != p) throw py::value_error("trials: expected [slots, positions]");
  double* rt = data(trials, "trials", trials.size());
  double* rs = data(successes, "successes", trials.size());
  const py::ssize_t m = slots.size();
  if (drafted.size() != m || accepted.size() != m) throw py::value_error("history: one outcome per slot");
  const std::int64_t* sl = slots.data();
  const std::int64_t* d = drafted.data();
  const std::int64_t* a = accepted.data();
  for (py::ssize_t i = 0; i < m; ++i) {  // everything checked before anything changes
    if (d[i] <= 0) continue;
    check_outcome(d[i], a[i]);
    if (sl[i] < 0 || sl[i] >= trials.shape(0)) throw py::value_error("history: slot out of range");
  }
  for (py::ssize_t i = 0; i < m; ++i)
    if (d[i] > 0) history_update(pt, ps, rt + sl[i] * p, rs + sl[i] * p, p, d[i], a[i], decay, pooled_decay);
}

// The adaptive policy's learning from one verified draft's kept confidences c[0..n): its predicted
// accepted count under the calibration so far, the request's decayed (accepted, predicted) fit, then the
// calibrator's own update.
void calibrated_update(double* ct, double* cs, py::ssize_t bins, double prior_weight, double cal_decay,
                       const double* c, std::int64_t n, std::int64_t accepted, double& fit_ok,
                       double& fit_predicted, double fit_decay) {
  double calibrated[4096];
  std::int64_t cell[4096];
  const std::int64_t tried = std::min(accepted + 1, n);
  for (std::int64_t j = 0; j < n; ++j) {
    const double x = spec_plugins_policy::clip01(c[j]);
    cell[j] = spec_plugins_policy::calibration_cell(j, x, bins);
    calibrated[j] = spec_plugins_policy::calibrated(ct, cs, cell[j], prior_weight, x);
  }
  const double predicted = numpy_sum(calibrated, tried);
  fit_ok = fit_decay * fit_ok + double(accepted);
  fit_predicted = fit_decay * fit_predicted + predicted;
  for (py::ssize_t k = 0; k < 5 * bins; ++k) {
    ct[k] *= cal_decay;
    cs[k] *= cal_decay;
  }
  for (std::int64_t j = 0; j < tried; ++j) ct[cell[j]] += 1.0;
  for (std::int64_t j = 0; j < accepted; ++j) cs[cell[j]] += 1.0;
}

// The calibrator's bins (numeric.hpp calibrator_bins), or a one-line error.
std::int64_t calibrator_shape(const f64& trials, const f64& successes) {
  const std::int64_t bins = calibrator_bins(trials.ndim(), trials.shape(), successes.ndim(), successes.shape());
  if (bins == 0) throw py::value_error("calibrator: expected [5, bins]");
  return bins;
}

// For each verified draft in order: calibrated_update (confidence [m, w], row i's first drafted[i]).
void calibrated_observe(f64 cal_trials, f64 cal_successes, double prior_weight, double cal_decay, f64 confidence,
                        i64 drafted, i64 accepted, f64 fit_ok, f64 fit_predicted, i64 slots, double fit_decay) {
  const std::int64_t bins = calibrator_shape(cal_trials, cal_successes);
  double* ct = data(cal_trials, "cal_trials", cal_trials.size());
  double* cs = data(cal_successes, "cal_successes", cal_trials.size());
  if (confidence.ndim() != 2) throw py::value_error("confidence: expected [drafts, positions]");
  const py::ssize_t m = confidence.shape(0), w = confidence.shape(1);
  const double* conf = confidence.data();
  const std::int64_t* d = drafted.data();
  const std::int64_t* a = accepted.data();
  const std::int64_t* sl = slots.data();
  double* fo = fit_ok.mutable_data();
  double* fp = fit_predicted.mutable_data();
  if (drafted.size() != m || accepted.size() != m || slots.size() != m) throw py::value_error("calibrator: one outcome per draft");
  for (py::ssize_t i = 0; i < m; ++i) {  // everything checked before anything changes
    if (d[i] <= 0 || d[i] > w || d[i] > 4096) throw py::value_error("calibrator: a draft length outside its confidences");
    check_outcome(d[i], a[i]);
    if (sl[i] < 0 || sl[i] >= fit_ok.size() || fit_predicted.size() != fit_ok.size())
      throw py::value_error("calibrator: slot out of range");
  }
  for (py::ssize_t i = 0; i < m; ++i)
    calibrated_update(ct, cs, bins, prior_weight, cal_decay, conf + i * w, d[i], a[i], fo[sl[i]], fp[sl[i]], fit_decay);
}

// One AdaptiveLength.observe_batch (adaptive.py) in one call. Per request (slots: its row in the policy's
// columns), in order: the history learns every draft of > 0 tokens; the calibrator and the request's fit
// learn from the draft whose kept confidences were stored at trim (kept_len equal to what was drafted);
// every request's stored draft is then used up (kept_len -1). Everything is checked before anything changes.
void observe_step(i64 slots, i64 drafted, i64 accepted, f64 pooled_trials, f64 pooled_successes, f64 trials,
                  f64 successes, double decay, double pooled_decay, f64 kept, i64_out kept_len, f64 cal_trials,
                  f64 cal_successes, double prior_weight, double cal_decay, f64 fit_ok, f64 fit_predicted,
                  double fit_decay) {
  const py::ssize_t m = slots.size();
  if (drafted.size() != m || accepted.size() != m) throw py::value_error("observe: one outcome per slot");
  const py::ssize_t p = pooled_trials.size(), capacity = trials.shape(0);
  double* pt = data(pooled_trials, "pooled_trials", p);
  double* ps = data(pooled_successes, "pooled_successes", p);
  if (trials.ndim() != 2 || trials.shape(1) != p) throw py::value_error("trials: expected [slots, positions]");
  double* rt = data(trials, "trials", trials.size());
  double* rs = data(successes, "successes", trials.size());
  if (kept.ndim() != 2 || kept.shape(0) != capacity || kept_len.size() != capacity || fit_ok.size() != capacity ||
      fit_predicted.size() != capacity || !kept_len.writeable())
    throw py::value_error("observe: per-request columns of different sizes, or read-only");
  const std::int64_t bins = calibrator_shape(cal_trials, cal_successes);
  const py::ssize_t positions = kept.shape(1);
  double* ct = data(cal_trials, "cal_trials", cal_trials.size());
  double* cs = data(cal_successes, "cal_successes", cal_trials.size());
  double* k = data(kept, "kept", kept.size());
  std::int64_t* kl = kept_len.mutable_data();
  double* fo = data(fit_ok, "fit_ok", capacity);
  double* fp = data(fit_predicted, "fit_predicted", capacity);
  const std::int64_t* sl = slots.data();
  const std::int64_t* d = drafted.data();
  const std::int64_t* a = accepted.data();
  for (py::ssize_t i = 0; i < m; ++i) {
    if (sl[i] < 0 || sl[i] >= capacity) throw py::value_error("observe: slot out of range");
    if (d[i] > 0) check_outcome(d[i], a[i]);
  }
  for (py::ssize_t i = 0; i < m; ++i) {
    if (d[i] <= 0) {
      kl[sl[i]] = -1;
      continue;
    }
    history_update(pt, ps, rt + sl[i] * p, rs + sl[i] * p, p, d[i], a[i], decay, pooled_decay);
    if (kl[sl[i]] == d[i] && d[i] <= positions && d[i] <= 4096)
      calibrated_update(ct, cs, bins, prior_weight, cal_decay, k + sl[i] * positions, d[i], a[i], fo[sl[i]], fp[sl[i]],
                        fit_decay);
    kl[sl[i]] = -1;
  }
}

}  // namespace

PYBIND11_MODULE(_observe, m) {
  m.doc() = "The adaptive policy's per-step observation updates (see acceptance.py and adaptive.py).";
  m.def("history_observe", &history_observe, py::arg("pooled_trials"), py::arg("pooled_successes"),
        py::arg("trials"), py::arg("successes"), py::arg("slots"), py::arg("drafted"), py::arg("accepted"),
        py::arg("decay"), py::arg("pooled_decay"));
  m.def("calibrated_observe", &calibrated_observe, py::arg("cal_trials"), py::arg("cal_successes"),
        py::arg("prior_weight"), py::arg("cal_decay"), py::arg("confidence"), py::arg("drafted"),
        py::arg("accepted"), py::arg("fit_ok"), py::arg("fit_predicted"), py::arg("slots"), py::arg("fit_decay"));
  m.def("observe_step", &observe_step, py::arg("slots"), py::arg("drafted"), py::arg("accepted"),
        py::arg("pooled_trials"), py::arg("pooled_successes"), py::arg("trials"), py::arg("successes"),
        py::arg("decay"), py::arg("pooled_decay"), py::arg("kept"), py::arg("kept_len"), py::arg("cal_trials"),
        py::arg("cal_successes"), py::arg("prior_weight"), py::arg("cal_decay"), py::arg("fit_ok"),
        py::arg("fit_predicted"), py::arg("fit_decay"));
}
