#pragma once
// Config text to position-carrying YAML nodes, and typed reads of them that
// fail with "FILE:LINE:COL: key.path: what is wrong; how to fix".
//
// JSON is read through yaml-cpp too (JSON is YAML's flow syntax), so both
// formats give every key and value a line and column. Internal to the config
// layer; not thread-safe (a Value writes into its ReadContext's Config).

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "tandem/config/config.h"

namespace tandem::config_detail {

// True when the first significant character is '{' or '[': the text is
// JSON (DeepSpeed, or an Accelerate config saved as JSON).
bool looks_like_json(const std::string& text);

// Parses `text` into nodes. JSON is checked by nlohmann first, for exact
// syntax errors (and // or /* */ comments, which DeepSpeed's hjson allows),
// then read by yaml-cpp for positions. Throws UsageError
// "NAME:LINE:COL: malformed JSON|YAML: ...; fix" on bad syntax (truncated
// text included) and "NAME:1:1: the file is empty; ..." when there is
// nothing but whitespace or comments.
YAML::Node parse_document(const std::string& text, const std::string& name, bool json);

// Where reads go: the name used in messages and the Config that collects
// warnings, auto keys and key locations.
struct ReadContext {
  std::string name;
  Config* config = nullptr;
};

// One node being read, with its key path ("zero_optimization.stage").
class Value {
 public:
  // `key_mark` locates messages about a null value, whose own mark is not
  // useful (yaml-cpp puts it at the next token).
  Value(const ReadContext& ctx, YAML::Node node, YAML::Mark key_mark, std::string path);

  // The whole document (path "(top level)").
  static Value root(const ReadContext& ctx, YAML::Node node);

  const std::string& path() const { return path_; }
  const YAML::Node& node() const { return node_; }
  const ReadContext& context() const { return *ctx_; }
  // "NAME:LINE:COL" (1-based).
  std::string where() const;

  bool is_null() const;
  bool is_auto() const;  // the string "auto", quoted or not
  bool is_quoted() const;  // a scalar written in quotes ('NO', "32")
  bool is_map() const { return node_.IsMap(); }
  // How the value reads in a message: 7, "three", a mapping, a list, nothing.
  std::string describe() const;

  // Throws UsageError "WHERE: PATH: what; fix".
  [[noreturn]] void fail(const std::string& what, const std::string& fix) const;

  // true/false (YAML's yes/no/on/off too); quoted text is refused.
  bool as_bool() const;
  // A whole number in [min, max]; 5e8 and 5.0e8 count as whole numbers.
  // An empty `fix` gives "set it to a whole number from MIN to MAX".
  int64_t as_int(int64_t min, int64_t max = std::numeric_limits<int64_t>::max(),
                 const std::string& fix = "") const;
  // A whole number >= 1.
  int64_t as_count() const;
  // A whole number 0..2^64-1 (seeds).
  uint64_t as_unsigned() const;
  // A finite number in [min, max].
  double as_number(double min = -std::numeric_limits<double>::infinity(),
                   double max = std::numeric_limits<double>::infinity(),
                   const std::string& fix = "") const;
  // A finite number > 0.
  double as_positive_number() const;
  // Any scalar, as written.
  std::string as_string() const;
  // One of `choices`, any case; returns the canonical spelling. A wrong
  // value fails with a did-you-mean.
  std::string as_choice(const std::vector<std::string>& choices) const;

  // The entry `key` of this mapping; a null Value (is_null()) when absent.
  Value child(const std::string& key) const;
  // The elements of a list; fails when this is not a list.
  std::vector<Value> elements() const;

  // Adds "WHERE: 'PATH' is accepted but not implemented yet; it has no
  // effect" to Config::warnings.
  void warn_not_implemented() const;
  // Records path() in Config::auto_keys.
  void note_auto() const;

 private:
  const ReadContext* ctx_;
  YAML::Node node_;
  YAML::Mark key_mark_;
  std::string path_;
};

// The keys valid at one level of a mapping.
struct KeyTable {
  std::vector<std::string> read;     // handled by the visitor
  std::vector<std::string> warned;   // recognised, not implemented: one warning each
  std::vector<std::string> ignored;  // meaningless to tandem: accepted silently
  std::vector<std::string> ignored_prefixes;  // e.g. Accelerate's "tpu_"
};

// Hint added to the message for an unknown key, given the key; "" for none.
using UnknownKeyHint = std::function<std::string(const std::string& key)>;

// Checks that `map` is a mapping (or null, which has no keys) and visits its
// entries in file order: a `read` key goes to `visit` (after its location is
// recorded when it has a value other than "auto"), a `warned` key adds a
// warning, an `ignored` key nothing. Any other key, or a key given twice,
// throws UsageError with a did-you-mean over the keys valid at that level.
void for_each_key(const Value& map, const KeyTable& table,
                  const std::function<void(const std::string& key, const Value& value)>& visit,
                  const UnknownKeyHint& hint = nullptr);

// Fails at `value` unless it is a mapping (or null).
void expect_map(const Value& value, const std::string& fix);

}  // namespace tandem::config_detail
