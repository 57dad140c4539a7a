// The translation unit that builds tandem_torch_pch's precompiled header
// (cmake/TandemPrograms.cmake); it has no code of its own.
