#include "common/metrics.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace mc {
namespace {

std::string Escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

std::string FormatDouble(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return absl::StrFormat("%.17g", v);
}

// Inserts an extra label into a rendered label set.
std::string WithLabel(const std::string& rendered, const std::string& extra) {
  if (rendered.empty()) return "{" + extra + "}";
  return rendered.substr(0, rendered.size() - 1) + "," + extra + "}";
}

// The labels of a set rendered by RenderLabels (its escapes undone).
Labels ParseRenderedLabels(const std::string& rendered) {
  Labels out;
  size_t i = 1;  // past '{'
  while (i < rendered.size() && rendered[i] != '}') {
    const size_t eq = rendered.find("=\"", i);
    if (eq == std::string::npos) break;
    std::string key = rendered.substr(i, eq - i);
    std::string value;
    size_t j = eq + 2;
    for (; j < rendered.size() && rendered[j] != '"'; ++j) {
      if (rendered[j] == '\\' && j + 1 < rendered.size()) {
        ++j;
        value.push_back(rendered[j] == 'n' ? '\n' : rendered[j]);
      } else {
        value.push_back(rendered[j]);
      }
    }
    out.emplace_back(std::move(key), std::move(value));
    i = j + 1;
    if (i < rendered.size() && rendered[i] == ',') ++i;
  }
  return out;
}

bool Includes(const Labels& labels, const Labels& match) {
  return std::all_of(match.begin(), match.end(), [&](const auto& m) {
    return std::find(labels.begin(), labels.end(), m) != labels.end();
  });
}

}  // namespace

std::string RenderLabels(const Labels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i > 0) out += ",";
    absl::StrAppend(&out, labels[i].first, "=\"", Escape(labels[i].second), "\"");
  }
  return out + "}";
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double value) {
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  if (value > 0) {
    sum_nanos_.fetch_add(static_cast<uint64_t>(value * 1e9), std::memory_order_relaxed);
  }
}

double Histogram::Sum() const { return sum_nanos_.load(std::memory_order_relaxed) / 1e9; }

std::vector<double> LatencyBuckets() {
  return {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
          0.025,   0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   5.0, 10.0};
}

MetricsRegistry::Family& MetricsRegistry::FamilyLocked(const std::string& name,
                                                       const std::string& help,
                                                       const char* type) {
  Family& family = families_[name];
  if (family.type.empty()) {
    family.help = help;
    family.type = type;
  }
  return family;
}

Counter& MetricsRegistry::GetCounter(const std::string& name, const std::string& help,
                                     const Labels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot = FamilyLocked(name, help, "counter").counters[RenderLabels(labels)];
  if (!slot) slot = std::make_unique<Counter>();
  return *slot;
}

Gauge& MetricsRegistry::GetGauge(const std::string& name, const std::string& help,
                                 const Labels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot = FamilyLocked(name, help, "gauge").gauges[RenderLabels(labels)];
  if (!slot) slot = std::make_unique<Gauge>();
  return *slot;
}

Histogram& MetricsRegistry::GetHistogram(const std::string& name, const std::string& help,
                                         const Labels& labels, std::vector<double> bounds) {
  absl::MutexLock lock(&mu_);
  auto& slot = FamilyLocked(name, help, "histogram").histograms[RenderLabels(labels)];
  if (!slot) slot = std::make_unique<Histogram>(std::move(bounds));
  return *slot;
}

void MetricsRegistry::AddCallbackGauge(const std::string& name, const std::string& help,
                                       std::function<double()> fn, const Labels& labels) {
  absl::MutexLock lock(&mu_);
  FamilyLocked(name, help, "gauge").callbacks[RenderLabels(labels)] = std::move(fn);
}

std::string MetricsRegistry::RenderPrometheus() const {
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& [name, family] : families_) {
    absl::StrAppend(&out, "# HELP ", name, " ", family.help, "\n# TYPE ", name, " ", family.type,
                    "\n");
    for (const auto& [labels, c] : family.counters) {
      absl::StrAppend(&out, name, labels, " ", c->Value(), "\n");
    }
    for (const auto& [labels, g] : family.gauges) {
      absl::StrAppend(&out, name, labels, " ", g->Value(), "\n");
    }
    for (const auto& [labels, fn] : family.callbacks) {
      absl::StrAppend(&out, name, labels, " ", FormatDouble(fn()), "\n");
    }
    for (const auto& [labels, h] : family.histograms) {
      uint64_t cumulative = 0;
      for (size_t i = 0; i <= h->bounds().size(); ++i) {
        cumulative += h->BucketCount(i);
        double le = i < h->bounds().size() ? h->bounds()[i] : INFINITY;
        absl::StrAppend(&out, name, "_bucket", WithLabel(labels, "le=\"" + FormatDouble(le) + "\""),
                        " ", cumulative, "\n");
      }
      absl::StrAppend(&out, name, "_sum", labels, " ", FormatDouble(h->Sum()), "\n");
      absl::StrAppend(&out, name, "_count", labels, " ", cumulative, "\n");
    }
  }
  return out;
}

std::vector<std::pair<Labels, double>> MetricsRegistry::Values(const std::string& name,
                                                               const Labels& match) const {
  std::vector<std::pair<Labels, double>> out;
  absl::MutexLock lock(&mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return out;
  const Family& family = it->second;
  auto add = [&](const std::string& rendered, double value) {
    Labels labels = ParseRenderedLabels(rendered);
    if (Includes(labels, match)) out.emplace_back(std::move(labels), value);
  };
  for (const auto& [labels, c] : family.counters) add(labels, static_cast<double>(c->Value()));
  for (const auto& [labels, g] : family.gauges) add(labels, static_cast<double>(g->Value()));
  for (const auto& [labels, fn] : family.callbacks) add(labels, fn());
  for (const auto& [labels, h] : family.histograms) add(labels, static_cast<double>(h->Count()));
  return out;
}

double MetricsRegistry::Sum(const std::string& name, const Labels& match) const {
  double sum = 0;
  for (const auto& [labels, value] : Values(name, match)) sum += value;
  return sum;
}

}  // namespace mc
