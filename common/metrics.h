// A small metrics registry rendered as Prometheus text (exposition format 0.0.4).
//
// Counters, gauges and histograms are registered once (by name and label set) and then updated
// lock-free; references returned by the registry stay valid for the registry's life. Callback
// gauges are evaluated at render time. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace mc {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Inc(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

class Gauge {
 public:
  void Set(int64_t v) { value_.store(v, std::memory_order_relaxed); }
  void Add(int64_t d) { value_.fetch_add(d, std::memory_order_relaxed); }
  int64_t Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> value_{0};
};

// Cumulative buckets with fixed upper bounds (seconds for latencies).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  uint64_t Count() const { return count_.load(std::memory_order_relaxed); }
  // Upper bounds, per-bucket (non-cumulative) counts, sum.
  const std::vector<double>& bounds() const { return bounds_; }
  uint64_t BucketCount(size_t i) const { return buckets_[i].load(std::memory_order_relaxed); }
  double Sum() const;

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1 (the +Inf bucket)
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_nanos_{0};  // sum in units of 1e-9 for lock-free accumulation
};

// Latency buckets from 50 us to 10 s.
std::vector<double> LatencyBuckets();

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  Counter& GetCounter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& GetGauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& GetHistogram(const std::string& name, const std::string& help,
                          const Labels& labels = {},
                          std::vector<double> bounds = LatencyBuckets());
  // A gauge computed when rendered; `fn` must stay callable for the registry's life.
  void AddCallbackGauge(const std::string& name, const std::string& help,
                        std::function<double()> fn, const Labels& labels = {});

  std::string RenderPrometheus() const;

  // The series of family `name` whose label sets include every pair of `match`, with their
  // values now: counters, gauges, callback gauges (evaluated here) and histograms (their
  // observation counts). Empty for an unknown family. For status pages, not hot paths.
  std::vector<std::pair<Labels, double>> Values(const std::string& name,
                                                const Labels& match = {}) const;
  // The sum of those values (0 when none).
  double Sum(const std::string& name, const Labels& match = {}) const;

 private:
  struct Family {
    std::string help;
    std::string type;  // counter | gauge | histogram
    std::map<std::string, std::unique_ptr<Counter>> counters;
    std::map<std::string, std::unique_ptr<Gauge>> gauges;
    std::map<std::string, std::unique_ptr<Histogram>> histograms;
    std::map<std::string, std::function<double()>> callbacks;
  };
  Family& FamilyLocked(const std::string& name, const std::string& help, const char* type)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mu_);
};

// Renders a label set as `{a="x",b="y"}` (empty string for none), escaping values.
std::string RenderLabels(const Labels& labels);

}  // namespace mc
