// A small thread-safe metrics registry with Prometheus text exposition (format 0.0.4): counters,
// gauges and histograms with fixed buckets, each a family of series keyed by label values.
// The server's own series are in server_metrics.h; anything else (the batching scheduler) may
// register its own families or set the ones registered there through this API.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ct::server {

enum class MetricType { kCounter, kGauge, kHistogram };

// One metric family: a name, help text, label names and one series per distinct label values.
// Every call takes the label values in the order of the label names (none for an unlabelled
// family); a wrong count throws ct::Error naming the family. All members are thread-safe.
class MetricFamily {
 public:
  virtual ~MetricFamily() = default;
  const std::string& name() const { return name_; }
  MetricType type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }

 protected:
  MetricFamily(std::string name, std::string help, MetricType type,
               std::vector<std::string> label_names);
  // Appends the family's HELP, TYPE and sample lines to out.
  virtual void render(std::string& out) const = 0;
  void check_labels(const std::vector<std::string>& values) const;
  // `{a="x",b="y"` (without the closing brace, so a histogram can add le) or "" without labels.
  std::string label_text(const std::vector<std::string>& values) const;
  void render_header(std::string& out) const;

  std::string name_, help_;
  MetricType type_;
  std::vector<std::string> label_names_;
  mutable std::mutex mu_;
  friend class MetricsRegistry;
};

class Counter final : public MetricFamily {
 public:
  // Adds `by` (>= 0; a negative step throws ct::Error: counters only go up).
  void inc(const std::vector<std::string>& labels = {}, double by = 1);
  // Sets the total of a counter kept elsewhere (a collector mirroring e.g. a tier's error
  // count). The caller keeps it monotonic.
  void set(const std::vector<std::string>& labels, double total);
  double value(const std::vector<std::string>& labels = {}) const;  // 0 for an unseen series

 private:
  using MetricFamily::MetricFamily;
  void render(std::string& out) const override;
  std::map<std::vector<std::string>, double> values_;
  friend class MetricsRegistry;
};

class Gauge final : public MetricFamily {
 public:
  void set(const std::vector<std::string>& labels, double v);
  void set(double v) { set({}, v); }
  void add(const std::vector<std::string>& labels, double by);
  double value(const std::vector<std::string>& labels = {}) const;

 private:
  using MetricFamily::MetricFamily;
  void render(std::string& out) const override;
  std::map<std::vector<std::string>, double> values_;
  friend class MetricsRegistry;
};

class Histogram final : public MetricFamily {
 public:
  struct Snapshot {
    std::vector<uint64_t> counts;  // per bucket, not cumulative; last entry is the +Inf bucket
    double sum = 0;
    uint64_t count = 0;
  };
  // A NaN observation is ignored (it would poison the sum).
  void observe(const std::vector<std::string>& labels, double v);
  void observe(double v) { observe({}, v); }
  Snapshot snapshot(const std::vector<std::string>& labels = {}) const;
  const std::vector<double>& upper_bounds() const { return bounds_; }

 private:
  Histogram(std::string name, std::string help, std::vector<std::string> label_names,
            std::vector<double> bounds);
  void render(std::string& out) const override;
  std::vector<double> bounds_;  // strictly increasing, finite; +Inf is implied
  std::map<std::vector<std::string>, Snapshot> series_;
  friend class MetricsRegistry;
};

// Families in registration order. Registering a name again returns the existing family when the
// type, label names (and buckets) agree, and throws ct::Error otherwise; names must match
// [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]* (not starting with "__"; "le" is
// reserved for histograms), buckets strictly increasing and finite. Families live as long as
// the registry; references stay valid.
class MetricsRegistry {
 public:
  Counter& counter(const std::string& name, const std::string& help,
                   std::vector<std::string> label_names = {});
  Gauge& gauge(const std::string& name, const std::string& help,
               std::vector<std::string> label_names = {});
  Histogram& histogram(const std::string& name, const std::string& help,
                       std::vector<double> upper_bounds, std::vector<std::string> label_names = {});
  // Lookup by name; null when absent or of another type.
  Counter* find_counter(const std::string& name);
  Gauge* find_gauge(const std::string& name);
  Histogram* find_histogram(const std::string& name);

  // Runs before every exposition, e.g. to copy counts kept elsewhere into a family.
  void add_collector(std::function<void()> collect);
  // The text exposition of every family (collectors run first).
  std::string exposition() const;

 private:
  MetricFamily* find(const std::string& name) const;
  template <typename T, typename Make>
  T& add(const std::string& name, MetricType type, const std::vector<std::string>& labels,
         Make make);
  mutable std::mutex mu_;  // families_ and collectors_
  std::vector<std::unique_ptr<MetricFamily>> families_;
  std::vector<std::function<void()>> collectors_;
};

// Escaping of the text format: HELP text escapes backslash and newline; label values also the
// double quote.
std::string escape_help(const std::string& s);
std::string escape_label_value(const std::string& s);
// A sample value as the format writes it: integers without a fraction, "+Inf", "-Inf", "NaN",
// otherwise the shortest text that reads back as the same double.
std::string format_metric_value(double v);

// The Content-Type of the exposition.
inline constexpr const char* kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace ct::server
