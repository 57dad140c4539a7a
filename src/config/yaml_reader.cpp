#include "config/yaml_reader.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "config/did_you_mean.h"
#include "config/hjson_text.h"
#include "config/numbers.h"
#include "tandem/core/error.h"

namespace tandem::config_detail {
namespace {

constexpr const char* kTopLevel = "(top level)";

size_t skip_bom(const std::string& text) {
  return text.compare(0, 3, "\xEF\xBB\xBF") == 0 ? 3 : 0;
}

bool blank(const std::string& text) {
  for (size_t i = skip_bom(text); i < text.size(); ++i) {
    if (!std::isspace(static_cast<unsigned char>(text[i]))) return false;
  }
  return true;
}

// Line and column (1-based) of nlohmann's error position: `byte` is the
// count of characters read, so the last one read sits at byte - 1.
std::pair<size_t, size_t> line_column(const std::string& text, size_t byte) {
  size_t end = std::min(byte, text.size());
  size_t line = 1 + static_cast<size_t>(std::count(text.begin(), text.begin() + end, '\n'));
  size_t line_start = end == 0 ? 0 : text.rfind('\n', end - 1);
  line_start = line_start == std::string::npos ? 0 : line_start + 1;
  return {line, std::max<size_t>(1, end - line_start)};
}

[[noreturn]] void fail_empty(const std::string& name) {
  TANDEM_THROW(UsageError,
               "{}:1:1: the file is empty; write a config into it (docs/config.md shows each "
               "format) or point TANDEM_CONFIG_FILE / --config_file elsewhere",
               name);
}

bool quoted(const YAML::Node& node) { return node.IsScalar() && node.Tag() == "!"; }

// How to fix a refused number. A number in quotes that would be valid bare
// gets "write it without quotes" whatever `fix` says; else `fix`, or when it
// is empty "write it without quotes" for any quoted number and `otherwise`
// for the rest.
template <typename Parse, typename T>
std::string number_fix(const YAML::Node& node, Parse parse, T min, T max, const std::string& fix,
                       const std::string& otherwise) {
  if (quoted(node)) {
    if (auto bare = parse(node.Scalar())) {
      if (*bare >= min && *bare <= max) return "write it without quotes";
      return fix.empty() ? "write it without quotes" : fix;
    }
  }
  return fix.empty() ? otherwise : fix;
}

}  // namespace

std::string mark_text(const std::string& name, const YAML::Mark& mark) {
  if (mark.line < 0) return name;
  return fmt::format("{}:{}:{}", name, mark.line + 1, mark.column + 1);
}

std::string join_path(const std::string& parent, const std::string& key) {
  return parent == kTopLevel ? key : parent + "." + key;
}

bool looks_like_json(const std::string& text) {
  // Comments before the opening brace too: a DeepSpeed file may start with one.
  const std::string json = hjson_as_json(text);
  for (size_t i = skip_bom(json); i < json.size(); ++i) {
    char c = json[i];
    if (std::isspace(static_cast<unsigned char>(c))) continue;
    return c == '{' || c == '[';
  }
  return false;
}

YAML::Node parse_document(const std::string& text, const std::string& name, bool json) {
  if (blank(text)) fail_empty(name);
  // As DeepSpeed reads it: hjson's comments and commas, written as JSON with
  // every token where it was.
  const std::string json_text = json ? hjson_as_json(text) : "";
  if (json) {
    try {
      nlohmann::json checked = nlohmann::json::parse(json_text, nullptr,
                                                     /*allow_exceptions=*/true,
                                                     /*ignore_comments=*/true);
      (void)checked;
    } catch (const nlohmann::json::parse_error& e) {
      auto [line, column] = line_column(json_text, e.byte);
      // what(): "[json.exception.parse_error.101] parse error at line 3, column 1:
      // syntax error while parsing object - unexpected end of input; expected '}'".
      std::string detail = e.what();
      size_t at = detail.find("column ");
      at = at == std::string::npos ? std::string::npos : detail.find(": ", at);
      if (at != std::string::npos) detail = detail.substr(at + 2);
      // nlohmann stops at the end for an unclosed string or bracket alike.
      bool truncated =
          detail.find("end of input") != std::string::npos || e.byte >= json_text.size();
      TANDEM_THROW(UsageError, "{}:{}:{}: malformed JSON: {}; {}", name, line, column, detail,
                   truncated ? "the text ends early (is the file truncated?): finish the last "
                               "value and close every '{' and '['"
                             : "fix the JSON at this point (keys and strings in double quotes, "
                               "one comma between values; comments and a trailing comma are "
                               "fine, as in DeepSpeed's hjson reader)");
    } catch (const nlohmann::json::out_of_range& e) {
      // A number beyond double's range (1e999): nlohmann reports no position.
      std::string detail = e.what();
      size_t at = detail.find("] ");
      if (at != std::string::npos) detail = detail.substr(at + 2);
      TANDEM_THROW(UsageError, "{}: malformed JSON: {}; write the number within +-1.7e308",
                   name, detail);
    }
  }
  YAML::Node root;
  try {
    root = YAML::Load(json ? json_text : text);
  } catch (const YAML::Exception& e) {
    TANDEM_THROW(UsageError,
                 "{}: malformed {}: {}; check the indentation, quotes and brackets here (a "
                 "truncated file fails like this too)",
                 mark_text(name, e.mark), json ? "JSON" : "YAML", e.msg);
  }
  if (root.IsNull()) fail_empty(name);  // only comments
  return root;
}

// --- Value ---------------------------------------------------------------

Value::Value(const ReadContext& ctx, YAML::Node node, YAML::Mark key_mark, std::string path)
    : ctx_(&ctx), node_(std::move(node)), key_mark_(key_mark), path_(std::move(path)) {}

Value Value::root(const ReadContext& ctx, YAML::Node node) {
  YAML::Mark mark = node.Mark();
  return Value(ctx, std::move(node), mark, kTopLevel);
}

std::string Value::where() const {
  // Not is_null(): saying where a value is does not read it.
  if (!node_.IsDefined() || node_.IsNull() || node_.Mark().line < 0) {
    return mark_text(ctx_->name, key_mark_);
  }
  return mark_text(ctx_->name, node_.Mark());
}

bool Value::is_null() const {
  mark_read();
  return !node_.IsDefined() || node_.IsNull();
}

bool Value::is_auto() const {
  mark_read();
  return node_.IsScalar() && node_.Scalar() == "auto";
}

bool Value::is_quoted() const { return quoted(node_); }

std::string Value::describe() const {
  if (is_null()) return "nothing";
  if (node_.IsMap()) return "a mapping";
  if (node_.IsSequence()) return "a list";
  const std::string& text = node_.Scalar();
  bool plain_word = !quoted(node_) && (parse_double_text(text).has_value() || text == "true" ||
                                       text == "false");
  return plain_word ? text : "\"" + text + "\"";
}

void Value::fail(const std::string& what, const std::string& fix) const {
  mark_read();
  TANDEM_THROW(UsageError, "{}: {}: {}; {}", where(), path_, what, fix);
}

bool Value::as_bool() const {
  mark_read();
  bool value = false;
  if (node_.IsScalar() && !quoted(node_) && YAML::convert<bool>::decode(node_, value)) return value;
  fail("expected true or false, got " + describe(),
       quoted(node_) ? "write it without quotes" : "set it to true or false");
}

int64_t Value::as_int(int64_t min, int64_t max, const std::string& fix) const {
  mark_read();
  std::optional<int64_t> value;
  if (node_.IsScalar() && !quoted(node_)) value = parse_integer_text(node_.Scalar());
  if (value && *value >= min && *value <= max) return *value;
  std::string range = max == std::numeric_limits<int64_t>::max()
                          ? (min == 1 ? std::string("a positive integer")
                                      : fmt::format("an integer >= {}", min))
                          : fmt::format("an integer {}..{}", min, max);
  const std::string otherwise =
      max == std::numeric_limits<int64_t>::max()
          ? fmt::format("set it to a whole number >= {} (5e8 style is fine)", min)
          : fmt::format("set it to a whole number from {} to {}", min, max);
  fail("expected " + range + ", got " + describe(),
       number_fix(node_, parse_integer_text, min, max, fix, otherwise));
}

int64_t Value::as_count() const { return as_int(1); }

uint64_t Value::as_unsigned() const {
  mark_read();
  if (node_.IsScalar() && !quoted(node_)) {
    if (auto value = parse_unsigned_text(node_.Scalar())) return *value;
  }
  fail("expected a whole number >= 0, got " + describe(),
       "set it to a whole number from 0 to 18446744073709551615");
}

double Value::as_number(double min, double max, const std::string& fix) const {
  mark_read();
  std::optional<double> value;
  if (node_.IsScalar() && !quoted(node_)) value = parse_double_text(node_.Scalar());
  if (value && *value >= min && *value <= max) return *value;
  std::string range = "a number";
  if (std::isfinite(min) && std::isfinite(max)) range = fmt::format("a number {}..{}", min, max);
  else if (std::isfinite(min)) range = fmt::format("a number >= {}", min);
  fail("expected " + range + ", got " + describe(),
       number_fix(node_, parse_double_text, min, max, fix, "set it to " + range));
}

double Value::as_positive_number() const {
  double value = as_number(0.0, std::numeric_limits<double>::infinity(),
                           "set it to a number greater than 0");
  if (value > 0) return value;
  fail("expected a number > 0, got " + describe(), "set it to a number greater than 0");
}

std::string Value::as_string() const {
  mark_read();
  if (node_.IsScalar()) return node_.Scalar();
  fail("expected a text value, got " + describe(), "write a single value after the key");
}

std::string Value::as_choice(const std::vector<std::string>& choices) const {
  mark_read();
  if (node_.IsScalar()) {
    std::string text = node_.Scalar();
    std::string lowered = text;
    for (char& c : lowered) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    for (const auto& choice : choices) {
      std::string candidate = choice;
      for (char& c : candidate) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (candidate == lowered) return choice;
    }
  }
  std::vector<std::string> quoted_choices;
  for (const auto& choice : choices) quoted_choices.push_back("\"" + choice + "\"");
  std::string guess = node_.IsScalar() ? closest_candidate(node_.Scalar(), choices) : "";
  fail("expected " + join_alternatives(quoted_choices) + ", got " + describe(),
       guess.empty() ? "set it to " + join_alternatives(quoted_choices)
                     : "did you mean \"" + guess + "\"?");
}

Value Value::child(const std::string& key) const {
  mark_read();
  if (node_.IsMap()) {
    for (auto it = node_.begin(); it != node_.end(); ++it) {
      if (it->first.IsScalar() && it->first.Scalar() == key) {
        return Value(*ctx_, it->second, it->first.Mark(), join_path(path_, key));
      }
    }
  }
  YAML::Mark here = node_.Mark().line >= 0 ? node_.Mark() : key_mark_;
  return Value(*ctx_, YAML::Node(), here, join_path(path_, key));
}

std::vector<Value> Value::elements() const {
  mark_read();
  if (!node_.IsSequence()) {
    fail("expected a list, got " + describe(), "write the elements as [a, b]");
  }
  std::vector<Value> out;
  for (size_t i = 0; i < node_.size(); ++i) {
    YAML::Node element = node_[i];
    out.emplace_back(*ctx_, element, node_.Mark(), fmt::format("{}[{}]", path_, i));
  }
  return out;
}

void Value::note_auto() const {
  mark_read();
  ctx_->config->auto_keys.insert(path_);
}

}  // namespace tandem::config_detail
