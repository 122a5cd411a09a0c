#include "apps/plot.h"

#include <cairo-svg.h>
#include <cairo.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>

#include "troupe/error.h"

namespace troupe::apps {
namespace {

struct Rgb {
  double r, g, b;
};
// Matplotlib's tab10, the colours ML plots are read in.
constexpr Rgb kPalette[] = {{0.12, 0.47, 0.71}, {1.00, 0.50, 0.05}, {0.17, 0.63, 0.17},
                            {0.84, 0.15, 0.16}, {0.58, 0.40, 0.74}, {0.55, 0.34, 0.29},
                            {0.89, 0.47, 0.76}, {0.50, 0.50, 0.50}, {0.74, 0.74, 0.13},
                            {0.09, 0.75, 0.81}};
constexpr const char* kFont = "DejaVu Sans";

// A metric of a log row, or NaN where the row has none (no test set: test_accuracy -1).
using Metric = std::function<double(const actors::LogRow&)>;

struct Series {
  Metric y;
  bool dashed = false;
};

struct Panel {
  std::string title;
  std::string y_label;
  std::vector<Series> series;
};

// The wall-time axis in seconds, minutes or hours, whichever keeps its numbers short.
struct TimeUnit {
  double seconds;
  const char* name;
};
TimeUnit timeUnit(double longest_seconds) {
  if (longest_seconds <= 120) return {1, "s"};
  if (longest_seconds <= 2 * 3600) return {60, "min"};
  return {3600, "h"};
}

std::string tickText(double v, double step) {
  if (std::abs(v) >= 1e5) return fmt::format("{:.0f}k", v / 1e3);
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  return fmt::format("{:.{}f}", v, decimals);
}

class Canvas {
 public:
  Canvas(const PlotOptions& o) : options_(o) {
    const auto dot = o.output.rfind('.');
    const std::string ext = dot == std::string::npos ? "" : o.output.substr(dot);
    if (ext == ".svg") {
      surface_ = cairo_svg_surface_create(o.output.c_str(), o.width, o.height);
    } else if (ext == ".png") {
      surface_ = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, o.width, o.height);
      png_ = true;
    } else {
      throw InputError(fmt::format(
          "-o {}: the plot is written as .svg or .png (by the name's ending)", o.output));
    }
    cr_ = cairo_create(surface_);
    cairo_set_source_rgb(cr_, 1, 1, 1);
    cairo_paint(cr_);
    cairo_select_font_face(cr_, kFont, CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  }
  ~Canvas() {
    if (cr_) cairo_destroy(cr_);
    if (surface_) cairo_surface_destroy(surface_);
  }
  Canvas(const Canvas&) = delete;
  Canvas& operator=(const Canvas&) = delete;

  cairo_t* cr() { return cr_; }

  void text(double x, double y, const std::string& s, double size, double align = 0,
            bool bold = false, double angle = 0) {
    cairo_save(cr_);
    cairo_select_font_face(cr_, kFont, CAIRO_FONT_SLANT_NORMAL,
                           bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr_, size);
    cairo_text_extents_t e;
    cairo_text_extents(cr_, s.c_str(), &e);
    cairo_translate(cr_, x, y);
    cairo_rotate(cr_, angle);
    cairo_move_to(cr_, -align * e.x_advance, 0);
    cairo_set_source_rgb(cr_, 0.1, 0.1, 0.1);
    cairo_show_text(cr_, s.c_str());
    cairo_restore(cr_);
  }

  double textWidth(const std::string& s, double size) {
    cairo_save(cr_);
    cairo_set_font_size(cr_, size);
    cairo_text_extents_t e;
    cairo_text_extents(cr_, s.c_str(), &e);
    cairo_restore(cr_);
    return e.x_advance;
  }

  // Writes the file; IoError naming it when cairo cannot.
  void finish() {
    cairo_destroy(cr_);
    cr_ = nullptr;
    cairo_status_t status = CAIRO_STATUS_SUCCESS;
    if (png_) {
      status = cairo_surface_write_to_png(surface_, options_.output.c_str());
    } else {
      cairo_surface_finish(surface_);
      status = cairo_surface_status(surface_);
    }
    if (status != CAIRO_STATUS_SUCCESS) {
      throw IoError(fmt::format("cannot write the plot '{}': {}", options_.output,
                                cairo_status_to_string(status)));
    }
  }

