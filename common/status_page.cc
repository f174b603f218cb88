#include "common/status_page.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace mc {
namespace {

// Inline styles only: the page must render with no network (the Content-Security-Policy below
// forbids loading anything).
constexpr char kStyle[] =
    "body{font-family:sans-serif;margin:1.5em;color:#222;background:#fafafa}"
    "h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.05em;margin:0 0 .4em}"
    ".line{font-family:monospace;font-size:.85em;background:#eee;padding:.5em;"
    "white-space:pre-wrap;word-break:break-all}"
    ".grid{display:flex;flex-wrap:wrap;gap:1em;margin:1em 0}"
    ".card{background:#fff;border:1px solid #ddd;border-radius:4px;padding:.8em;min-width:16em}"
    "table{border-collapse:collapse}td,th{padding:.15em .6em;text-align:left;vertical-align:top}"
    ".card td:last-child{text-align:right;font-family:monospace}"
    ".alert{color:#b00;font-weight:bold}.wide{background:#fff;border:1px solid #ddd;"
    "border-radius:4px;padding:.8em;margin:1em 0;overflow-x:auto}"
    ".wide th{border-bottom:1px solid #ccc}.wide td{font-family:monospace}"
    ".foot{color:#777;font-size:.8em}";

std::string FormatNumber(double v) {
  if (std::isnan(v)) return "-";
  if (std::fabs(v) < 9e15 && v == std::floor(v)) {
    return absl::StrCat(static_cast<int64_t>(v));
  }
  return absl::StrFormat("%.4g", v);
}

std::string LabelValue(const Labels& labels, const std::string& key) {
  for (const auto& [k, v] : labels) {
    if (k == key) return v;
  }
  return "";
}

}  // namespace

std::string HtmlEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        if ((static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') || c == 0x7f) {
          out += "\xEF\xBF\xBD";  // U+FFFD
        } else {
          out.push_back(c);
        }
    }
  }
  return out;
}

std::string RenderStatusPageHtml(const StatusPage& page) {
  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
      "style-src 'unsafe-inline'; img-src 'none'; base-uri 'none'; form-action 'none'\">"
      "<meta name=\"viewport\" content=\"width=device-width\">";
  if (page.refresh_seconds > 0) {
    absl::StrAppend(&out, "<meta http-equiv=\"refresh\" content=\"", page.refresh_seconds, "\">");
  }
  absl::StrAppend(&out, "<title>", HtmlEscape(page.title), "</title><style>", kStyle,
                  "</style></head><body>\n<h1>", HtmlEscape(page.title), "</h1>\n");
  if (!page.status_line.empty()) {
    absl::StrAppend(&out, "<div class=\"line\" id=\"status-line\">", HtmlEscape(page.status_line),
                    "</div>\n");
  }
  out += "<div class=\"grid\">\n";
  for (const StatusPage::Section& section : page.sections) {
    absl::StrAppend(&out, "<div class=\"card\"><h2>", HtmlEscape(section.title), "</h2><table>\n");
    for (const StatusPage::Row& row : section.rows) {
      absl::StrAppend(&out, "<tr", row.alert ? " class=\"alert\"" : "", "><td>",
                      HtmlEscape(row.label), "</td><td>", HtmlEscape(row.value), "</td></tr>\n");
    }
    out += "</table></div>\n";
  }
  out += "</div>\n";
  for (const StatusPage::Table& table : page.tables) {
    absl::StrAppend(&out, "<div class=\"wide\"><h2>", HtmlEscape(table.title),
                    "</h2><table>\n<tr>");
    for (const std::string& column : table.columns) {
      absl::StrAppend(&out, "<th>", HtmlEscape(column), "</th>");
    }
    out += "</tr>\n";
    for (const std::vector<std::string>& row : table.rows) {
      out += "<tr>";
      for (const std::string& cell : row) absl::StrAppend(&out, "<td>", HtmlEscape(cell), "</td>");
      out += "</tr>\n";
    }
    if (table.rows.empty()) {
      absl::StrAppend(&out, "<tr><td colspan=\"", std::max<size_t>(table.columns.size(), 1),
                      "\">none</td></tr>\n");
    }
    out += "</table>";
    if (table.omitted > 0) {
      absl::StrAppend(&out, "<p>... and ", table.omitted, " more</p>");
    }
    out += "</div>\n";
  }
  out +=
      "<p class=\"foot\">Plain text: <a href=\"/status\">/status</a>, "
      "<a href=\"/metrics\">/metrics</a>, <a href=\"/healthz\">/healthz</a>.</p>\n"
      "</body></html>\n";
  return out;
}

std::vector<StatusPage::Row> StatusLineRows(std::string_view line) {
  std::vector<StatusPage::Row> rows;
  while (!line.empty()) {
    size_t bar = line.find(" | ");
    std::string_view part = line.substr(0, bar);
    line = bar == std::string_view::npos ? std::string_view() : line.substr(bar + 3);
    const size_t colon = part.find(": ");
    if (colon != std::string_view::npos) {
      rows.push_back({std::string(part.substr(0, colon)), std::string(part.substr(colon + 2))});
    } else {
      const size_t space = part.find(' ');
      rows.push_back({std::string(part.substr(0, space)),
                      space == std::string_view::npos ? "" : std::string(part.substr(space + 1))});
    }
  }
  return rows;
}

std::string MetricValue(const MetricsRegistry& registry, const std::string& name,
                        const Labels& match) {
  return FormatNumber(registry.Sum(name, match));
}

void AddMetricBreakdown(StatusPage::Section& section, const MetricsRegistry& registry,
                        const std::string& title, const std::string& name, const std::string& label,
                        bool alert_if_nonzero, const Labels& match) {
  const auto values = registry.Values(name, match);
  double total = 0;
  for (const auto& [labels, value] : values) total += value;
  section.rows.push_back({title, FormatNumber(total), alert_if_nonzero && total > 0});
  for (const auto& [labels, value] : values) {
    if (value == 0) continue;
    section.rows.push_back(
        {absl::StrCat("  ", LabelValue(labels, label)), FormatNumber(value), alert_if_nonzero});
  }
}

}  // namespace mc
