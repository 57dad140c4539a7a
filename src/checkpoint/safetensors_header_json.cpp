#include "checkpoint/safetensors_header_json.h"

#include <limits>
#include <unordered_set>
#include <utility>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors_header.h"

namespace tandem::detail {
namespace {

using HeaderJson = nlohmann::json;

[[noreturn]] void reject(const std::string& message) { throw SafetensorsFormatError(message); }

// Printable and bounded: the text comes from the file.
std::string clean(const std::string& s, std::size_t limit = 200) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < limit; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  }
  if (s.size() > limit) out += "...";
  return out;
}

[[noreturn]] void json_error(const nlohmann::detail::exception& ex, const char* what) {
  reject(std::string(what) + " is not valid JSON (" + clean(ex.what(), 300) +
         "): the file is corrupt or not a safetensors file");
}

// Every callback either accepts the event or throws; none returns false.
class HeaderSax : public nlohmann::json_sax<HeaderJson> {
 public:
  RawHeader result;

  bool null() override { return unexpected("null"); }
  bool boolean(bool) override { return unexpected("a boolean"); }
  bool number_float(number_float_t, const string_t&) override { return unexpected("a non-integer number"); }
  bool binary(binary_t&) override { return unexpected("binary data"); }
  bool number_integer(number_integer_t v) override {
    if (v < 0 && (where_ == Where::kShape || where_ == Where::kOffsets)) {
      reject("tensor '" + clean(entry_.name) + "' has a negative " + field_name() + " value " +
             std::to_string(v) + ": the file is corrupt");
    }
    return integer(v);
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return unexpected("an integer over 2^63");
    }
    return integer(static_cast<int64_t>(v));
  }
  bool string(string_t& v) override {
    if (where_ == Where::kEntry && field_ == Field::kDtype) {
      entry_.dtype = std::move(v);
    } else if (where_ == Where::kMetadata) {
      result.metadata[key_] = std::move(v);
    } else {
      return unexpected("a string");
    }
    return true;
  }
  bool start_object(std::size_t) override {
    if (where_ == Where::kTop) {
      where_ = Where::kRoot;
    } else if (where_ == Where::kRoot && key_ == "__metadata__") {
      where_ = Where::kMetadata;
    } else if (where_ == Where::kRoot) {
      where_ = Where::kEntry;
      entry_ = RawHeaderEntry{};
      entry_.name = key_;
      fields_seen_ = 0;
    } else {
      return unexpected("an object");
    }
    return true;
  }
  bool key(string_t& k) override {
    if (where_ == Where::kRoot) {
      if (!root_keys_.insert(k).second) {
        reject("the header names '" + clean(k) + "' twice: the file is corrupt");
      }
    } else if (where_ == Where::kMetadata) {
      if (result.metadata.count(k)) {
        reject("__metadata__ has the key '" + clean(k) + "' twice: the file is corrupt");
      }
    } else {  // kEntry
      field_ = k == "dtype" ? Field::kDtype
               : k == "shape" ? Field::kShape
               : k == "data_offsets" ? Field::kOffsets
                                     : Field::kNone;
      if (field_ == Field::kNone) {
        reject("tensor '" + clean(entry_.name) + "' has an unknown field '" + clean(k) +
               "' (an entry holds exactly dtype, shape and data_offsets): the file is corrupt");
      }
      const unsigned bit = 1u << static_cast<int>(field_);
      if (fields_seen_ & bit) {
        reject("tensor '" + clean(entry_.name) + "' has the field '" + k + "' twice: the file is corrupt");
      }
      fields_seen_ |= bit;
    }
    key_ = std::move(k);
    return true;
  }
  bool end_object() override {
    if (where_ == Where::kEntry) {
      for (Field f : {Field::kDtype, Field::kShape, Field::kOffsets}) {
        if (!(fields_seen_ & (1u << static_cast<int>(f)))) {
          field_ = f;
          reject("tensor '" + clean(entry_.name) + "' has no " + field_name() +
                 " (an entry holds exactly dtype, shape and data_offsets): the file is corrupt");
        }
      }
      result.entries.push_back(std::move(entry_));
      entry_ = RawHeaderEntry{};
    }
    where_ = where_ == Where::kRoot ? Where::kDone : Where::kRoot;
    return true;
  }
  bool start_array(std::size_t) override {
    if (where_ != Where::kEntry || field_ == Field::kDtype) return unexpected("an array");
    where_ = field_ == Field::kShape ? Where::kShape : Where::kOffsets;
    offsets_count_ = 0;
    return true;
  }
  bool end_array() override {
    if (where_ == Where::kOffsets && offsets_count_ != 2) {
      reject("tensor '" + clean(entry_.name) + "' has " + std::to_string(offsets_count_) +
             " data_offsets; it needs two, [begin, end]: the file is corrupt");
    }
    where_ = Where::kEntry;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) override {
    json_error(ex, "the header");
  }

 private:
  enum class Where { kTop, kRoot, kEntry, kMetadata, kShape, kOffsets, kDone };
  enum class Field { kDtype, kShape, kOffsets, kNone };

  bool integer(int64_t v) {
    if (where_ == Where::kShape) {
      if (entry_.shape.size() == kSafetensorsMaxDims) {
        reject("tensor '" + clean(entry_.name) + "' has more than " +
               std::to_string(kSafetensorsMaxDims) + " dimensions: the file is corrupt");
      }
      entry_.shape.push_back(v);
    } else if (where_ == Where::kOffsets) {
      if (offsets_count_ == 2) {
        reject("tensor '" + clean(entry_.name) +
               "' has more than two data_offsets; it needs [begin, end]: the file is corrupt");
      }
      (offsets_count_++ == 0 ? entry_.data_begin : entry_.data_end) = v;
    } else {
      return unexpected("an integer");
    }
    return true;
  }

  std::string field_name() const {
    switch (field_) {
      case Field::kDtype: return "'dtype'";
      case Field::kShape: return "'shape'";
      case Field::kOffsets: return "'data_offsets'";
      default: return "field";
    }
  }

  // A value of the wrong kind where it stands: say what the format wants there.
  [[noreturn]] bool unexpected(const char* found) {
    std::string want;
    switch (where_) {
      case Where::kTop: want = "the header must be a JSON object"; break;
      case Where::kRoot:
        want = key_ == "__metadata__"
                   ? std::string("__metadata__ must be an object of strings")
                   : "the entry of tensor '" + clean(key_) +
                         "' must be an object {dtype, shape, data_offsets}";
        break;
      case Where::kMetadata:
        want = "__metadata__ value '" + clean(key_) + "' must be a string";
        break;
      case Where::kEntry:
      case Where::kShape:
      case Where::kOffsets:
        want = "tensor '" + clean(entry_.name) + "': " +
               (field_ == Field::kDtype   ? "'dtype' must be a string"
                : field_ == Field::kShape ? "'shape' must be an array of non-negative integers"
                                          : "'data_offsets' must be [begin, end], two non-negative integers");
        break;
      case Where::kDone: want = "nothing may follow the header object"; break;
    }
    reject(want + ", found " + found + ": the file is corrupt");
  }

  Where where_ = Where::kTop;
  Field field_ = Field::kNone;
  std::string key_;
  RawHeaderEntry entry_;
  unsigned fields_seen_ = 0;
  int offsets_count_ = 0;
  std::unordered_set<std::string> root_keys_;
};