 private:
  const PlotOptions& options_;
  cairo_surface_t* surface_ = nullptr;
  cairo_t* cr_ = nullptr;
  bool png_ = false;
};

struct Box {
  double x, y, w, h;
};

struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (!std::isfinite(v)) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return lo > hi; }
  // Widened to round ticks; a single value gets room around it.
  std::vector<double> ticks(int target) {
    if (empty()) lo = 0, hi = 1;
    if (hi - lo < 1e-12 * std::max(1.0, std::abs(hi))) {
      const double pad = std::max(std::abs(hi) * 0.05, 1e-3);
      lo -= pad;
      hi += pad;
    }
    auto t = niceTicks(lo, hi, target);
    lo = t.front();
    hi = t.back();
    return t;
  }
};

// One panel: axes, grid, ticks and the runs' lines with a dot at every epoch.
void drawPanel(Canvas& canvas, const Box& box, const Panel& panel,
               const std::vector<TrainLogFile>& logs,
               const std::function<double(const actors::LogRow&)>& x_of,
               const std::string& x_label) {
  auto* cr = canvas.cr();
  Range xr, yr;
  for (const auto& log : logs) {
    for (const auto& row : log.rows) {
      xr.add(x_of(row));
      for (const auto& s : panel.series)
        yr.add(s.y(row));
    }
  }
  if (xr.lo > 0) xr.add(0);  // epochs and time start at 0
  const auto xt = xr.ticks(6);
  const auto yt = yr.ticks(5);
  auto px = [&](double v) { return box.x + (v - xr.lo) / (xr.hi - xr.lo) * box.w; };
  auto py = [&](double v) { return box.y + box.h - (v - yr.lo) / (yr.hi - yr.lo) * box.h; };

  cairo_set_line_width(cr, 1);
  cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
  for (double v : xt) {
    cairo_move_to(cr, px(v), box.y);
    cairo_line_to(cr, px(v), box.y + box.h);
  }
  for (double v : yt) {
    cairo_move_to(cr, box.x, py(v));
    cairo_line_to(cr, box.x + box.w, py(v));
  }
  cairo_stroke(cr);
  cairo_set_source_rgb(cr, 0.3, 0.3, 0.3);
  cairo_rectangle(cr, box.x, box.y, box.w, box.h);
  cairo_stroke(cr);
  const double xstep = xt.size() > 1 ? xt[1] - xt[0] : 1, ystep = yt.size() > 1 ? yt[1] - yt[0] : 1;
  for (double v : xt)
    canvas.text(px(v), box.y + box.h + 15, tickText(v, xstep), 11, 0.5);
  for (double v : yt)
    canvas.text(box.x - 6, py(v) + 4, tickText(v, ystep), 11, 1);
  canvas.text(box.x + box.w / 2, box.y - 8, panel.title, 13, 0.5, true);
  canvas.text(box.x + box.w / 2, box.y + box.h + 32, x_label, 11, 0.5);
  canvas.text(box.x - 48, box.y + box.h / 2, panel.y_label, 11, 0.5, false, -M_PI / 2);

  cairo_save(cr);
  cairo_rectangle(cr, box.x - 4, box.y - 4, box.w + 8, box.h + 8);  // dots on the edge stay whole
  cairo_clip(cr);
  for (std::size_t i = 0; i < logs.size(); ++i) {
    const Rgb c = kPalette[i % std::size(kPalette)];
    cairo_set_source_rgb(cr, c.r, c.g, c.b);
    for (const auto& s : panel.series) {
      const double dash[] = {6, 4};
      cairo_set_dash(cr, dash, s.dashed ? 2 : 0, 0);
      cairo_set_line_width(cr, 2);
      bool drawing = false;
      for (const auto& row : logs[i].rows) {
        const double x = x_of(row), y = s.y(row);
        if (!std::isfinite(x) || !std::isfinite(y)) {
          drawing = false;
          continue;
        }
        drawing ? cairo_line_to(cr, px(x), py(y)) : cairo_move_to(cr, px(x), py(y));
        drawing = true;
      }
      cairo_stroke(cr);
      cairo_set_dash(cr, dash, 0, 0);
      for (const auto& row : logs[i].rows) {
        const double x = x_of(row), y = s.y(row);
        if (!std::isfinite(x) || !std::isfinite(y)) continue;
        cairo_arc(cr, px(x), py(y), 2.5, 0, 2 * M_PI);
        cairo_fill(cr);
      }
    }
  }
  cairo_restore(cr);
}

