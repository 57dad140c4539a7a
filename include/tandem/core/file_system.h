#pragma once
// File-system operations on POSIX calls, for tandem's library, CLI, tests and
// benchmarks, in place of std::filesystem's operations.
//
// Why not std::filesystem: LibTorch 2.11's CUDA libtorch.so (pip's
// torch==2.11.0+cu130) exports its own copy of the std::filesystem operations
// (remove_all, create_directories, status, ...; 64 symbols, unversioned). A
// program that links it and calls one of them binds to LibTorch's copy ahead
// of libstdc++'s, and remove_all() crashed with SIGSEGV there
// (docs/architecture.md, "LibTorch versions"). std::filesystem::path and its
// member functions are not among those symbols and stay safe to use;
// Build.NoStdFilesystemOperations checks that no tandem binary references
// the operations.
//
// Paths are plain strings, relative ones against the working directory.
// Thread-safety: every function is safe to call from any thread; two calls on
// the same path race as the underlying system calls do.

#include <cstddef>
#include <string>
#include <system_error>
#include <vector>

namespace tandem::fs {

// Whether `path` names an existing file, directory or other object (symbolic
// links followed). Never throws; an unreadable parent counts as missing.
bool exists(const std::string& path) noexcept;
bool is_directory(const std::string& path) noexcept;
bool is_regular_file(const std::string& path) noexcept;
// A directory with no entries besides "." and "..".
bool is_empty_directory(const std::string& path) noexcept;

// The names (not paths) of `dir`'s entries, without "." and "..", sorted.
// Throws tandem::Error naming `dir` and the OS reason; the error_code form
// sets `ec` and returns {} instead.
std::vector<std::string> list_directory(const std::string& dir);
std::vector<std::string> list_directory(const std::string& dir, std::error_code& ec) noexcept;

// Creates `dir` and any missing parents (mode 0777 less the umask). An
// existing directory is not an error; an existing file of that name is.
void create_directories(const std::string& dir);
void create_directories(const std::string& dir, std::error_code& ec) noexcept;

// Removes `path` and, if it is a directory, everything under it. Symbolic
// links are removed, never followed. A missing `path` is not an error.
void remove_all(const std::string& path);
void remove_all(const std::string& path, std::error_code& ec) noexcept;

// Removes one file or empty directory; a missing `path` is not an error.
void remove(const std::string& path);

// rename(2): `to` is replaced atomically if it is a file or an empty
// directory.
void rename(const std::string& from, const std::string& to);
void rename(const std::string& from, const std::string& to, std::error_code& ec) noexcept;

// write(2) until all `size` bytes of `data` are written to `fd`, retrying
// EINTR and short writes. Returns 0, or the errno that stopped it (EIO for a
// write that wrote nothing). Allocates nothing: safe in a terminate handler.
int write_all(int fd, const void* data, std::size_t size) noexcept;

// `path` made absolute against the working directory, lexically normalised
// (symbolic links are not resolved), as std::filesystem::absolute does.
std::string absolute(const std::string& path);

// The working directory, and changing it (for the whole process).
std::string current_directory();
void change_directory(const std::string& dir);

}  // namespace tandem::fs
