#pragma once
// The part of hjson that DeepSpeed's config files use, rewritten to JSON.
// Internal to the config layer.

#include <string>

namespace tandem::config_detail {

// DeepSpeed loads its config file with hjson (DeepSpeedConfig in
// deepspeed/runtime/config.py), which takes, besides JSON: `#`, `//` and
// `/* */` comments, a comma after the last member of an object or array, and
// a line break in place of the comma between two members or elements. This
// returns `text` with those written as JSON: comments and trailing commas
// become spaces, and a missing comma is added right after the value that ends
// its line. Every token keeps its line and column, so messages about the JSON
// point into the file as written.
//
// Everything else is left as written for the JSON parser to refuse: hjson's
// unquoted keys and strings, single quotes, multi-line strings, a root
// without braces, and what hjson refuses too (`{,}`, `[1,,2]`, two values on
// one line without a comma). An unterminated `/*` is left in place for the
// parser to report. Pure function; thread-safe.
std::string hjson_as_json(const std::string& text);

}  // namespace tandem::config_detail