// The runs' colours and labels in rows across the top, and what the line styles mean.
double drawLegend(Canvas& canvas, const std::vector<std::string>& labels, double top,
                  double width) {
  auto* cr = canvas.cr();
  double x = 70, y = top;
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const double w = 34 + canvas.textWidth(labels[i], 12) + 24;
    if (x + w > width - 20 && x > 70) {
      x = 70;
      y += 20;
    }
    const Rgb c = kPalette[i % std::size(kPalette)];
    cairo_set_source_rgb(cr, c.r, c.g, c.b);
    cairo_set_line_width(cr, 3);
    cairo_move_to(cr, x, y - 4);
    cairo_line_to(cr, x + 26, y - 4);
    cairo_stroke(cr);
    canvas.text(x + 32, y, labels[i], 12);
    x += w;
  }
  canvas.text(width - 20, top, "accuracy: dashed train, solid test", 11, 1);
  return y + 14;
}

}  // namespace

std::vector<double> niceTicks(double lo, double hi, int target) {
  TROUPE_ENFORCE(hi > lo && target > 0, "niceTicks(", lo, ", ", hi, ", ", target, ")");
  const double raw = (hi - lo) / target;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (const double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * power;
    if (step >= raw) break;
  }
  std::vector<double> ticks;
  const double first = std::floor(lo / step + 1e-9) * step;
  for (double v = first; v < hi + step * (1 - 1e-9); v += step)
    ticks.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  return ticks;
}

void plotLogs(const std::vector<TrainLogFile>& logs, const std::vector<std::string>& labels,
              const PlotOptions& o) {
  TROUPE_ENFORCE_EQ(logs.size(), labels.size());
  for (const auto& log : logs) {
    if (log.rows.empty()) throw InputError(fmt::format("'{}' has no epochs to plot", log.path));
  }
  Canvas canvas(o);
  const std::string title = !o.title.empty() ? o.title
                                             : fmt::format("troupe training: {} run{}", logs.size(),
                                                           logs.size() == 1 ? "" : "s");
  canvas.text(o.width / 2.0, 28, title, 18, 0.5, true);
  const double legend_bottom = drawLegend(canvas, labels, 56, o.width);

  double longest = 0;
  for (const auto& log : logs)
    longest = std::max(longest, log.rows.back().cumulative_time_spent);
  const TimeUnit unit = timeUnit(longest);
  const auto nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<Panel> panels = {
      {"loss",
       "loss",
       {{[](const actors::LogRow& r) { return r.loss; }, true},
        {[nan](const actors::LogRow& r) { return r.test_loss < 0 ? nan : r.test_loss; }}}},
      {"accuracy",
       "accuracy",
       {{[](const actors::LogRow& r) { return r.accuracy; }, true},
        {[nan](const actors::LogRow& r) { return r.test_accuracy < 0 ? nan : r.test_accuracy; }}}},
      {"throughput", "inputs/s", {{[](const actors::LogRow& r) { return r.inputs_per_sec; }}}},
  };
  const Metric by_epoch = [](const actors::LogRow& r) { return static_cast<double>(r.epoch); };
  const Metric by_time = [unit](const actors::LogRow& r) {
    return r.cumulative_time_spent / unit.seconds;
  };
  const double top = legend_bottom + 30, left = 80, gap_x = 90, gap_y = 75, bottom = 50;
  const double w = (o.width - left - gap_x - 30) / 2;
  const double h = (o.height - top - bottom - 2 * gap_y) / 3;
  for (std::size_t p = 0; p < panels.size(); ++p) {
    const double y = top + static_cast<double>(p) * (h + gap_y);
    drawPanel(canvas, {left, y, w, h}, panels[p], logs, by_epoch, "epoch");
    drawPanel(canvas, {left + w + gap_x, y, w, h}, panels[p], logs, by_time,
              fmt::format("wall time ({})", unit.name));
  }
  canvas.finish();
}

}  // namespace troupe::apps
