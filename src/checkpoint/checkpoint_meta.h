#pragma once
// meta.json: serialised with a CRC-32C of its own canonical text, so that a
// bit flip in the metadata is reported instead of trusted.

#include <string>

#include <nlohmann/json.hpp>

namespace tandem::detail {

// The text written to meta.json: `meta` plus a "checksum" member.
std::string seal_meta(nlohmann::json meta);
// Parses and verifies meta.json's text; CheckpointError naming `path`.
nlohmann::json open_meta(const std::string& text, const std::string& path);
// Name of the temporary directory of a save of `tag`.
std::string temporary_tag_dir(const std::string& dir, const std::string& tag);
// Checks that `tag` is a single, plain path component.
void check_tag(const std::string& tag);

}  // namespace tandem::detail
