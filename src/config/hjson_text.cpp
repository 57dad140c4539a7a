// hjson_as_json(): DeepSpeed's hjson comments and commas, written as JSON in
// place (hjson_text.h).
//
// Checked against hjson 3.1, the reader DeepSpeed 0.19.8 uses: it accepts
// `{"a": 1,}`, `[1, 2,]`, `{"a": 1 # c` + newline + `}`, and members or
// elements on separate lines without commas; it refuses `{,}`, `[1,,2]` and
// `{"a": 1 "b": 2}`, which stay malformed here. tests/config/conformance.py
// reads the corpus's hjson files with DeepSpeed itself.

#include "config/hjson_text.h"

#include <cctype>

namespace tandem::config_detail {
namespace {

// The last character of a complete JSON value: a closing quote (an opening
// one is never recorded), a closing bracket, a number's last digit, or the
// last letter of true, false or null.
bool ends_value(char c) {
  return c == '"' || c == '}' || c == ']' || std::isdigit(static_cast<unsigned char>(c)) ||
         c == 'e' || c == 'l';
}

// The first character of a JSON value or of an object's key.
bool starts_value(char c) {
  return c == '"' || c == '{' || c == '[' || c == '-' ||
         std::isdigit(static_cast<unsigned char>(c)) || c == 't' || c == 'f' || c == 'n';
}

}  // namespace

std::string hjson_as_json(const std::string& text) {
  constexpr size_t kNone = std::string::npos;
  std::string out;
  out.reserve(text.size() + 16);
  bool in_string = false;
  char last = '\0';          // the last significant character outside strings
  size_t last_at = kNone;    // where it is in `out`
  size_t comma_at = kNone;   // a comma after a value: trailing if a bracket follows
  bool line_break = false;   // a line break since `last`
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    const char next = i + 1 < text.size() ? text[i + 1] : '\0';
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) {
        out += text[++i];
      } else if (c == '"') {
        in_string = false;
        last = '"';
        last_at = out.size() - 1;
        line_break = false;
      }
      continue;
    }
    if (c == '#' || (c == '/' && next == '/')) {
      for (; i < text.size() && text[i] != '\n'; ++i) out += ' ';
      --i;  // the line break is whitespace, handled below
      continue;
    }
    if (c == '/' && next == '*') {
      const size_t stop = text.find("*/", i + 2);
      if (stop == kNone) {  // unterminated: the JSON parser says so
        out.append(text, i, kNone);
        break;
      }
      for (; i < stop + 2; ++i) {
        out += text[i] == '\n' ? '\n' : ' ';
        line_break = line_break || text[i] == '\n';
      }
      --i;
      continue;
    }
    if (std::isspace(static_cast<unsigned char>(c))) {
      out += c;
      line_break = line_break || c == '\n';
      continue;
    }
    if ((c == '}' || c == ']') && comma_at != kNone) {
      out[comma_at] = ' ';
    } else if (comma_at == kNone && line_break && ends_value(last) && starts_value(c)) {
      // Right after the value, where only spaces and blanked comments
      // follow on its line: no token moves.
      out.insert(last_at + 1, 1, ',');
    }
    comma_at = c == ',' && ends_value(last) ? out.size() : kNone;
    out += c;
    in_string = c == '"';
    last = in_string ? '\0' : c;
    last_at = out.size() - 1;
    line_break = false;
  }
  return out;
}

}  // namespace tandem::config_detail
