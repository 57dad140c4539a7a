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
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "tandem/config/config.h"

namespace tandem::config_detail {

// True when the first significant character, after comments, is '{' or
// '[': the text is JSON (DeepSpeed, or an Accelerate config saved as JSON).
bool looks_like_json(const std::string& text);

// Parses `text` into nodes. JSON is read as DeepSpeed reads it, with
// hjson's comments and commas (hjson_as_json()), checked by nlohmann first
// for exact syntax errors, then read by yaml-cpp for positions. Throws UsageError
// "NAME:LINE:COL: malformed JSON|YAML: ...; fix" on bad syntax (truncated
// text included) and "NAME:1:1: the file is empty; ..." when there is
// nothing but whitespace or comments.
YAML::Node parse_document(const std::string& text, const std::string& name, bool json);

// "NAME:LINE:COL" (1-based; NAME alone without a line), and a key's dotted
// path under `parent` (the top level's children are bare names).
std::string mark_text(const std::string& name, const YAML::Mark& mark);
std::string join_path(const std::string& parent, const std::string& key);

// Where reads go: the name used in messages and the Config that collects
// warnings, auto keys and key locations.
struct ReadContext {
  std::string name;
  Config* config = nullptr;
  // Every implemented key for_each_key() handed to a reader, and every path
  // whose value a reader looked at (through any Value of that path);
  // check_keys_read() warns about the keys no reader looked at (a key
  // accepted and then ignored is a reader bug).
  mutable std::vector<std::string> implemented_keys{};
  mutable std::set<std::string> read_paths{};
};

// Adds a warning for each key of ctx.read_keys whose value no reader looked
// at. Call once the document is read.
void check_keys_read(const ReadContext& ctx);

// One node being read, with its key path ("zero_optimization.stage").
class Value {
 public:
  // `key_mark` locates messages about a null value, whose own mark is not
  // useful (yaml-cpp puts it at the next token).
  Value(const ReadContext& ctx, YAML::Node node, YAML::Mark key_mark, std::string path);

  // The whole document (path "(top level)").
  static Value root(const ReadContext& ctx, YAML::Node node);

  const std::string& path() const { return path_; }
  // The node itself; counts as reading the value (check_keys_read()).
  const YAML::Node& node() const {
    mark_read();
    return node_;
  }
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

  // Records path() in Config::auto_keys.
  void note_auto() const;

  // Records that a reader looked at this value: every typed read, node(),
  // child(), elements(), is_null() and is_auto() do.
  void mark_read() const { ctx_->read_paths.insert(path_); }

 private:
  const ReadContext* ctx_;
  YAML::Node node_;
  YAML::Mark key_mark_;
  std::string path_;
};

// What tandem does with a key it recognises (docs/config.md's key index;
// `tandem config keys --json`).
enum class KeyDisposition { kImplemented, kWarn, kRefuse };
const char* to_string(KeyDisposition disposition);  // "implemented", "warn", "refuse"

// A recognised key tandem does not implement. `note` says what tandem does
// instead (warned: "WHERE: 'PATH' NOTE", so the note starts with a verb) or
// why not and the fix (refused: "WHERE: PATH: NOTE"). `quiet` lists values that need no word because they ask for
// nothing tandem lacks: the other tool's default, which it writes into every
// file (Accelerate's `debug: false`). Scalars compare in any case; "{}",
// "[]" and "null" match an empty mapping, an empty list and no value. A key
// ending in '*' is a prefix (Accelerate's "tpu_*").
struct KeyNote {
  std::string key;
  std::string note;
  std::vector<std::string> quiet = {};
  // Checks a warned key's value as an implemented one would be (a bad value
  // is still an error); none: any value.
  std::function<void(const Value&)> check = nullptr;
};

// KeyNote checks: true/false; a whole number >= min (or "auto" where DeepSpeed
// allows it).
void check_bool(const Value& value);
std::function<void(const Value&)> check_whole(int64_t min, bool auto_allowed = false);

// The keys valid at one level of a mapping, each with its disposition.
struct KeyTable {
  std::vector<std::string> read;  // implemented: handed to the visitor, which must read them
  std::vector<KeyNote> warned;    // one warning each, with the note
  std::vector<KeyNote> refused;   // an error, with the note
};

// "{key}: {note}" lines for the same note on several keys.
std::vector<KeyNote> notes_for(const std::vector<std::string>& keys, const std::string& note,
                               const std::vector<std::string>& quiet = {},
                               const std::function<void(const Value&)>& check = nullptr);

// Hint added to the message for an unknown key, given the key; "" for none.
using UnknownKeyHint = std::function<std::string(const std::string& key)>;

// Checks that `map` is a mapping (or null, which has no keys) and visits its
// entries in file order: a `read` key goes to `visit` (after its location is
// recorded when it has a value other than "auto"), a `warned` key adds a
// warning and a `refused` key throws UsageError, each with its note, unless
// its value is a quiet one. Any other key, or a key given twice, throws
// UsageError with a did-you-mean over the keys valid at that level.
void for_each_key(const Value& map, const KeyTable& table,
                  const std::function<void(const std::string& key, const Value& value)>& visit,
                  const UnknownKeyHint& hint = nullptr);

// Fails at `value` unless it is a mapping (or null).
void expect_map(const Value& value, const std::string& fix);

}  // namespace tandem::config_detail
