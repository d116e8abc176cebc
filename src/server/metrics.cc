// The metrics registry and its Prometheus text exposition (see metrics.h).
#include "server/metrics.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace ct::server {
namespace {

bool valid_name(const std::string& s, bool colon) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

const char* type_name(MetricType t) {
  switch (t) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

}  // namespace

std::string escape_help(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string escape_label_value(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (c == '"')
      out += "\\\"";
    else
      out += c;
  }
  return out;
}

std::string format_metric_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 9.007199254740992e15)
    return fmt::format("{}", (int64_t)v);
  return fmt::format("{}", v);  // shortest round-trip form, e.g. 0.005 or 1.5e+20
}

// ---- families --------------------------------------------------------------------------------

MetricFamily::MetricFamily(std::string name, std::string help, MetricType type,
                           std::vector<std::string> label_names)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)) {}

void MetricFamily::check_labels(const std::vector<std::string>& values) const {
  CT_THROW_IF_NOT(values.size() == label_names_.size(),
                  "metric {}: {} label values given; expected {} ({})", name_, values.size(),
                  label_names_.size(), fmt::join(label_names_, ", "));
}

std::string MetricFamily::label_text(const std::vector<std::string>& values) const {
  if (values.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) out += ',';
    out += label_names_[i] + "=\"" + escape_label_value(values[i]) + "\"";
  }
  return out;
}

void MetricFamily::render_header(std::string& out) const {
  out += "# HELP " + name_ + " " + escape_help(help_) + "\n";
  out += "# TYPE " + name_ + " " + type_name(type_) + "\n";
}

namespace {

// Sample lines of a counter or gauge family; an unlabelled family with no value yet shows 0.
void render_values(const MetricFamily& f, const std::map<std::vector<std::string>, double>& values,
                   const std::function<std::string(const std::vector<std::string>&)>& labels,
                   std::string& out) {
  if (values.empty() && f.label_names().empty()) out += f.name() + " 0\n";
  for (const auto& [key, v] : values) {
    const std::string l = labels(key);
    out += f.name() + l + (l.empty() ? "" : "}") + " " + format_metric_value(v) + "\n";
  }
}

}  // namespace

void Counter::inc(const std::vector<std::string>& labels, double by) {
  check_labels(labels);
  CT_THROW_IF_NOT(by >= 0, "counter {}: increment {}; counters only go up", name_, by);
  std::lock_guard lk(mu_);
  values_[labels] += by;
}

void Counter::set(const std::vector<std::string>& labels, double total) {
  check_labels(labels);
  std::lock_guard lk(mu_);
  values_[labels] = total;
}

double Counter::value(const std::vector<std::string>& labels) const {
  check_labels(labels);
  std::lock_guard lk(mu_);
  auto it = values_.find(labels);
  return it == values_.end() ? 0 : it->second;
}

void Counter::render(std::string& out) const {
  std::lock_guard lk(mu_);
  render_header(out);
  render_values(
      *this, values_, [this](const auto& v) { return label_text(v); }, out);
}

void Gauge::set(const std::vector<std::string>& labels, double v) {
  check_labels(labels);
  std::lock_guard lk(mu_);
  values_[labels] = v;
}

void Gauge::add(const std::vector<std::string>& labels, double by) {
  check_labels(labels);
  std::lock_guard lk(mu_);
  values_[labels] += by;
}

double Gauge::value(const std::vector<std::string>& labels) const {
  check_labels(labels);
  std::lock_guard lk(mu_);
  auto it = values_.find(labels);
  return it == values_.end() ? 0 : it->second;
}

void Gauge::render(std::string& out) const {
  std::lock_guard lk(mu_);
  render_header(out);
  render_values(
      *this, values_, [this](const auto& v) { return label_text(v); }, out);
}

Histogram::Histogram(std::string name, std::string help, std::vector<std::string> label_names,
                     std::vector<double> bounds)
    : MetricFamily(std::move(name), std::move(help), MetricType::kHistogram,
                   std::move(label_names)),
      bounds_(std::move(bounds)) {}

void Histogram::observe(const std::vector<std::string>& labels, double v) {
  check_labels(labels);
  if (std::isnan(v)) return;
  // Buckets are upper-inclusive (le): the first bound >= v.
  const size_t b = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  std::lock_guard lk(mu_);
  Snapshot& s = series_[labels];
  if (s.counts.empty()) s.counts.assign(bounds_.size() + 1, 0);
  ++s.counts[b];
  s.sum += v;
  ++s.count;
}

Histogram::Snapshot Histogram::snapshot(const std::vector<std::string>& labels) const {
  check_labels(labels);
  std::lock_guard lk(mu_);
  auto it = series_.find(labels);
  if (it != series_.end()) return it->second;
  Snapshot s;
  s.counts.assign(bounds_.size() + 1, 0);
  return s;
}