// A flat object of strings, duplicates rejected.
class StringMapSax : public nlohmann::json_sax<HeaderJson> {
 public:
  explicit StringMapSax(const char* what) : what_(what) {}
  std::map<std::string, std::string> result;

  bool null() override { return unexpected(); }
  bool boolean(bool) override { return unexpected(); }
  bool number_integer(number_integer_t) override { return unexpected(); }
  bool number_unsigned(number_unsigned_t) override { return unexpected(); }
  bool number_float(number_float_t, const string_t&) override { return unexpected(); }
  bool binary(binary_t&) override { return unexpected(); }
  bool start_array(std::size_t) override { return unexpected(); }
  bool end_array() override { return unexpected(); }
  bool string(string_t& v) override {
    if (depth_ != 1) return unexpected();
    result[key_] = std::move(v);
    return true;
  }
  bool start_object(std::size_t) override {
    if (depth_++ != 0) return unexpected();
    return true;
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool key(string_t& k) override {
    if (result.count(k)) reject(std::string(what_) + " has the key '" + clean(k) + "' twice: the header is corrupt");
    key_ = std::move(k);
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) override {
    json_error(ex, what_);
  }

 private:
  [[noreturn]] bool unexpected() {
    reject(std::string(what_) + " must be a JSON object of strings: the header is corrupt");
  }

  const char* what_;
  int depth_ = 0;
  std::string key_;
};

}  // namespace

RawHeader parse_header_json(std::string_view json) {
  HeaderSax sax;
  HeaderJson::sax_parse(json.begin(), json.end(), &sax, HeaderJson::input_format_t::json, /*strict=*/true,
                  /*ignore_comments=*/false);
  return std::move(sax.result);
}

std::map<std::string, std::string> parse_string_map(std::string_view json, const char* what) {
  if (json.find('\0') != std::string_view::npos) {  // the lexer would stop there
    reject(std::string(what) + " holds a NUL byte: the header is corrupt");
  }
  StringMapSax sax(what);
  HeaderJson::sax_parse(json.begin(), json.end(), &sax, HeaderJson::input_format_t::json, /*strict=*/true,
                  /*ignore_comments=*/false);
  return std::move(sax.result);
}

}  // namespace tandem::detail
