// One step's verification results into the adaptive policy's estimators (acceptance.py, adaptive.py), in
// one call: the observations are applied one at a time, in order, exactly as the per-request updates do
// (decay everything, then count what this draft tried and got accepted), without a numpy call per step
// of the way. The arrays are the estimators' own and are updated in place.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace py = pybind11;

namespace {

using f64 = py::array_t<double, py::array::c_style>;
using i64 = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>;

void check_outcome(std::int64_t drafted, std::int64_t accepted) {
  if (accepted < 0 || accepted > drafted)
    throw py::value_error("observation: expected 0 <= accepted <= drafted, got accepted=" + std::to_string(accepted) +
                          ", drafted=" + std::to_string(drafted));
}

double* data(f64& a, const char* what, py::ssize_t size) {
  if (a.size() != size) throw py::value_error(std::string(what) + ": wrong size");
  return a.mutable_data();
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
  for (py::ssize_t i = 0; i < m; ++i) {
    if (d[i] <= 0) continue;
    const std::int64_t tried = std::min<std::int64_t>(std::min(a[i] + 1, d[i]), p), ok = std::min<std::int64_t>(a[i], p);
    double* t = rt + sl[i] * p;
    double* s = rs + sl[i] * p;
    for (py::ssize_t j = 0; j < p; ++j) {
      pt[j] *= pooled_decay;
      ps[j] *= pooled_decay;
      t[j] *= decay;
      s[j] *= decay;
    }
    for (std::int64_t j = 0; j < tried; ++j) pt[j] += 1.0, t[j] += 1.0;
    for (std::int64_t j = 0; j < ok; ++j) ps[j] += 1.0, s[j] += 1.0;
  }
}

// numpy's sum of a short contiguous float64 array (pairwise_sum below 128 elements), so a predicted
// count here equals np.sum of the same values.
double numpy_sum(const double* x, std::int64_t n) {
  if (n < 8) {
    double r = 0.0;
    for (std::int64_t i = 0; i < n; ++i) r += x[i];
    return r;
  }
  double r[8];
  for (int k = 0; k < 8; ++k) r[k] = x[k];
  std::int64_t i = 8;
  for (; i < n - (n % 8); i += 8)
    for (int k = 0; k < 8; ++k) r[k] += x[i + k];
  double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
  for (; i < n; ++i) res += x[i];
  return res;
}

int bucket(std::int64_t j) {  // acceptance.position_bucket: 0, 1, 2-3, 4-7, 8+
  if (j == 0) return 0;
  int b = 1;
  while (b < 4 && (std::int64_t(1) << b) <= j) ++b;
  return b;
}

// The adaptive policy's learning from kept confidences: for each verified draft in order, its predicted
// accepted count under the calibration so far, the request's decayed (accepted, predicted) fit, then
// the calibrator's own update.
void calibrated_observe(f64 cal_trials, f64 cal_successes, double prior_weight, double cal_decay, f64 confidence,
                        i64 drafted, i64 accepted, f64 fit_ok, f64 fit_predicted, i64 slots, double fit_decay) {
  if (cal_trials.ndim() != 2 || cal_trials.shape(0) != 5) throw py::value_error("calibrator: expected [5, bins]");
  const py::ssize_t bins = cal_trials.shape(1);
  double* ct = data(cal_trials, "cal_trials", 5 * bins);
  double* cs = data(cal_successes, "cal_successes", 5 * bins);
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
  double calibrated[4096];
  std::int64_t cell[4096];
  for (py::ssize_t i = 0; i < m; ++i) {
    const std::int64_t n = d[i];
    const double* c = conf + i * w;
    const std::int64_t tried = std::min(a[i] + 1, n);
    for (std::int64_t j = 0; j < n; ++j) {
      const double x = std::min(1.0, std::max(0.0, c[j]));
      const std::int64_t b = std::min<std::int64_t>(std::int64_t(x * double(bins)), bins - 1);
      cell[j] = bucket(j) * bins + b;
      calibrated[j] = (cs[cell[j]] + prior_weight * x) / (ct[cell[j]] + prior_weight);
    }
    const double predicted = numpy_sum(calibrated, tried);
    fo[sl[i]] = fit_decay * fo[sl[i]] + double(a[i]);
    fp[sl[i]] = fit_decay * fp[sl[i]] + predicted;
    for (py::ssize_t k = 0; k < 5 * bins; ++k) {
      ct[k] *= cal_decay;
      cs[k] *= cal_decay;
    }
    for (std::int64_t j = 0; j < tried; ++j) ct[cell[j]] += 1.0;
    for (std::int64_t j = 0; j < a[i]; ++j) cs[cell[j]] += 1.0;
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
}