void Histogram::render(std::string& out) const {
  std::lock_guard lk(mu_);
  render_header(out);
  auto one = [&](const std::vector<std::string>& key, const Snapshot& s) {
    const std::string l = label_text(key);
    const std::string open = l.empty() ? "{" : l + ",";
    const std::string close = l.empty() ? "" : "}";
    uint64_t cum = 0;
    for (size_t i = 0; i <= bounds_.size(); ++i) {
      cum += s.counts.empty() ? 0 : s.counts[i];
      const std::string le = i < bounds_.size() ? format_metric_value(bounds_[i]) : "+Inf";
      out += name_ + "_bucket" + open + "le=\"" + le + "\"} " + std::to_string(cum) + "\n";
    }
    out += name_ + "_sum" + l + close + " " + format_metric_value(s.sum) + "\n";
    out += name_ + "_count" + l + close + " " + std::to_string(s.count) + "\n";
  };
  if (series_.empty() && label_names_.empty()) one({}, Snapshot{});
  for (const auto& [key, s] : series_) one(key, s);
}

// ---- registry --------------------------------------------------------------------------------

MetricFamily* MetricsRegistry::find(const std::string& name) const {
  for (const auto& f : families_)
    if (f->name() == name) return f.get();
  return nullptr;
}

template <typename T, typename Make>
T& MetricsRegistry::add(const std::string& name, MetricType type,
                        const std::vector<std::string>& labels, Make make) {
  CT_THROW_IF_NOT(valid_name(name, true), "metric name '{}'; expected [a-zA-Z_:][a-zA-Z0-9_:]*",
                  name);
  for (const std::string& l : labels) {
    CT_THROW_IF_NOT(valid_name(l, false) && l.rfind("__", 0) != 0,
                    "metric {}: label name '{}'; expected [a-zA-Z_][a-zA-Z0-9_]* not starting "
                    "with __",
                    name, l);
    CT_THROW_IF_NOT(!(type == MetricType::kHistogram && l == "le"),
                    "metric {}: label name 'le' is reserved for histogram buckets", name);
  }
  std::lock_guard lk(mu_);
  if (MetricFamily* f = find(name)) {
    CT_THROW_IF_NOT(f->type() == type && f->label_names() == labels,
                    "metric {} is already registered as a {} with labels ({}); asked for a {} "
                    "with labels ({})",
                    name, type_name(f->type()), fmt::join(f->label_names(), ", "), type_name(type),
                    fmt::join(labels, ", "));
    return static_cast<T&>(*f);
  }
  families_.emplace_back(make());
  return static_cast<T&>(*families_.back());
}

Counter& MetricsRegistry::counter(const std::string& name, const std::string& help,
                                  std::vector<std::string> label_names) {
  return add<Counter>(name, MetricType::kCounter, label_names,
                      [&] { return new Counter(name, help, MetricType::kCounter, label_names); });
}

Gauge& MetricsRegistry::gauge(const std::string& name, const std::string& help,
                              std::vector<std::string> label_names) {
  return add<Gauge>(name, MetricType::kGauge, label_names,
                    [&] { return new Gauge(name, help, MetricType::kGauge, label_names); });
}

Histogram& MetricsRegistry::histogram(const std::string& name, const std::string& help,
                                      std::vector<double> upper_bounds,
                                      std::vector<std::string> label_names) {
  for (size_t i = 0; i < upper_bounds.size(); ++i) {
    CT_THROW_IF_NOT(
        std::isfinite(upper_bounds[i]) && (i == 0 || upper_bounds[i] > upper_bounds[i - 1]),
        "histogram {}: bucket bound {} = {}; expected finite, strictly increasing "
        "bounds (+Inf is implied)",
        name, i, upper_bounds[i]);
  }
  Histogram& h = add<Histogram>(name, MetricType::kHistogram, label_names, [&] {
    return new Histogram(name, help, label_names, upper_bounds);
  });
  CT_THROW_IF_NOT(h.upper_bounds() == upper_bounds,
                  "histogram {} is already registered with other buckets", name);
  return h;
}

Counter* MetricsRegistry::find_counter(const std::string& name) {
  std::lock_guard lk(mu_);
  MetricFamily* f = find(name);
  return f && f->type() == MetricType::kCounter ? static_cast<Counter*>(f) : nullptr;
}

Gauge* MetricsRegistry::find_gauge(const std::string& name) {
  std::lock_guard lk(mu_);
  MetricFamily* f = find(name);
  return f && f->type() == MetricType::kGauge ? static_cast<Gauge*>(f) : nullptr;
}

Histogram* MetricsRegistry::find_histogram(const std::string& name) {
  std::lock_guard lk(mu_);
  MetricFamily* f = find(name);
  return f && f->type() == MetricType::kHistogram ? static_cast<Histogram*>(f) : nullptr;
}

void MetricsRegistry::add_collector(std::function<void()> collect) {
  std::lock_guard lk(mu_);
  collectors_.push_back(std::move(collect));
}

std::string MetricsRegistry::exposition() const {
  std::vector<std::function<void()>> collectors;
  {
    std::lock_guard lk(mu_);
    collectors = collectors_;
  }
  for (const auto& c : collectors) c();  // outside mu_: they set families of this registry
  std::string out;
  std::lock_guard lk(mu_);
  for (const auto& f : families_) f->render(out);
  return out;
}

}  // namespace ct::server
