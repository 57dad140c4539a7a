#pragma once
// File-system steps of the checkpoint commit: durable writes, fsync of
// directories, atomic renames. Every failure throws CheckpointError naming
// the path and the OS reason.

#include <string>

namespace tandem::detail {

// Writes `text` to `path` (created or truncated) and fsyncs it.
void write_file_synced(const std::string& path, const std::string& text);
// The whole file as a string.
std::string read_small_file(const std::string& path);
// fsync() of a directory, so that renames and new entries in it survive a
// power loss.
void fsync_directory(const std::string& dir);
// Creates `dir` and its parents if missing.
void make_directories(const std::string& dir);
// rename(2): `to` is replaced atomically if it is a file or an empty
// directory.
void rename_path(const std::string& from, const std::string& to);
// Atomically swaps two existing directories (renameat2 RENAME_EXCHANGE).
// Returns false when the file system cannot (the caller falls back).
bool exchange_paths(const std::string& a, const std::string& b);
// Removes a file or a directory tree; missing is not an error. Never throws.
void remove_tree_quietly(const std::string& path) noexcept;
bool path_exists(const std::string& path);

}  // namespace tandem::detail
